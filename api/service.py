"""What every route needs: settings, the engine host, metrics, and the per-request plumbing
(authorisation, a size-limited body, decoding, and engine calls that end when the client leaves).
"""

import hmac
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import msgspec
import outcome
from starlette.requests import ClientDisconnect, Request

from api.bridge import EngineHost, EngineNotReady
from api.errors import CLIENT_CLOSED, ApiError, decode_error, engine_error
from api.metrics import Metrics
from api.served import ServedModel
from api.settings import Settings
from api.tracing import KEY as OBSERVED
from api.tracing import observed
from engine import Engine, EngineStats
from engine.capabilities import Ability
from engine.plan import kinds_for_this_host, plan_engine

T = TypeVar("T")


@dataclass
class Service:
    """The state of one app: created with it, given its engine hosts by the lifespan."""

    settings: Settings
    started: float = field(default_factory=time.time)
    hosts: dict[str, EngineHost] = field(default_factory=dict)  # by served name, in order
    profiling: str | None = None  # the trace directory while the profiler runs
    traces: object | None = None  # `api.otlp.Traces` while tracing is on (`api.tracing`)
    # what each scoring and embedding route asks of a model (`routes.ENDPOINTS`' `needs`): how a
    # request without a `model` field finds its model among several
    needs: dict[str, tuple[Ability, ...]] = field(default_factory=dict)
    models: tuple[ServedModel, ...] = field(init=False)
    metrics: Metrics = field(init=False)
    model_name: str = field(init=False)  # the first model's name (the only one's, usually)
    _roofline: dict | None = None
    _roofline_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.models = self.settings.models
        self.metrics = Metrics(self.engine_stats)
        self.model_name = self.models[0].name

    @property
    def host(self) -> EngineHost | None:
        """The first model's engine host (None until the lifespan starts it)."""
        return self.hosts.get(self.model_name)

    def stats(self) -> EngineStats | None:
        """The first model's engine's counters (None while it loads)."""
        engine = self.host.engine if self.host else None
        return engine.stats() if engine else None

    def engine_stats(self) -> list[tuple[str, EngineStats]]:
        """(served name, counters) of each ready engine, in order."""
        # read from the server's thread under asyncio: counters and lengths only, safe to race
        hosts = [(name, host.engine) for name, host in self.hosts.items()]
        return [(name, engine.stats()) for name, engine in hosts if engine is not None]

    def observe(self, request: Request, result, items: int, model: str) -> None:
        """Record an engine's answer to `request` (a result with `timings` and `prompt_tokens`)
        of `items` items from `model`: in the metrics of its route (`/invocations` hands each
        body on as sent to the route that answers it), and for its trace when tracing is on."""
        self.metrics.observe(request.url.path, result.timings, items)
        traced = request.scope.get(OBSERVED)  # a list where the request is traced
        if traced is not None:
            traced.append(observed(result, items, model))

    def roofline(self, engine: Engine) -> dict:
        """`engine.plan.plan` of the loaded program on this host's device kind and the
        accelerators: computed once (it compiles), in the caller's thread."""
        with self._roofline_lock:
            if self._roofline is None:
                self._roofline = plan_engine(engine, kinds_for_this_host())
            return self._roofline

    def route(self, request: Request, model: str | None = None) -> str:
        """The name of the model that answers `request`, whose body's `model` field says
        `model`: the only model whatever it says; of several, the one it names (404 for a name
        not served), or without one of the models whose ready engine offers what the route does
        (`needs`) the first that is its default (`ServedModel.default_for`), else the first of
        them, else the first model (which refuses, or is loading)."""
        if len(self.models) == 1:
            return self.model_name
        if model is not None:
            if not any(m.name == model for m in self.models):
                served = ", ".join(m.name for m in self.models)
                message = f"model: the model `{model}` does not exist; served here: {served}"
                raise ApiError(404, message, param="model")
            return model
        return self.default_model(request.url.path)

    def default_model(self, path: str) -> str:
        """The model that answers a request naming none at route `path` (`route`)."""
        needs = self.needs.get(path, ())
        ready = [(m, h.engine) for m in self.models if (h := self.hosts.get(m.name)) and h.engine]
        offering = [m for m, e in ready if any(map(e.capabilities.offers, needs))]
        for m in offering:
            if any(n.value in m.default_for for n in needs):
                return m.name
        return offering[0].name if offering else self.model_name

    def engine(self, name: str | None = None) -> Engine:
        """The ready engine of model `name` (None: the first), or a 503."""
        host = self.hosts.get(name or self.model_name)
        try:
            if host is None:
                raise EngineNotReady("the engine is loading")
            return host.ready_engine()
        except EngineNotReady as e:
            raise self._unavailable(e) from None

    def authorize(self, request: Request) -> None:
        """401 unless the request carries `Authorization: Bearer <api key>` (when one is set)."""
        key = self.settings.server.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise ApiError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def decode(self, request: Request, decoder: msgspec.json.Decoder, *, empty=None):
        """The body decoded by `decoder` (`empty` for an empty body, when given); 400 or 413."""
        body = await self.body(request)
        if not body.strip() and empty is not None:
            return empty
        return self.parse(body, decoder)

    @staticmethod
    def parse(body: bytes, decoder: msgspec.json.Decoder):
        """`body` decoded by `decoder`; a 400 naming the field when it does not fit."""
        try:
            return decoder.decode(body)
        except (msgspec.MsgspecError, UnicodeDecodeError) as e:
            raise decode_error(e) from None

    async def body(self, request: Request) -> bytes:
        """The request's body, read whole up to the size limit (413 past it)."""
        return await read_body(request, self.settings.server.max_body_bytes)

    async def call(
        self,
        request: Request,
        fn: Callable[[Engine], Awaitable[T]],
        *,
        model: str | None = None,
        renames: dict[str, str] | None = None,
    ) -> T:
        """`await fn(engine)` where the engine of model `model` (a `route`'s answer; None: the
        first) runs; cancelled (499) when the client leaves. Counted by model and status
        (`Metrics.answering`).

        Engine exceptions become their HTTP answers (400, 503 with Retry-After, 500).
        """
        with self.metrics.answering(model or self.model_name):
            return await self._call(request, fn, model, renames)

    async def _call(self, request, fn, model: str | None, renames: dict[str, str] | None):
        self.engine(model)  # 503 before any work while the engine is not ready
        host = self.hosts[model or self.model_name]
        try:
            return await until_disconnected(request, lambda: host.call(fn))
        except EngineNotReady as e:
            raise self._unavailable(e) from None
        except ApiError:
            raise
        except Exception as e:
            raise engine_error(
                e, retry_after_s=self.settings.server.retry_after_s, renames=renames
            ) from None

    def _unavailable(self, error: Exception) -> ApiError:
        return ApiError(
            503, str(error), headers={"Retry-After": str(self.settings.server.retry_after_s)}
        )


async def until_disconnected(request: Request, call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`, cancelled if the client disconnects first (then ApiError 499).

    The body has been read, so the next ASGI message can only be the disconnect.
    """
    result: outcome.Outcome | None = None
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        try:
            result = outcome.Value(await call())
        except Exception as e:
            result = outcome.Error(e)
        tasks.cancel_scope.cancel()
    if result is None:
        raise ApiError(CLIENT_CLOSED, "client closed the request")
    return result.unwrap()


async def read_body(request: Request, limit: int) -> bytes:
    """`request`'s body, read whole up to `limit` bytes (ApiError 413 past it, 499 when the
    client leaves)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(CLIENT_CLOSED, "client closed the request") from None
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> ApiError:
    # the rest of the body is never read, so the connection cannot carry another request
    message = f"request body of {size} bytes exceeds the limit of {limit} bytes"
    return ApiError(413, message, headers={"Connection": "close"})
