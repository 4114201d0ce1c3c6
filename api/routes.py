"""The HTTP endpoints, each `async fn(service, request)`, and the table of them (`ENDPOINTS`)
from which both the Starlette routes (`ROUTES`) and the OpenAPI document are built."""

import functools
from importlib import metadata

import anyio
import msgspec
import sniffio
from starlette.requests import Request
from starlette.responses import Response

from api import (
    cohere_embed,
    dashboard,
    embeddings,
    hybrid,
    rerank_answers,
    schemas,
    tei,
    tei_embed,
    tokens,
    vllm_generative,
    vllm_pooling,
    vllm_score,
)
from api.errors import ApiError
from api.invocations import invocations
from api.metrics import CONTENT_TYPE
from api.openapi import ANY_JSON, HTML, NO_BODY, PLAIN_TEXT, Answer, Endpoint, openapi, route
from api.profiling import start_profile, stop_profile
from api.scoring import json_response, rerank, score, vllm_score_route
from api.served import model_path
from api.service import Service
from engine import Engine
from engine.capabilities import Ability
from engine.plan import capacities


async def tei_info(service: Service, request: Request) -> Response:
    """TEI's `/info`."""
    return await tei.info(service, request, _version())


async def health(service: Service, request: Request) -> Response:
    """200 once every model's engine has loaded and compiled; 503 before (or if one failed),
    naming the first that is not ready when several are served."""
    for model in service.models:
        host = service.hosts.get(model.name)
        status = host.status if host else "loading"
        if status != "ready":
            message = host.error if host else None
            if len(service.models) > 1:
                message = f"{model.name}: {message or status}"
            headers = {"Retry-After": str(service.settings.server.retry_after_s)}
            body = schemas.HealthResponse(status=status, message=message)
            return json_response(body, 503, headers)
    return json_response(schemas.HealthResponse(status="ok"))


async def models(service: Service, request: Request) -> Response:
    """The served models as an OpenAI model list; a model's facts are null while its engine
    loads."""
    cards = []
    for model in service.models:
        host = service.hosts.get(model.name)
        engine = host.engine if host else None
        facts = _model_facts(engine) if engine else {}
        defaults = [p for p in facts.get("endpoints", ()) if service.default_model(p) == model.name]
        card = schemas.ModelCard(
            id=model.name,
            created=int(service.started),
            max_model_len=engine.max_input_tokens if engine else None,  # as vLLM reads it
            default_endpoints=defaults if engine else None,
            **facts,
        )
        cards.append(card)
    return json_response(schemas.ModelList(data=cards))


def _model_facts(engine: Engine) -> dict:
    """What the served model is: the fields `ModelCard` and `ModelInfo` share."""
    cfg, task, info = engine.model_config, engine.task, engine.info()
    recipe = engine.capabilities.offers(Ability.RECIPE)
    return {
        "family": cfg.family,
        "dtype": info.dtype,
        "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        "head": task.head.kind,
        "architecture": task.architecture,
        "num_labels": cfg.num_labels,
        "rerank_template": engine.template.name if recipe else task.name,
        "endpoints": scoring_endpoints(engine),
    }


def scoring_endpoints(engine: Engine) -> list[str]:
    """The scoring and embedding routes this model answers, in the table's order: those whose
    abilities (any of an endpoint's `needs`) its capability record offers."""
    offers = engine.capabilities.offers
    return [e.path for e in ENDPOINTS if e.needs and any(map(offers, e.needs))]


async def model_info(service: Service, request: Request) -> Response:
    """sglang's model facts (of `?model=NAME` where several are served: by default the
    first); 503 while the engine loads."""
    name = service.route(request, request.query_params.get("model"))
    engine = service.engine(name)
    path = model_path(engine.config.model)
    info = schemas.ModelInfo(
        model_path=path,
        tokenizer_path=path,
        is_generation=False,
        model_name=name,
        max_sequence_tokens=engine.max_sequence_tokens,
        **_model_facts(engine),
    )
    return json_response(info)


