"""The HTTP endpoints and the route table. Each endpoint is `async fn(service, request)`."""

import functools
import uuid
from importlib import metadata
from pathlib import Path

import anyio
import jax
import msgspec
import sniffio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.errors import ApiError, internal_error
from api.metrics import CONTENT_TYPE
from api.openapi import openapi
from api.service import Service
from api.settings import model_path
from engine import Timings


def _json(body, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(schemas.encode(body), status, headers, media_type="application/json")


def timing_headers(t: Timings) -> dict[str, str]:
    """Per-stage times of one request in milliseconds."""
    stages = {"tokenize": t.tokenize, "queue": t.queue, "batch-build": t.batch_build}
    stages |= {"device": t.device, "total": t.total}
    return {f"x-{name}-time": f"{seconds * 1e3:.3f}" for name, seconds in stages.items()}


async def score(service: Service, request: Request) -> Response:
    """sglang `/v1/score`."""
    req = await service.decode(request, schemas.score_decoder)
    _require_query(req.query)
    result = await service.call(
        request,
        lambda engine: engine.score(
            req.query,
            req.items,
            req.label_token_ids,
            apply_softmax=req.apply_softmax,
            item_first=req.item_first,
        ),
    )
    service.metrics.observe("/v1/score", result.timings, len(result.scores))
    tokens = result.prompt_tokens
    body = schemas.ScoreResponse(
        scores=result.scores,
        model=service.model_name,
        usage=schemas.Usage(prompt_tokens=tokens, total_tokens=tokens),
    )
    return _json(body, headers=timing_headers(result.timings))


async def rerank(service: Service, request: Request) -> Response:
    """Cohere/Jina `/v1/rerank` (TEI's `texts` / `return_text` accepted)."""
    req = await service.decode(request, schemas.rerank_decoder)
    _require_query(req.query)
    field, documents = _documents(req)

    result = await service.call(
        request,
        lambda engine: engine.rerank(
            req.query,
            documents,
            top_n=req.top_n,
            instruction=req.instruction,
            max_tokens_per_doc=req.max_tokens_per_doc,
            truncate=req.truncate,
        ),
        renames={"documents": field},
    )
    service.metrics.observe(request.url.path, result.timings, len(documents))
    echo = bool(req.return_documents or req.return_text)
    hits = [
        schemas.RerankHit(
            index=h.index,
            relevance_score=h.relevance_score,
            document=schemas.Document(documents[h.index]) if echo else None,
        )
        for h in result.results
    ]
    tokens = result.prompt_tokens
    body = schemas.RerankResponse(
        id=uuid.uuid4().hex,
        model=service.model_name,
        results=hits,
        usage=schemas.RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
    return _json(body, headers=timing_headers(result.timings))


def _require_query(query: str | list[int]) -> None:
    # an empty query scores the items alone: a client's mistake, not a request for that
    if len(query) == 0:
        raise ApiError(400, "query: must not be empty", param="query")


def _documents(req: schemas.RerankRequest) -> tuple[str, list[str]]:
    """The request's document texts and the field that carried them."""
    if req.documents is not None and req.texts is not None:
        raise ApiError(400, "texts: give `documents` or `texts`, not both", param="texts")
    if req.texts is not None:
        return "texts", req.texts
    if req.documents is None:
        raise ApiError(400, "documents: required (or TEI's `texts`)", param="documents")
    return "documents", [d if isinstance(d, str) else d.text for d in req.documents]


async def health(service: Service, request: Request) -> Response:
    """200 once the engine has loaded and compiled; 503 before (or if it failed)."""
    host = service.host
    status = host.status if host else "loading"
    if status == "ready":
        return _json(schemas.HealthResponse(status="ok"))
    message = host.error if host else None
    headers = {"Retry-After": str(service.settings.server.retry_after_s)}
    return _json(schemas.HealthResponse(status=status, message=message), 503, headers)


async def models(service: Service, request: Request) -> Response:
    engine = service.host.engine if service.host else None
    card = schemas.ModelCard(
        id=service.model_name,
        created=int(service.started),
        max_model_len=engine.max_sequence_tokens if engine else None,
    )
    return _json(schemas.ModelList(data=[card]))


async def model_info(service: Service, request: Request) -> Response:
    engine = service.engine()
    cfg = engine.model_config
    path = model_path(engine.config.model)
    return _json(
        {
            "model_path": path,
            "tokenizer_path": path,
            "is_generation": False,
            "model_name": service.model_name,
            "family": cfg.family,
            "dtype": engine.program.dtype,
            "vocab_size": cfg.vocab_size,
            "context_length": cfg.max_position_embeddings,
            "max_sequence_tokens": engine.max_sequence_tokens,
            "kv_bytes_per_token": engine.program.kv_bytes_per_token,
            "rerank_template": engine.template.name,
        }
    )


async def server_info(service: Service, request: Request) -> Response:
    """Configuration (no secrets), buckets, KV bytes per token and engine counters."""
    settings = service.settings
    engine = service.host.engine if service.host else None
    server = msgspec.structs.replace(settings.server, api_key=None)
    return _json(
        {
            "version": _version(),
            "model": service.model_name,
            "status": service.host.status if service.host else "loading",
            "async_library": sniffio.current_async_library(),
            "auth": settings.server.api_key is not None,
            "engine_config": settings.engine,
            "server_config": server,
            "buckets": engine.buckets._asdict() if engine else None,
            "kv_bytes_per_token": engine.program.kv_bytes_per_token if engine else None,
            "max_sequence_tokens": engine.max_sequence_tokens if engine else None,
            "stats": engine.stats() if engine else None,
            "profiling": service.profiling,
        }
    )


async def metrics(service: Service, request: Request) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)


async def start_profile(service: Service, request: Request) -> Response:
    """Start a JAX profiler trace into the configured directory or a subdirectory of it named by
    `output_dir`; 400 for a path leaving that root, 409 if a trace runs."""
    req = await service.decode(request, schemas.profile_decoder, empty=schemas.ProfileRequest())
    directory = profile_directory(service.settings.server.profile_dir, req.output_dir)
    if service.profiling is not None:
        raise ApiError(409, f"a profile is already running into {service.profiling}")
    try:
        await anyio.to_thread.run_sync(jax.profiler.start_trace, directory)
    except (RuntimeError, OSError) as e:
        raise ApiError(409, f"profiler: {e}") from None
    service.profiling = directory
    return _json(schemas.ProfileResponse(status="started", output_dir=directory))


def profile_directory(root: str, output_dir: str | None) -> str:
    """`root`, or `output_dir` resolved under it; ApiError 400 when it would leave the root."""
    base = Path(root).resolve()
    if output_dir is None:
        return str(base)
    # a NUL names no file: resolve() would raise ValueError
    target = None if "\0" in output_dir else (base / output_dir).resolve()
    if target is None or Path(output_dir).is_absolute() or not target.is_relative_to(base):
        raise ApiError(
            400,
            "output_dir: must be a relative path inside the profile directory",
            param="output_dir",
        )
    return str(target)


async def stop_profile(service: Service, request: Request) -> Response:
    await service.decode(request, schemas.profile_decoder, empty=schemas.ProfileRequest())
    directory = service.profiling
    if directory is None:
        raise ApiError(409, "no profile is running")
    service.profiling = None
    await anyio.to_thread.run_sync(jax.profiler.stop_trace)
    return _json(schemas.ProfileResponse(status="stopped", output_dir=directory))


async def openapi_json(service: Service, request: Request) -> Response:
    return _json(openapi("llm-scoring-engine", _version()))


def _version() -> str:
    try:
        return metadata.version("llm-scoring-engine")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def endpoint(fn, *, open_access: bool = False):
    """A Starlette endpoint around `fn(service, request)`: authorisation first, and an
    unexpected exception logged and answered as a 500."""

    @functools.wraps(fn)
    async def handle(request: Request) -> Response:
        service: Service = request.app.state.service
        if not open_access:
            service.authorize(request)
        try:
            return await fn(service, request)
        except ApiError:
            raise
        except Exception as e:
            raise internal_error(e) from e

    return handle


ROUTES = [
    Route("/health", endpoint(health, open_access=True), methods=["GET"]),
    Route("/v1/score", endpoint(score), methods=["POST"]),
    Route("/v1/rerank", endpoint(rerank), methods=["POST"]),
    Route("/rerank", endpoint(rerank), methods=["POST"]),
    Route("/v1/models", endpoint(models), methods=["GET"]),
    Route("/get_model_info", endpoint(model_info), methods=["GET"]),
    Route("/get_server_info", endpoint(server_info), methods=["GET"]),
    Route("/metrics", endpoint(metrics), methods=["GET"]),
    Route("/start_profile", endpoint(start_profile), methods=["POST"]),
    Route("/stop_profile", endpoint(stop_profile), methods=["POST"]),
    Route("/openapi.json", endpoint(openapi_json), methods=["GET"]),
]
