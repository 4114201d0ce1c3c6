"""`POST /v1/embeddings`: one vector per input, in the fields of OpenAI's embeddings API, of
Voyage's (`input_type`, `output_dimension`, `output_dtype`, `truncation`), and of vLLM's
(`truncate_prompt_tokens`, `normalize`). One body may mix them; the answer is OpenAI's list,
which the Voyage SDK reads too.

As OpenAI, an input is a string, strings, token ids or lists of token ids; an empty string is
refused and a text over the model's limit is an error, never cut silently. `truncation: true`
(Voyage's), `truncate: true` (an extension) or `truncate_prompt_tokens` (vLLM's: keep the last k
tokens) cut it instead, and the tokens cut are reported in
`usage.prompt_tokens_details.truncated_tokens`. `dimensions` / `output_dimension` keep the first
components of a Matryoshka-trained model's vectors (its own width on any model).
"""

import time
import uuid
from typing import Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers, truncation, vllm_encoding
from api.errors import ApiError
from api.schemas import Usage, documented, usage_of
from api.scoring import json_response, timing_headers
from api.service import Service
from api.vllm_encoding import EmbedDType, Endianness

Text = Annotated[str, documented(minLength=1)]
TokenId = Annotated[int, msgspec.Meta(ge=0)]
Width = Annotated[int, msgspec.Meta(ge=1)]
# vLLM's `truncate_prompt_tokens`: keep the last k tokens (-1: the model's limit)
KeepLast = Annotated[int, msgspec.Meta(ge=-1), documented(**{"not": {"const": 0}})]


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's embeddings body, with Voyage's and vLLM's fields beside."""

    # one text, texts, one token-id list, or token-id lists
    input: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    model: str | None = None  # echoed
    encoding_format: Literal["float", "base64"] | None = None  # None: float
    dimensions: Width | None = None  # OpenAI's: the vectors' first components
    user: str | None = None  # accepted
    input_type: Literal["query", "document"] | None = None  # Voyage's: the model's prompt of it
    output_dimension: Width | None = None  # Voyage's `dimensions`
    output_dtype: Literal[embed_answers.FORMATS] | None = None  # Voyage's: None is float
    truncation: bool | None = None  # Voyage's: cut a text over the limit (None: refuse it)
    truncate: bool = False  # the same, as an extension of OpenAI's body
    truncate_prompt_tokens: KeepLast | None = None  # vLLM's
    truncation_side: Literal["left", "right"] | None = None  # vLLM's: None keeps the last k
    use_activation: bool | None = None  # vLLM's: normalise (None: as the model's directory says)
    normalize: bool | None = None  # older vLLM's `use_activation`
    embed_dtype: EmbedDType = "float32"  # vLLM's: the type of base64's components
    endianness: Endianness = "native"  # vLLM's: their byte order


class Embedding(msgspec.Struct, kw_only=True):
    index: int  # the input's position
    # floats, integers (Voyage's integer types), or base64 of the format's bytes
    embedding: list[float | int] | str
    object: str = "embedding"


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    data: list[Embedding]  # in input order
    model: str
    usage: Usage
    id: str  # vLLM's: `embd-` and the request's id
    created: int  # vLLM's: when it was answered, in seconds
    object: str = "list"


decoder = msgspec.json.Decoder(EmbeddingRequest)


async def embeddings(service: Service, request: Request) -> Response:
    """OpenAI's (and Voyage's, and vLLM's) `/v1/embeddings`."""
    req = await service.decode(request, decoder)
    inputs = embed_answers.inputs(req.input, "input")
    name = service.route(request, req.model)
    result = await embed_answers.embed(
        service,
        request,
        inputs,
        _renames(req),
        input_type=req.input_type,
        model=name,
        dimensions=_dimensions(req),
        normalize=vllm_encoding.activation(req.use_activation, req.normalize),
        **truncation.vllm_embed(
            bool(req.truncation or req.truncate), req.truncate_prompt_tokens, req.truncation_side
        ),
    )
    output = req.output_dtype or "float"
    vectors = embed_answers.formatted(result.embeddings, output)
    encode = embed_answers.as_lists
    if req.encoding_format == "base64":
        encode = vllm_encoding.encoder(req.embed_dtype, req.endianness, output)
    data = [Embedding(index=i, embedding=v) for i, v in enumerate(encode(vectors))]
    body = EmbeddingResponse(
        data=data,
        model=req.model or name,
        usage=usage_of(Usage, result),
        id=f"embd-{uuid.uuid4().hex}",
        created=int(time.time()),
    )
    return json_response(body, headers=timing_headers(result.timings))


def _renames(req: EmbeddingRequest) -> dict[str, str]:
    """The request's names for the engine's fields it set."""
    renames = {"max_tokens": "truncate_prompt_tokens"}
    if req.dimensions is None and req.output_dimension is not None:
        renames["dimensions"] = "output_dimension"
    return renames


def _dimensions(req: EmbeddingRequest) -> int | None:
    both = req.dimensions is not None and req.output_dimension is not None
    if both and req.dimensions != req.output_dimension:
        raise ApiError(
            400, "output_dimension: differs from dimensions (give one)", param="output_dimension"
        )
    return req.dimensions or req.output_dimension
