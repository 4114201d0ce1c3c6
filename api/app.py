"""The ASGI app: `hypercorn api.app:app` (asyncio; the engine runs in a trio thread) or
`hypercorn -k trio api.app:app` (the engine runs in the server's loop).

Configured by `SCORING_*` environment variables (see `api.settings`). The engine loads and
compiles in the background after startup; `/health` answers 503 until it is ready.
"""

import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from api import errors, routes, tracing
from api.bridge import host_engine
from api.metrics import CountRequests
from api.service import Service
from api.settings import Settings, settings_from_env

log = logging.getLogger("api")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Start each model's engine host (loading in the background), and the traces' exporter
    when tracing is on; stop them on shutdown, the traces' last."""
    service: Service = app.state.service
    _configure_logging(service.settings.server.log_level)
    async with contextlib.AsyncExitStack() as hosts:
        service.traces = await hosts.enter_async_context(tracing.exporting(service.settings.server))
        for model in service.models:
            service.hosts[model.name] = await hosts.enter_async_context(host_engine(model.engine))
        try:
            yield
        finally:
            service.hosts.clear()


def create_app(settings: Settings | None = None) -> Starlette:
    """A new app with its own service state; `settings` default to the environment's."""
    service = Service(settings or settings_from_env())
    service.needs = {e.path: e.needs for e in routes.ENDPOINTS if e.needs}
    paths = frozenset(route.path for route in routes.ROUTES)
    middleware = [Middleware(CountRequests, metrics=service.metrics, routes=paths)]
    if service.settings.server.otlp_traces_endpoint:
        traced = frozenset(service.needs)  # the engine routes
        traces = lambda: service.traces
        middleware.append(Middleware(tracing.TraceRequests, traces=traces, paths=traced))
    origins = service.settings.server.cors_origins
    if origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(origins),
                allow_methods=["GET", "POST"],
                allow_headers=["*"],
            )
        )
    app = Starlette(
        routes=routes.ROUTES,
        middleware=middleware,
        exception_handlers=errors.handlers(routes.TEI_PATHS),
        lifespan=lifespan,
    )
    app.state.service = service
    return app


def _configure_logging(level: str) -> None:
    # the server's lines and the engine's (its start-up choices); a handler only when nothing
    # else (the server, pytest) has set up logging, so lines are not doubled
    for logger in (log, logging.getLogger("engine")):
        logger.setLevel(level.upper())
        if not logger.hasHandlers():
            handler = logging.StreamHandler(sys.stderr)
            form = "%(asctime)s %(levelname)s %(name)s: %(message)s"
            handler.setFormatter(logging.Formatter(form))
            logger.addHandler(handler)


app = create_app()
