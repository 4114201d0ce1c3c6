"""vLLM's `POST /pooling` for an embedding model: each input's pooled vector, in vLLM's answer
(`data[i].data`), or with `task: "token_embed"` its token vectors as lists: a multi-vector
model's multi-vectors (BGE-M3's or a ColBERT model's, as vLLM's `token_embed` answers them),
else each token's final state. `embedding_mode` ("query" or "document", the name vLLM's
late-interaction proposal gives it; by default "document") says how a ColBERT model encodes
the inputs. The inputs and options are `/v1/embeddings`' (vLLM's fields)."""

import time
import uuid
from typing import Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers, truncation, vllm_encoding
from api.embeddings import KeepLast, Text, TokenId
from api.errors import ApiError
from api.schemas import Usage, documented, usage_of
from api.scoring import json_response, timing_headers
from api.service import Service
from api.vllm_encoding import EmbedDType, Endianness
from engine.capabilities import Ability

TASKS = ("embed", "token_embed")


class PoolingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's pooling body for completions-style input."""

    input: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    model: str | None = None  # echoed
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    truncate_prompt_tokens: KeepLast | None = None  # keep the last k tokens
    truncation_side: Literal["left", "right"] | None = None  # None: keep the last k
    use_activation: bool | None = None  # normalise (None: as the model's directory says)
    normalize: bool | None = None  # older vLLM's `use_activation`
    embed_dtype: EmbedDType = "float32"  # the type of base64's components
    endianness: Endianness = "native"  # their byte order
    # "embed" (the default) or "token_embed"; another is vLLM's "Unsupported task" 400
    task: Annotated[str, documented(enum=list(TASKS))] | None = None
    # token_embed: a ColBERT model's query or document encoding (None: a document's)
    embedding_mode: Literal["query", "document"] | None = None
    user: str | None = None  # accepted


class Pooled(msgspec.Struct, kw_only=True):
    index: int
    # floats (lists of them per token: token_embed), or base64 of them (`embed_dtype`)
    data: list[float | list[float]] | str
    object: str = "pooling"


class PoolingResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    data: list[Pooled]
    usage: Usage
    object: str = "list"


decoder = msgspec.json.Decoder(PoolingRequest)


async def pooling(service: Service, request: Request) -> Response:
    """vLLM's `/pooling`."""
    req = await service.decode(request, decoder)
    options = {}
    if req.task is not None and req.task not in TASKS:
        supported = ", ".join(map(repr, TASKS))
        why = f"Unsupported task: {req.task!r}. Supported tasks: {supported}"
        raise ApiError(400, why, param="task")
    if req.embedding_mode is not None and req.task != "token_embed":
        why = "applies to task token_embed (multi-vectors)"
        raise ApiError(400, f"embedding_mode: {why}", param="embedding_mode")
    name = service.route(request, req.model)
    if req.task == "token_embed":
        multi = service.engine(name).capabilities.offers(Ability.EMBED_MULTI)
        options["verb"] = "embed_multi" if multi else "embed_tokens"
        options["input_type"] = req.embedding_mode
    else:
        normalize = vllm_encoding.activation(req.use_activation, req.normalize)
        options = {"dimensions": req.dimensions, "normalize": normalize}
    result = await embed_answers.embed(
        service,
        request,
        embed_answers.inputs(req.input, "input"),
        {"max_tokens": "truncate_prompt_tokens"},
        model=name,
        **options,
        **truncation.vllm_embed(False, req.truncate_prompt_tokens, req.truncation_side),
    )
    encode = embed_answers.as_lists
    if req.encoding_format == "base64":
        encode = vllm_encoding.encoder(req.embed_dtype, req.endianness, "float")
    elif req.task == "token_embed":
        encode = _token_lists
    body = PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=req.model or name,
        data=[Pooled(index=i, data=v) for i, v in enumerate(encode(result.embeddings))],
        usage=usage_of(Usage, result),
    )
    return json_response(body, headers=timing_headers(result.timings))


def _token_lists(vectors) -> list:
    """Each input's token vectors f32[n, D] as lists of lists."""
    return [v.tolist() for v in vectors]
