"""The scoring endpoints: SGLang's and vLLM's score, every client's rerank, and SageMaker's
scoring bodies (`api.invocations`). Each reads its body, calls the engine where it runs, and
answers in the shape the client that asked parses (`api.rerank_answers`, `api.vllm_score`)."""

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import rerank_answers, schemas, tei, truncation, vllm_score
from api.errors import ApiError, TeiError
from api.service import Service
from engine import Timings


def json_response(body, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`body` (a Struct, or a list of them) as a JSON answer."""
    return Response(schemas.encode(body), status, headers, media_type="application/json")


def timing_headers(t: Timings) -> dict[str, str]:
    """Per-stage times of one request in milliseconds (`x-batch-build-time`, ...)."""
    stages = msgspec.structs.asdict(t)
    return {f"x-{name.replace('_', '-')}-time": f"{s * 1e3:.3f}" for name, s in stages.items()}


async def score(service: Service, request: Request) -> Response:
    """SGLang's `/v1/score`, or vLLM's for a body with vLLM's fields (`api.vllm_score`)."""
    body = await service.body(request)
    if keys_of(body) & vllm_score.KEYS:
        return await _vllm_score(service, request, body)
    return await _score(service, request, service.parse(body, schemas.score_decoder))


async def vllm_score_route(service: Service, request: Request) -> Response:
    """vLLM's `/score`: the relevance of query/document pairs, in pair order."""
    return await _vllm_score(service, request, await service.body(request))


async def _vllm_score(service: Service, request: Request, body: bytes) -> Response:
    req = service.parse(body, vllm_score.decoder)
    pairs = vllm_score.pairs_of(req)
    if req.max_tokens_per_query:
        message = "max_tokens_per_query: queries are never cut; cut documents instead"
        raise ApiError(400, message, param="max_tokens_per_query")
    name = service.route(request, req.model)
    result = await service.call(
        request,
        lambda engine: engine.score_pairs(
            pairs.queries,
            pairs.documents,
            max_tokens_per_doc=req.max_tokens_per_doc or None,
            raw_scores=vllm_score.raw_scores(req),
            **truncation.vllm_rerank(req.truncate_prompt_tokens),
        ),
        model=name,
        renames={"documents": pairs.names[1], "max_prompt_tokens": "truncate_prompt_tokens"},
    )
    service.observe(request, result, len(pairs.documents), name)
    scores = [s[0] for s in result.scores]
    answer = vllm_score.response(scores, result, req.model or name)
    return json_response(answer, headers=timing_headers(result.timings))


async def _score(service: Service, request: Request, req: schemas.ScoreRequest) -> Response:
    name = service.route(request, req.model)
    result = await service.call(
        request,
        lambda engine: engine.score(
            req.query,
            req.items,
            req.label_token_ids,
            apply_softmax=req.apply_softmax,
            item_first=req.item_first,
        ),
        model=name,
    )
    service.observe(request, result, len(result.scores), name)
    body = schemas.ScoreResponse(
        scores=result.scores,
        model=req.model or name,  # echoed, as SGLang does
        usage=schemas.usage_of(schemas.Usage, result),
    )
    return json_response(body, headers=timing_headers(result.timings))


def rerank(dialect: rerank_answers.Dialect):
    """The handler of a rerank route of `dialect`: rerank in the spelling and answer shape of
    the client that asks (`api.rerank_answers`): Cohere v1/v2, Jina, vLLM, SGLang, Voyage, TEI,
    Mixedbread."""

    async def handle(service: Service, request: Request) -> Response:
        req = await service.decode(request, schemas.rerank_decoder)
        return await rerank_as(service, request, req, dialect)

    return handle


async def rerank_as(
    service: Service, request: Request, req: schemas.RerankRequest, dialect
) -> Response:
    """The answer to a decoded rerank request, shaped as a route of `dialect` answers it."""
    sglang = service.settings.server.rerank_format == "sglang"
    shape = rerank_answers.shape_of(dialect, req, sglang)
    try:
        return await _rerank(service, request, req, shape, dialect.version)
    except ApiError as e:
        raise TeiError(e) if shape == "tei" else e from None


async def _rerank(service, request, req: schemas.RerankRequest, shape, version) -> Response:
    docs = rerank_answers.documents_of(req)
    if not req.query and shape != "tei":  # TEI alone scores documents against no query
        raise ApiError(400, "query: must not be empty", param="query")
    if shape == "tei" and not docs.texts:
        raise ApiError(400, "`texts` cannot be empty", param="texts", empty=True)
    if req.instruction is not None and req.instruct is not None:
        raise ApiError(
            400, "instruct: give `instruction` or `instruct`, not both", param="instruct"
        )
    voyage_default = shape == "voyage" and req.truncation is msgspec.UNSET
    given = tei.truncates(service, req.truncate) if shape == "tei" else bool(req.truncate)
    truncate = given or req.truncation is True or voyage_default
    limit = truncation.vllm_rerank(req.truncate_prompt_tokens)
    name = service.route(request, req.model)
    result = await service.call(
        request,
        lambda engine: engine.rerank(
            req.query,
            docs.texts,
            top_n=rerank_answers.top_n(req),
            instruction=req.instruction if req.instruct is None else req.instruct,
            max_tokens_per_doc=req.max_tokens_per_doc,
            truncate=truncate or limit["truncate"],
            max_prompt_tokens=limit["max_prompt_tokens"],
            truncation_side=req.truncation_direction.lower(),
            raw_scores=req.raw_scores or req.use_activation is False,
        ),
        model=name,
        renames={"documents": docs.field, "max_prompt_tokens": "truncate_prompt_tokens"},
    )
    service.observe(request, result, len(docs.texts), name)
    model = req.model or name
    body = rerank_answers.answer(shape, req, docs, result, model=model, version=version)
    return json_response(body, headers=timing_headers(result.timings))


async def score_or_rerank(service: Service, request: Request, body: bytes) -> Response:
    """SageMaker's scoring bodies (`api.invocations`): SGLang's score body (with
    `label_token_ids`) or vLLM's (`queries`, `text_1`, `data_1`) scored, any other reranked
    (`texts` as TEI's `/rerank`)."""
    route = scoring_route(keys_of(body))
    if route == "/v1/score":
        return await _score(service, request, service.parse(body, schemas.score_decoder))
    if route == "/score":
        return await _vllm_score(service, request, body)
    req = service.parse(body, schemas.rerank_decoder)
    return await rerank_as(service, request, req, rerank_answers.TEI_RERANK)


def scoring_route(keys: set[str]) -> str:
    """The route a scoring body with top-level `keys` is answered as (`score_or_rerank`)."""
    if "label_token_ids" in keys:
        return "/v1/score"
    return "/score" if keys & vllm_score.KEYS - {"documents"} else "/rerank"


_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def keys_of(body: bytes) -> set[str]:
    """The top-level keys of a JSON object body; none for anything else (its decoder will say
    what is wrong)."""
    try:
        return set(_KEYS.decode(body))
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return set()
