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

from api import embed_answers, truncation
from api.embeddings import KeepLast, Text, TokenId
from api.errors import ApiError
from api.schemas import Usage, documented, usage_of
from api.scoring import json_response, timing_headers
from api.service import Service
from engine.capabilities import Ability


class PoolingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's pooling body for completions-style input."""

    input: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    model: str | None = None  # echoed
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    truncate_prompt_tokens: KeepLast | None = None  # keep the last k tokens
    normalize: bool | None = None  # None: as the model's directory says
    task: Literal["embed", "token_embed"] | None = None  # None: "embed"
    # token_embed: a ColBERT model's query or document encoding (None: a document's)
    embedding_mode: Literal["query", "document"] | None = None
    user: str | None = None  # accepted


class Pooled(msgspec.Struct, kw_only=True):
    index: int
    # floats (lists of them per token: token_embed), or base64 of little-endian f32
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
    if req.embedding_mode is not None and req.task != "token_embed":
        why = "applies to task token_embed (multi-vectors)"
        raise ApiError(400, f"embedding_mode: {why}", param="embedding_mode")
    if req.task == "token_embed":
        multi = service.engine().capabilities.offers(Ability.EMBED_MULTI)
        options["verb"] = "embed_multi" if multi else "embed_tokens"
        options["input_type"] = req.embedding_mode
    else:
        options = {"dimensions": req.dimensions, "normalize": req.normalize}
    result = await embed_answers.embed(
        service,
        request,
        embed_answers.inputs(req.input, "input"),
        {"max_tokens": "truncate_prompt_tokens"},
        **options,
        **truncation.vllm_embed(False, req.truncate_prompt_tokens),
    )
    encode = embed_answers.as_base64 if req.encoding_format == "base64" else embed_answers.as_lists
    if req.task == "token_embed":
        encode = _token_vectors(req.encoding_format)
    body = PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=req.model or service.model_name,
        data=[Pooled(index=i, data=v) for i, v in enumerate(encode(result.embeddings))],
        usage=usage_of(Usage, result),
    )
    return json_response(body, headers=timing_headers(result.timings))


def _token_vectors(encoding_format: str):
    """Each input's token vectors f32[n, D] as lists of lists, or base64 of their f32 bytes."""
    if encoding_format == "base64":
        return lambda vectors: [embed_answers.as_base64(v.reshape(1, -1))[0] for v in vectors]
    return lambda vectors: [v.tolist() for v in vectors]
