"""TEI's embedding routes: `/embed` (one vector per input, TEI's bare list of lists),
`/embed_all` (every token's vector of each input, before pooling), `/embed_sparse` (a SPLADE
model's sparse vector of each input, its non-zero `{index, value}` entries by index) and
`/similarity` (the cosine similarity of a source sentence to each of several). Errors are
TEI's `{"error", "error_type"}` bodies with its statuses, as on TEI's other routes."""

from typing import Annotated, Literal

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers, tei
from api.embeddings import Text, TokenId
from api.errors import ApiError, TeiError
from api.schemas import documented
from api.scoring import json_response, timing_headers
from api.service import Service
from engine.tasks.pooler import unit

Direction = Literal["right", "left", "Right", "Left"]


class TeiEmbedRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TEI's `/embed` body."""

    # one text, texts, one token-id list, or token-id lists
    inputs: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    truncate: bool | None = None  # cut a text over the limit (None: the server's tei_auto_truncate)
    truncation_direction: Direction = "right"  # the end cut
    prompt_name: str | None = None  # a prompt of the model's sentence-transformers directory
    normalize: bool = True  # unit vectors (TEI's default, whatever the model's directory says)
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None  # Matryoshka width


class TeiEmbedAllRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TEI's `/embed_all` body: `/embed`'s, less what only a pooled vector has."""

    inputs: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class TeiEmbedSparseRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TEI's `/embed_sparse` body, and `max_active_dims` (sentence-transformers' option: each
    vector's that many largest entries; absent: all)."""

    inputs: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None
    max_active_dims: Annotated[int, msgspec.Meta(ge=1)] | None = None


class SparseValue(msgspec.Struct, kw_only=True):
    index: int  # a vocabulary id
    value: float  # its weight, > 0


class SimilarityInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    source_sentence: Text
    sentences: Annotated[list[Text], documented(minItems=1)]  # each compared to source_sentence


class SimilarityParameters(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class SimilarityRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """TEI's (and the Hugging Face sentence-similarity task's) `/similarity` body."""

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


TEI_VECTORS = list[list[float]]
TEI_TOKEN_VECTORS = list[list[list[float]]]  # per input, per token
TEI_SPARSE_VECTORS = list[list[SparseValue]]  # per input, its non-zero entries by index
SIMILARITIES = list[float]
embed_decoder = msgspec.json.Decoder(TeiEmbedRequest)
embed_all_decoder = msgspec.json.Decoder(TeiEmbedAllRequest)
similarity_decoder = msgspec.json.Decoder(SimilarityRequest)
embed_sparse_decoder = msgspec.json.Decoder(TeiEmbedSparseRequest)


async def embed(service: Service, request: Request) -> Response:
    """TEI's `/embed`. As TEI, `dimensions` keeps that many components of any model's vectors
    (then normalised, if asked), Matryoshka-trained or not."""
    try:
        req = await service.decode(request, embed_decoder)
        name = service.route(request)
        cut = _dimensions(service.engine(name), req.dimensions)
        result = await embed_answers.embed(
            service,
            request,
            embed_answers.inputs(req.inputs, "inputs"),
            {"input": "inputs"},
            truncate=tei.truncates(service, req.truncate),
            truncation_side=req.truncation_direction.lower(),
            model=name,
            prompt_name=req.prompt_name,
            normalize=req.normalize and cut is None,
        )
    except ApiError as e:
        raise TeiError(e) from None
    vectors = result.embeddings
    if cut is not None:
        vectors = unit(vectors[:, :cut]) if req.normalize else vectors[:, :cut]
    return json_response(vectors.tolist(), headers=timing_headers(result.timings))


def _dimensions(engine, dimensions: int | None) -> int | None:
    """The components `/embed` keeps (None: all); 400 naming `dimensions` past the width of
    `engine`'s model."""
    width = getattr(engine.task.head, "dimensions", None)
    if dimensions is None or width is None or dimensions == width:
        return None
    if dimensions > width:
        why = f"dimensions: must be at most {width}, the model's width"
        raise ApiError(400, why, param="dimensions")
    return dimensions


async def embed_all(service: Service, request: Request) -> Response:
    """TEI's `/embed_all`: each input's token vectors (its final hidden states, special and
    prompt tokens included), in input order."""
    try:
        req = await service.decode(request, embed_all_decoder)
        result = await embed_answers.embed(
            service,
            request,
            embed_answers.inputs(req.inputs, "inputs"),
            {"input": "inputs"},
            verb="embed_tokens",
            truncate=tei.truncates(service, req.truncate),
            truncation_side=req.truncation_direction.lower(),
            prompt_name=req.prompt_name,
        )
    except ApiError as e:
        raise TeiError(e) from None
    vectors = [v.tolist() for v in result.embeddings]
    return json_response(vectors, headers=timing_headers(result.timings))


async def embed_sparse(service: Service, request: Request) -> Response:
    """TEI's `/embed_sparse`: each input's non-zero entries, in input order."""
    try:
        req = await service.decode(request, embed_sparse_decoder)
        result = await embed_answers.embed(
            service,
            request,
            embed_answers.inputs(req.inputs, "inputs"),
            {"input": "inputs"},
            verb="embed_sparse",
            truncate=tei.truncates(service, req.truncate),
            truncation_side=req.truncation_direction.lower(),
            prompt_name=req.prompt_name,
            max_active_dims=req.max_active_dims,
        )
    except ApiError as e:
        raise TeiError(e) from None
    vectors = [
        [{"index": i, "value": v} for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
        for ids, values in result.embeddings
    ]
    return json_response(vectors, headers=timing_headers(result.timings))


async def similarity(service: Service, request: Request) -> Response:
    """TEI's `/similarity`: cosine similarities, in the order of `sentences`."""
    try:
        req = await service.decode(request, similarity_decoder)
        given, options = req.inputs, req.parameters or SimilarityParameters()
        if not given.sentences:
            field = "inputs.sentences"
            raise ApiError(400, f"{field}: must not be an empty list", param=field)
        texts = [given.source_sentence, *given.sentences]
        result = await embed_answers.embed(
            service,
            request,
            embed_answers.inputs(texts, "inputs"),
            {"input": "inputs"},
            truncate=tei.truncates(service, options.truncate),
            truncation_side=options.truncation_direction.lower(),
            prompt_name=options.prompt_name,
            normalize=True,
        )
    except ApiError as e:
        raise TeiError(_similarity_field(e)) from None
    source, others = result.embeddings[0], result.embeddings[1:]
    scores = np.clip(others @ source, -1.0, 1.0)
    return json_response(scores.tolist(), headers=timing_headers(result.timings))


def _similarity_field(error: ApiError) -> ApiError:
    """The error naming `inputs.source_sentence` or `inputs.sentences[j]` for the text it found
    bad (the texts embedded are the source, then the sentences)."""
    param = error.param or ""
    if not param.startswith("inputs["):
        return error
    i = int(param[len("inputs[") : param.index("]")])
    field = "inputs.source_sentence" if i == 0 else f"inputs.sentences[{i - 1}]"
    message = field + error.message[len(param) :] if error.message.startswith(param) else None
    return ApiError(error.status, message or error.message, param=field)