async def server_info(service: Service, request: Request) -> Response:
    """Configuration (no secrets), buckets, KV bytes per token and engine counters (of
    `?model=NAME` where several are served: by default the first)."""
    settings = service.settings
    name = service.route(request, request.query_params.get("model"))
    host = service.hosts.get(name)
    engine = host.engine if host else None
    roofline = None
    if engine and request.query_params.get("roofline", "0").lower() in ("1", "true"):
        if not engine.capabilities.offers(Ability.ROOFLINE):
            raise ApiError(400, f"roofline: {engine.capabilities.refusal(Ability.ROOFLINE)}")
        if engine.info().dtype == "int8":
            raise ApiError(400, "roofline: the plan models bf16 and f32 compute; this is int8")
        roofline = await anyio.to_thread.run_sync(service.roofline, engine)
    facts = engine.info() if engine else None
    info = schemas.ServerInfo(
        version=_version(),
        model=name,
        status=host.status if host else "loading",
        async_library=sniffio.current_async_library(),
        auth=settings.server.api_key is not None,
        engine_config=next(m.engine for m in service.models if m.name == name),
        server_config=msgspec.structs.replace(settings.server, api_key=None),
        buckets=schemas.BucketGrid(**facts.buckets) if facts else None,
        kv_bytes_per_token=facts.kv_bytes_per_token if facts else None,
        kv_pool=facts.kv_pool if facts else None,
        dense=facts.dense_choice if facts else None,
        plan=_plan(engine.model_config, facts) if facts else None,
        roofline=roofline,
        max_sequence_tokens=engine.max_sequence_tokens if engine else None,
        stats=engine.stats() if engine else None,
        profiling=service.profiling,
    )
    return json_response(info)


def _plan(config, facts) -> dict[str, schemas.DevicePlan]:
    figures = capacities(config, facts.dtype, facts.weight_bytes)
    return {kind: schemas.DevicePlan(**f) for kind, f in figures.items()}


async def metrics(service: Service, request: Request) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)


async def openapi_json(service: Service, request: Request) -> Response:
    return Response(_document_json(), media_type="application/json")


def document() -> dict:
    """The OpenAPI document of `ENDPOINTS`."""
    return openapi("llm-scoring-engine", _version(), ENDPOINTS)


@functools.cache
def _document_json() -> bytes:
    return schemas.encode(document())


def _version() -> str:
    try:
        return metadata.version("llm-scoring-engine")
    except metadata.PackageNotFoundError:
        return "0+unknown"


SCORING_ERRORS = (400, 401, 413, 499, 500, 503)
PROFILE_ERRORS = (400, 401, 409, 413)


def _rerank_at(path: str, response, summary: str, dialect: rerank_answers.Dialect) -> Endpoint:
    request = schemas.RerankRequest
    tei = dialect.tei
    errors, body = (TEI_ERRORS, EITHER_ERROR) if tei else (SCORING_ERRORS, schemas.ErrorResponse)
    return Endpoint(
        path,
        "POST",
        rerank(dialect),
        summary,
        response,
        request,
        errors=errors,
        error_body=body,
        needs=(Ability.RERANK,),
    )


# where TEI's requests come, its error bodies and statuses too
EITHER_ERROR = (schemas.ErrorResponse, schemas.TeiErrorResponse)
TEI_ERRORS = (*SCORING_ERRORS, 422, 424, 429)


COHERE, TEI = rerank_answers.RerankResponse, list[rerank_answers.TeiRank]


def _invocations_at(path: str, summary: str) -> Endpoint:
    """A route answering any body kind as its own route does (`api.invocations`)."""
    return Endpoint(
        path,
        "POST",
        invocations,
        summary,
        (
            COHERE,
            TEI,
            schemas.ScoreResponse,
            vllm_score.VllmScoreResponse,
            embeddings.EmbeddingResponse,
            vllm_pooling.PoolingResponse,
            tei_embed.TEI_VECTORS,
            tei_embed.TEI_SPARSE_VECTORS,
        ),
        (
            schemas.RerankRequest,
            schemas.ScoreRequest,
            vllm_score.VllmScoreRequest,
            embeddings.EmbeddingRequest,
            vllm_pooling.PoolingRequest,
            tei_embed.TeiEmbedRequest,
        ),
        errors=TEI_ERRORS,
        error_body=EITHER_ERROR,
        needs=(Ability.SCORE, Ability.RERANK, Ability.EMBED, Ability.EMBED_SPARSE),
    )


