"""OpenAI's embeddings API, `POST /v1/embeddings`: one vector per input text, as floats or as
base64 of little-endian float32 (what OpenAI's Python SDK asks for by default).

As OpenAI, an empty string is refused and a text over the model's limit is an error, never cut
silently; `truncate: true` (an extension, as vLLM's `truncate_prompt_tokens`) cuts it instead and
reports the tokens cut in `usage.prompt_tokens_details.truncated_tokens`. `dimensions` is taken
only at the model's own width (none of the served embedders is trained for shorter ones).
"""

import base64
from typing import Annotated, Literal

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError
from api.schemas import Usage, documented, usage_of
from api.scoring import json_response, timing_headers
from api.service import Service

Text = Annotated[str, documented(minLength=1)]


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's embeddings body."""

    input: Text | Annotated[list[Text], documented(minItems=1)]  # one text or several
    model: str | None = None  # echoed
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None  # only the model's own width
    user: str | None = None  # accepted
    truncate: bool = False  # cut a text over the model's limit instead of refusing it


class Embedding(msgspec.Struct, kw_only=True):
    index: int  # the input's position
    embedding: list[float] | str  # floats, or base64 of little-endian float32
    object: str = "embedding"


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    data: list[Embedding]  # in input order
    model: str
    usage: Usage
    object: str = "list"


decoder = msgspec.json.Decoder(EmbeddingRequest)


async def embeddings(service: Service, request: Request) -> Response:
    """OpenAI's `/v1/embeddings`."""
    req = await service.decode(request, decoder)
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts:
        raise ApiError(400, "input: must not be an empty list", param="input")
    empty = next((i for i, t in enumerate(texts) if not t), None)
    if empty is not None:
        field = "input" if isinstance(req.input, str) else f"input[{empty}]"
        raise ApiError(400, f"{field}: must not be an empty string", param=field)
    result = await service.call(request, lambda engine: _embed(engine, texts, req))
    service.metrics.observe(request.url.path, result.timings, len(texts))
    encode = _base64 if req.encoding_format == "base64" else lambda v: v.tolist()
    data = [Embedding(index=i, embedding=encode(v)) for i, v in enumerate(result.embeddings)]
    body = EmbeddingResponse(
        data=data, model=req.model or service.model_name, usage=usage_of(Usage, result)
    )
    return json_response(body, headers=timing_headers(result.timings))


async def _embed(engine, texts: list[str], req: EmbeddingRequest):
    width = engine.task.dimensions if engine.task.embeddings_refused() is None else None
    if req.dimensions is not None and width is not None and req.dimensions != width:
        raise ApiError(
            400,
            f"dimensions: this model answers {width} dimensions and is not trained for fewer",
            param="dimensions",
        )
    return await engine.embed(texts, truncate=req.truncate)


def _base64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
