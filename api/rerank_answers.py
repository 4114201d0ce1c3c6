"""The rerank request read in every client's spelling, and the answer in the shape that client
parses: which shape a request gets follows from its route's dialect and its fields (`shape_of`).

    cohere      {id, model, results: [{index, relevance_score, document?}], usage, meta}
                Cohere v1/v2, Jina, vLLM: /v1/rerank, /v2/rerank, /rerank
    voyage      {object: "list", data: [{index, relevance_score, document?}], model, usage}
                /v1/rerank with Voyage's `top_k` or `truncation`
    mixedbread  {object: "list", model, data: [{index, score, input?}], top_k, ...}: /v1/reranking
    tei         [{index, score, text?}]: TEI's `texts` on /rerank (or /invocations)
    sglang      [{index, score, document?}]: /v1/rerank with SCORING_RERANK_FORMAT=sglang
"""

import math
import uuid
from typing import Any, Literal, NamedTuple

import msgspec
from msgspec import UNSET

from api.errors import ApiError
from api.schemas import DocumentIn, RerankRequest, RerankUsage, usage_of
from engine import RerankResult

Shape = Literal["cohere", "voyage", "mixedbread", "tei", "sglang"]
SEARCH_UNIT_DOCUMENTS = 100  # Cohere bills one search unit per query and 100 documents
# whether documents come back when the request does not say: as each client's own server does
ECHO_BY_DEFAULT = {
    "cohere": True,
    "voyage": False,
    "mixedbread": False,
    "tei": False,
    "sglang": True,
}


class Dialect(NamedTuple):
    """Which answers a rerank route gives (each route's row in `api.routes` names its own):
    Cohere's, of `version`; Mixedbread's always; TEI's for a body with `texts`; Voyage's for a
    body with Voyage's fields, and SGLang's list when the server is configured so (`shared`:
    the route Cohere v1, Jina, Voyage and SGLang share)."""

    version: str = "1"  # Cohere's `meta.api_version`
    mixedbread: bool = False
    tei: bool = False
    shared: bool = False


COHERE_V1 = Dialect(shared=True)
COHERE_V2 = Dialect(version="2")
TEI_RERANK = Dialect(tei=True)
MIXEDBREAD = Dialect(mixedbread=True)


def shape_of(dialect: Dialect, req: RerankRequest, sglang_v1: bool) -> Shape:
    """The answer's shape for a request to a route of `dialect` (docs/clients.md)."""
    if dialect.mixedbread:
        return "mixedbread"
    if req.texts is not None and dialect.tei:
        return "tei"
    if dialect.shared and (req.top_k is not UNSET or req.truncation is not UNSET):
        return "voyage"
    if sglang_v1 and dialect.shared:
        return "sglang"
    return "cohere"


class Documents(msgspec.Struct, frozen=True):
    """The request's documents: as given (echoed back), as ranked text, and their field name."""

    given: list[DocumentIn]
    texts: list[str]
    field: str


def documents_of(req: RerankRequest) -> Documents:
    """The one document list the request gives, each document's text to rank; 400 naming the
    field for none, several, or an object without the text to rank."""
    given = {"documents": req.documents, "texts": req.texts, "input": req.input}
    named = [(name, docs) for name, docs in given.items() if docs is not None]
    if len(named) != 1:
        message = "give the documents as one of `documents`, `texts` (TEI) or `input`"
        field = "documents" if not named else named[1][0]
        raise ApiError(400, f"{field}: {message}", param=field)
    field, docs = named[0]
    texts = [_text(d, f"{field}[{i}]", req.rank_fields) for i, d in enumerate(docs)]
    return Documents(list(docs), texts, field)


def _text(document: DocumentIn, at: str, rank_fields: list[str] | None) -> str:
    """A document's text to rank: a string as is; an object's `text`, or with `rank_fields`
    one "field: value" line per field it has."""
    if isinstance(document, str):
        return document
    if rank_fields is None:
        return _field(document, "text", at)
    lines = [f"{f}: {_field(document, f, at)}" for f in rank_fields if f in document]
    if not lines:
        raise ApiError(400, f"{at}: has none of the rank_fields {rank_fields}", param=at)
    return "\n".join(lines)


def _field(document: dict[str, Any], name: str, at: str) -> str:
    value = document.get(name)
    if not isinstance(value, str):
        problem = "required (or name the fields to rank with `rank_fields`)"
        problem = problem if value is None else "must be a string"
        raise ApiError(400, f"{at}.{name}: {problem}", param=f"{at}.{name}")
    return value