# the route table and the OpenAPI document are both built from this
ENDPOINTS = (
    Endpoint(
        "/health",
        "GET",
        health,
        "Ready (200) or loading (503)",
        schemas.HealthResponse,
        answers=(Answer(503, "loading or failed", schemas.HealthResponse),),
        open_access=True,
    ),
    Endpoint(
        "/v1/score",
        "POST",
        score,
        "Label-token probabilities per item (SGLang), or vLLM's pair scores for its fields",
        (schemas.ScoreResponse, vllm_score.VllmScoreResponse),
        (schemas.ScoreRequest, vllm_score.VllmScoreRequest),
        errors=SCORING_ERRORS,
        needs=(Ability.SCORE,),
    ),
    Endpoint(
        "/generative_scoring",
        "POST",
        vllm_generative.generative_scoring,
        "The first label token's probability after query + item, per item (vLLM)",
        vllm_generative.GenerativeScoringResponse,
        vllm_generative.GenerativeScoringRequest,
        errors=SCORING_ERRORS,
        needs=(Ability.SCORE,),
    ),
    _rerank_at(
        "/v1/rerank",
        (COHERE, list[rerank_answers.SglangHit], rerank_answers.VoyageResponse),
        "Rerank documents (Cohere v1, Jina, vLLM, Voyage; SGLang's list when configured)",
        rerank_answers.COHERE_V1,
    ),
    _rerank_at(
        "/v2/rerank", COHERE, "Rerank documents (Cohere v2, vLLM)", rerank_answers.COHERE_V2
    ),
    _rerank_at(
        "/rerank",
        (COHERE, TEI),
        "Rerank documents (TEI's list for `texts`, vLLM)",
        rerank_answers.TEI_RERANK,
    ),
    _rerank_at(
        "/v1/reranking",
        rerank_answers.MixedbreadResponse,
        "Rerank documents (Mixedbread)",
        rerank_answers.MIXEDBREAD,
    ),
    Endpoint(
        "/score",
        "POST",
        vllm_score_route,
        "Relevance of query/document pairs, in pair order (vLLM)",
        vllm_score.VllmScoreResponse,
        vllm_score.VllmScoreRequest,
        errors=SCORING_ERRORS,
        needs=(Ability.RERANK,),
    ),
    Endpoint(
        "/v1/embeddings",
        "POST",
        embeddings.embeddings,
        "One vector per input (OpenAI, Voyage, vLLM; an embedder's, other models answer 400)",
        embeddings.EmbeddingResponse,
        embeddings.EmbeddingRequest,
        errors=SCORING_ERRORS,
        needs=(Ability.EMBED,),
    ),
    Endpoint(
        "/v2/embed",
        "POST",
        cohere_embed.embed,
        "Vectors of texts in each number format asked for (Cohere v2)",
        cohere_embed.CohereEmbedResponse,
        cohere_embed.CohereEmbedRequest,
        errors=SCORING_ERRORS,
        needs=(Ability.EMBED,),
    ),
    Endpoint(
        "/embed",
        "POST",
        tei_embed.embed,
        "One vector per input (TEI)",
        tei_embed.TEI_VECTORS,
        tei_embed.TeiEmbedRequest,
        errors=TEI_ERRORS,
        error_body=schemas.TeiErrorResponse,
        needs=(Ability.EMBED,),
    ),
    Endpoint(
        "/embed_all",
        "POST",
        tei_embed.embed_all,
        "Every token's vector of each input, before pooling (TEI)",
        tei_embed.TEI_TOKEN_VECTORS,
        tei_embed.TeiEmbedAllRequest,
        errors=TEI_ERRORS,
        error_body=schemas.TeiErrorResponse,
        needs=(Ability.EMBED_TOKENS,),
    ),
    Endpoint(
        "/embed_sparse",
        "POST",
        tei_embed.embed_sparse,
        "Each input's sparse vector, its non-zero vocabulary entries (TEI; a SPLADE model's)",
        tei_embed.TEI_SPARSE_VECTORS,
        tei_embed.TeiEmbedSparseRequest,
        errors=TEI_ERRORS,
        error_body=schemas.TeiErrorResponse,
        needs=(Ability.EMBED_SPARSE,),
    ),
    Endpoint(
        "/embed_hybrid",
        "POST",
        hybrid.embed_hybrid,
        "Any of each input's dense, sparse and multi-vectors, from one forward (BGE-M3)",
        hybrid.HYBRID_EMBEDDINGS,
        hybrid.HybridRequest,
        errors=TEI_ERRORS,
        error_body=schemas.TeiErrorResponse,
        needs=(Ability.EMBED_HYBRID,),
    ),
    Endpoint(
        "/similarity",
        "POST",
        tei_embed.similarity,
        "Cosine similarity of a source sentence to each of several (TEI)",
        tei_embed.SIMILARITIES,
        tei_embed.SimilarityRequest,
        errors=TEI_ERRORS,
        error_body=schemas.TeiErrorResponse,
        needs=(Ability.EMBED,),
    ),
    Endpoint(
        "/pooling",
        "POST",
        vllm_pooling.pooling,
        "Each input's pooled vector (vLLM, an embedder's)",
        vllm_pooling.PoolingResponse,
        vllm_pooling.PoolingRequest,
        errors=SCORING_ERRORS,
        needs=(Ability.EMBED,),
    ),
    _invocations_at(
        "/invocations",
        "SageMaker: each body kind answered as its route answers it (embeddings for `input`, "
        "TEI's for `inputs`, a score for `label_token_ids`, else a rerank)",
    ),
    _invocations_at(
        "/",
        "TEI's root: its `inputs` embedded, its `query` and `texts` reranked, as `/invocations` "
        "answers them",
    ),
    Endpoint(
        "/tokenize",
        "POST",
        tokens.tokenize,
        "Token ids of a prompt (vLLM), or TEI's tokens of `inputs`",
        (tokens.TokenizeResponse, tokens.TEI_TOKENS),
        (tokens.TokenizeRequest, tokens.TeiTokenizeRequest),
        errors=(400, 401, 413, 422, 503),
        error_body=EITHER_ERROR,
    ),
    Endpoint(
        "/detokenize",
        "POST",
        tokens.detokenize,
        "The text of token ids (vLLM)",
        tokens.DetokenizeResponse,
        tokens.DetokenizeRequest,
        errors=(400, 401, 413, 503),
    ),
    Endpoint(
        "/decode",
        "POST",
        tokens.decode,
        "The text of token id lists (TEI)",
        tokens.TEI_TEXTS,
        tokens.TeiDecodeRequest,
        errors=(400, 401, 413, 422, 503),
        error_body=schemas.TeiErrorResponse,
    ),
    Endpoint(
        "/info",
        "GET",
        tei_info,
        "What serves, in TEI's fields",
        tei.TeiInfo,
        errors=(401, 503),
        error_body=EITHER_ERROR,
    ),
    Endpoint(
        "/ping",
        "GET",
        tei.ping,
        "SageMaker health: 200 with no body once ready, 503 before",
        NO_BODY,
        errors=(503,),
        error_body=schemas.TeiErrorResponse,
        open_access=True,
    ),
    Endpoint("/v1/models", "GET", models, "The served model", schemas.ModelList, errors=(401,)),
    Endpoint(
        "/get_model_info", "GET", model_info, "Model facts", schemas.ModelInfo, errors=(401, 503)
    ),
    Endpoint(
        "/get_server_info",
        "GET",
        server_info,
        "Configuration, buckets and engine counters",
        schemas.ServerInfo,
        errors=(401,),
    ),
    Endpoint(
        "/metrics", "GET", metrics, "Prometheus metrics (text format)", PLAIN_TEXT, errors=(401,)
    ),
    Endpoint(
        "/dashboard",
        "GET",
        dashboard.page,
        "The live dashboard, drawn from /metrics (a browser without the key: a page asking it)",
        HTML,
        errors=(401,),
        unauthorized=dashboard.key_form,
    ),
    Endpoint(
        "/start_profile",
        "POST",
        start_profile,
        "Start a JAX profiler trace",
        schemas.ProfileResponse,
        schemas.ProfileRequest,
        body_required=False,
        errors=PROFILE_ERRORS,
    ),
    Endpoint(
        "/stop_profile",
        "POST",
        stop_profile,
        "Stop the trace",
        schemas.ProfileResponse,
        schemas.ProfileRequest,
        body_required=False,
        errors=PROFILE_ERRORS,
    ),
    Endpoint("/openapi.json", "GET", openapi_json, "This document", ANY_JSON, errors=(401,)),
)

ROUTES = [route(e) for e in ENDPOINTS]
# the routes that serve reranks and nothing else (a cross-encoder's, with `/invocations`)
RERANK_PATHS = tuple(e.path for e in ENDPOINTS if e.needs == (Ability.RERANK,))
# the routes that answer in TEI's error shape alone
TEI_PATHS = frozenset(e.path for e in ENDPOINTS if e.error_body is schemas.TeiErrorResponse)
