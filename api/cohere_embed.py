"""Cohere's `POST /v2/embed`: texts to vectors in each of the number formats asked for
(`embedding_types`), in Cohere's answer (`embeddings` by type, `meta.billed_units` and
`meta.tokens`).

`input_type` picks the model's prompt of that kind (`search_query`: its "query" prompt,
`search_document`: its "document" one, `classification` and `clustering` by name) where it has
one; any other value is vLLM's 400 "Unsupported input_type", listing these four. As Cohere, a
text over the model's limit is cut at its end unless `truncate` says "START" or "NONE" (an
error); `max_tokens` lowers the limit; `output_dimension` keeps the first components of a
Matryoshka-trained model's vectors.
"""

import uuid
from typing import Annotated, Literal, get_args

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers
from api.errors import ApiError
from api.rerank_answers import ApiVersion, MetaTokens
from api.schemas import documented
from api.scoring import json_response, timing_headers
from api.service import Service

InputType = Literal["search_document", "search_query", "classification", "clustering"]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
PROMPT_OF = {"search_query": "query", "search_document": "document"}  # others by their name
SIDE_OF = {"END": "right", "START": "left"}


class CohereEmbedRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Cohere's v2 embed body, for texts (`images` and `inputs` are unknown fields here)."""

    texts: Annotated[list[Annotated[str, documented(minLength=1)]], documented(minItems=1)]
    # one of InputType (checked in `embed`, naming what is served); Cohere requires it, None
    # here: no prompt
    input_type: Annotated[str, documented(enum=sorted(get_args(InputType)))] | None = None
    model: str | None = None  # which model answers, where several are served
    embedding_types: list[EmbeddingType] | None = None  # None: ["float"]
    output_dimension: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None  # tokens kept of each text
    truncate: Literal["NONE", "START", "END"] = "END"
    priority: int | None = None  # accepted


class EmbeddingsByType(msgspec.Struct, kw_only=True, omit_defaults=True):
    # `float` on the wire: the name would shadow the type in the fields after it
    float_: list[list[float]] | None = msgspec.field(default=None, name="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None  # little-endian f32 bytes


class EmbedBilledUnits(msgspec.Struct, kw_only=True):
    input_tokens: int
    image_tokens: int = 0  # as Cohere and vLLM count them; no image is served


class EmbedMeta(msgspec.Struct, kw_only=True):
    api_version: ApiVersion
    billed_units: EmbedBilledUnits
    tokens: MetaTokens  # as vLLM's Cohere route answers (and Cohere's SDK reads) it


class CohereEmbedResponse(msgspec.Struct, kw_only=True):
    id: str
    embeddings: EmbeddingsByType
    texts: list[str]
    meta: EmbedMeta
    response_type: str = "embeddings_by_type"


decoder = msgspec.json.Decoder(CohereEmbedRequest)


async def embed(service: Service, request: Request) -> Response:
    """Cohere's `/v2/embed`."""
    req = await service.decode(request, decoder)
    if req.input_type is not None and req.input_type not in get_args(InputType):
        served = ", ".join(get_args(InputType))
        why = f"input_type: Unsupported input_type {req.input_type!r}. Supported values: {served}"
        raise ApiError(400, why, param="input_type")
    truncate = req.truncate != "NONE"
    result = await embed_answers.embed(
        service,
        request,
        embed_answers.inputs(req.texts, "texts"),
        {"input": "texts", "dimensions": "output_dimension"},
        input_type=PROMPT_OF.get(req.input_type, req.input_type),
        model=req.model,
        dimensions=req.output_dimension,
        max_tokens=req.max_tokens,
        truncate=truncate,
        truncation_side=SIDE_OF.get(req.truncate, "right"),
    )
    kinds = dict.fromkeys(req.embedding_types or ["float"])
    by_type = {
        ("float_" if kind == "float" else kind): embed_answers.as_base64(result.embeddings)
        if kind == "base64"
        else embed_answers.formatted(result.embeddings, kind).tolist()
        for kind in kinds
    }
    body = CohereEmbedResponse(
        id=str(uuid.uuid4()),
        embeddings=EmbeddingsByType(**by_type),
        texts=req.texts,
        meta=EmbedMeta(
            api_version=ApiVersion(version="2"),
            billed_units=EmbedBilledUnits(input_tokens=result.prompt_tokens),
            tokens=MetaTokens(input_tokens=result.prompt_tokens),
        ),
    )
    return json_response(body, headers=timing_headers(result.timings))
