"""Tracing: one OpenTelemetry span per request to an engine route, with a child span per engine
stage, sent over OTLP/HTTP when `otlp_traces_endpoint` is set (docs/dashboard.md, Tracing).

Off by default, and then free: no middleware is installed, OpenTelemetry is never imported, and
an answered request costs one `if` (`Service.observe`). On, `TraceRequests` times each request
to an engine route and, once it is answered, hands it to `api.otlp.Traces`, which makes the
spans; nothing is timed live inside the engine. The stage spans are laid out from the durations
the engine measured (`engine.Timings`, the answer's `x-*-time` headers): see `stages`.
"""

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import anyio

from api.metrics import StatusSend, route_path
from api.settings import ServerConfig
from engine import Timings

log = logging.getLogger("api")
# the ASGI scope's key of a traced request's `Observed` list (shared by the scopes copied from
# it: `/invocations` answers as another route)
KEY = "scoring.observed"
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for traces
# the stages as spans, in the order a request meets them; a child's stages lie inside it
TOP = ("tokenize", "queue", "batch_build", "device")
CHILDREN = {"batch_build": ("plan", "pack"), "device": ("dispatch",)}


class Observed(NamedTuple):
    """What a handler learnt of the engine's answer (`Service.observe`)."""

    timings: Timings
    end_ns: int  # when the handler got the answer, in ns since the epoch
    attributes: dict[str, str | int]  # the served model, items, prompt tokens


class Stage(NamedTuple):
    name: str
    parent: str | None  # the enclosing stage; None: the request's span
    start_ns: int
    end_ns: int


class Answered(NamedTuple):
    """One traced request, answered: what `api.otlp.Traces.record` makes its spans of."""

    method: str
    route: str
    headers: dict[str, str]  # the request's, lower-case (a `traceparent` among them)
    start_ns: int
    end_ns: int
    status: int
    error: BaseException | None  # what escaped the app (its answer: a 500)
    attributes: dict[str, str | int]  # `Observed.attributes`; none if no engine answered
    stages: list[Stage]  # none if no engine answered


def stages(t: Timings, end_ns: int) -> list[Stage]:
    """The engine's stages of one request as spans, each exactly as long as measured.

    The engine measures durations, not instants, so the spans are laid end to end in the order
    a request meets them (tokenize, queue, batch_build, device), the first starting `total`
    before `end_ns` (when the handler got the answer); what `total` holds beyond them (the hops
    between the engine's actors, gathering the answer) is left at the end. A child starts with
    its parent, its siblings after it: plan and pack inside batch_build, dispatch (the device
    calls' host part) at the start of device. A request carried by several batches counts
    each batch's stages in full, and those overlap in time; then the stages outlast `total`
    and the first starts that much earlier."""
    ns = {name: round(getattr(t, name) * 1e9) for name in (*TOP, "plan", "pack", "dispatch")}
    at = end_ns - max(round(t.total * 1e9), sum(ns[name] for name in TOP))
    laid = []
    for name in TOP:
        laid.append(Stage(name, None, at, at + ns[name]))
        inner = at
        for child in CHILDREN.get(name, ()):
            laid.append(Stage(child, name, inner, inner + ns[child]))
            inner += ns[child]
        at += ns[name]
    return laid


def observed(result, items: int, model: str) -> Observed:
    """A handler's engine `result` (its `timings`, `prompt_tokens`, `cached_tokens`) of
    `items` items from `model`, got now."""
    attributes = {
        "scoring.model": model,
        "scoring.items": items,
        "scoring.prompt_tokens": result.prompt_tokens,
        "scoring.cached_tokens": result.cached_tokens,
    }
    return Observed(result.timings, time.time_ns(), attributes)


class TraceRequests:
    """ASGI middleware, installed only when tracing is on: each request to one of `paths` (the
    engine routes) timed, and handed to `traces()` (an `api.otlp.Traces`, None until the
    lifespan starts it) once its answer is sent."""

    def __init__(self, app, traces: Callable[[], object | None], paths: frozenset[str]):
        self.app = app
        self.traces = traces
        self.paths = paths

    async def __call__(self, scope, receive, send) -> None:
        traces = self.traces()
        if traces is None or scope["type"] != "http" or route_path(scope) not in self.paths:
            return await self.app(scope, receive, send)
        start, error, seen, answer = time.time_ns(), None, [], StatusSend(send)
        try:
            await self.app(scope | {KEY: seen}, receive, answer)
        except BaseException as e:
            error = e
            raise
        finally:
            try:
                last = seen[-1] if seen else None
                traces.record(_answered(scope, start, answer.status, error, last))
            except Exception:  # a trace lost, never an answer
                log.exception("tracing: the spans of a request were not recorded")


def _answered(scope, start_ns: int, status: int, error, seen: Observed | None) -> Answered:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return Answered(
        method=scope["method"],
        route=route_path(scope),
        headers=headers,
        start_ns=start_ns,
        end_ns=time.time_ns(),
        status=status,
        error=error,
        attributes=seen.attributes if seen else {},
        stages=stages(seen.timings, seen.end_ns) if seen else [],
    )


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `otlp_traces_endpoint`: as given, or with `http://` when it
    names no scheme and `/v1/traces` when it names no path (`collector:4318`)."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.path.strip("/"):
        return urlunsplit(parts)
    return urlunsplit(parts._replace(path=TRACES_PATH))


@contextlib.asynccontextmanager
async def exporting(server: ServerConfig) -> AsyncIterator[object | None]:
    """The app's `api.otlp.Traces` while it runs (None when tracing is off), its last spans
    sent when it stops; a clear error when tracing is on but OpenTelemetry is not installed."""
    if not server.otlp_traces_endpoint:
        yield None
        return
    try:
        from api import otlp
    except ImportError as e:
        raise RuntimeError(
            f"SCORING_OTLP_TRACES_ENDPOINT is set but OpenTelemetry is not installed ({e}): "
            "pip install 'llm-scoring-engine[tracing]'"
        ) from None
    traces = otlp.Traces(traces_url(server.otlp_traces_endpoint), server.otlp_service_name)
    try:
        yield traces
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(traces.shutdown)  # flushing may wait on the network
