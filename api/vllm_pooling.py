"""vLLM's `POST /pooling` for an embedding model: each input's pooled vector, in vLLM's answer
(`data[i].data`). The inputs and options are `/v1/embeddings`' (vLLM's fields)."""

import time
import uuid
from typing import Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers, truncation
from api.embeddings import KeepLast, Text, TokenId
from api.schemas import Usage, documented, usage_of
from api.scoring import json_response, timing_headers
from api.service import Service


class PoolingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's pooling body for completions-style input."""

    input: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    model: str | None = None  # echoed
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    truncate_prompt_tokens: KeepLast | None = None  # keep the last k tokens
    normalize: bool | None = None  # None: as the model's directory says
    task: Literal["embed"] | None = None  # the only pooling task an embedder answers
    user: str | None = None  # accepted


class Pooled(msgspec.Struct, kw_only=True):
    index: int
    data: list[float] | str  # floats, or base64 of little-endian f32
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
    result = await embed_answers.embed(
        service,
        request,
        embed_answers.inputs(req.input, "input"),
        {"max_tokens": "truncate_prompt_tokens"},
        dimensions=req.dimensions,
        normalize=req.normalize,
        **truncation.vllm_embed(False, req.truncate_prompt_tokens),
    )
    encode = embed_answers.as_base64 if req.encoding_format == "base64" else embed_answers.as_lists
    body = PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=req.model or service.model_name,
        data=[Pooled(index=i, data=v) for i, v in enumerate(encode(result.embeddings))],
        usage=usage_of(Usage, result),
    )
    return json_response(body, headers=timing_headers(result.timings))