def top_n(req: RerankRequest) -> int | None:
    """How many results: `top_n` or `top_k`, 0 and None meaning all."""
    n = req.top_k if req.top_k is not UNSET and req.top_n is None else req.top_n
    return n or None


def echo(req: RerankRequest, shape: Shape) -> bool:
    """Whether the answer carries the documents."""
    asked = (req.return_documents, req.return_text, req.return_input)
    said = [a for a in asked if a is not None]
    return any(said) if said else ECHO_BY_DEFAULT[shape]


# -- answers ---------------------------------------------------------------------------------


class ApiVersion(msgspec.Struct, kw_only=True):
    version: str


class BilledUnits(msgspec.Struct, kw_only=True):
    search_units: int


class MetaTokens(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int = 0


class Meta(msgspec.Struct, kw_only=True):
    """Cohere's `meta`: what the call billed and the tokens it read."""

    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: MetaTokens


class RerankHit(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None  # {"text": ...}, or the object given


class RerankResponse(msgspec.Struct, kw_only=True):
    """Cohere's answer, which Jina and vLLM give too (with `usage`)."""

    id: str
    model: str
    results: list[RerankHit]  # best first
    usage: RerankUsage
    meta: Meta


class VoyageHit(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: str | None = None


class VoyageUsage(msgspec.Struct, kw_only=True):
    total_tokens: int


class VoyageResponse(msgspec.Struct, kw_only=True):
    data: list[VoyageHit]  # best first
    model: str
    usage: VoyageUsage
    object: str = "list"


class MixedbreadHit(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float
    input: DocumentIn | None = None
    object: str = "rank_result"


class MixedbreadResponse(msgspec.Struct, kw_only=True):
    model: str
    data: list[MixedbreadHit]  # best first
    top_k: int
    return_input: bool
    usage: RerankUsage
    object: str = "list"


class TeiRank(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


class SglangHit(msgspec.Struct, kw_only=True, omit_defaults=True):
    score: float
    index: int
    document: str | None = None


def answer(
    shape: Shape,
    req: RerankRequest,
    docs: Documents,
    result: RerankResult,
    *,
    model: str,
    version: str = "1",
) -> msgspec.Struct | list:
    """The answer body for `result` in `shape` (Cohere's of `version`)."""
    hits, with_docs = result.results, echo(req, shape)
    texts = [docs.texts[h.index] if with_docs else None for h in hits]
    if shape == "tei":
        ranks = [
            TeiRank(index=h.index, score=h.relevance_score, text=t)
            for h, t in zip(hits, texts, strict=True)
        ]
        return sorted(ranks, key=lambda r: (-r.score, -r.index))  # TEI: ties higher index first
    if shape == "sglang":
        return [
            SglangHit(score=h.relevance_score, index=h.index, document=t)
            for h, t in zip(hits, texts, strict=True)
        ]
    usage = usage_of(RerankUsage, result)
    if shape == "voyage":
        data = [
            VoyageHit(index=h.index, relevance_score=h.relevance_score, document=t)
            for h, t in zip(hits, texts, strict=True)
        ]
        return VoyageResponse(
            data=data, model=model, usage=VoyageUsage(total_tokens=usage.total_tokens)
        )
    if shape == "mixedbread":
        given = [docs.given[h.index] if with_docs else None for h in hits]
        data = [
            MixedbreadHit(index=h.index, score=h.relevance_score, input=g)
            for h, g in zip(hits, given, strict=True)
        ]
        top_k = len(data)
        return MixedbreadResponse(
            model=model, data=data, top_k=top_k, return_input=with_docs, usage=usage
        )
    results = [
        RerankHit(
            index=h.index,
            relevance_score=h.relevance_score,
            document=_as_object(docs.given[h.index]) if with_docs else None,
        )
        for h in hits
    ]
    meta = Meta(
        api_version=ApiVersion(version=version),
        billed_units=BilledUnits(search_units=math.ceil(len(docs.texts) / SEARCH_UNIT_DOCUMENTS)),
        tokens=MetaTokens(input_tokens=usage.prompt_tokens),
    )
    return RerankResponse(id=uuid.uuid4().hex, model=model, results=results, usage=usage, meta=meta)


def _as_object(document: DocumentIn) -> dict[str, Any]:
    return {"text": document} if isinstance(document, str) else document
