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
from api.settings import Settings
from engine import Engine, EngineStats
from engine.plan import kinds_for_this_host, plan_engine

T = TypeVar("T")


@dataclass
class Service:
    """The state of one app: created with it, given its engine host by the lifespan."""

    settings: Settings
    started: float = field(default_factory=time.time)
    host: EngineHost | None = None
    profiling: str | None = None  # the trace directory while the profiler runs
    metrics: Metrics = field(init=False)
    model_name: str = field(init=False)  # resolved once: the default model's name needs a lookup
    _roofline: dict | None = None
    _roofline_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.metrics = Metrics(self.stats)
        self.model_name = self.settings.model_name

    def stats(self) -> EngineStats | None:
        # read from the server's thread under asyncio: counters and lengths only, safe to race
        engine = self.host.engine if self.host else None
        return engine.stats() if engine else None

    def roofline(self, engine: Engine) -> dict:
        """`engine.plan.plan` of the loaded program on this host's device kind and the
        accelerators: computed once (it compiles), in the caller's thread."""
        with self._roofline_lock:
            if self._roofline is None:
                self._roofline = plan_engine(engine, kinds_for_this_host())
            return self._roofline

    def engine(self) -> Engine:
        """The ready engine, or a 503."""
        try:
            if self.host is None:
                raise EngineNotReady("the engine is loading")
            return self.host.ready_engine()
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
        renames: dict[str, str] | None = None,
    ) -> T:
        """`await fn(engine)` where the engine runs; cancelled (499) when the client leaves.

        Engine exceptions become their HTTP answers (400, 503 with Retry-After, 500).
        """
        self.engine()  # 503 before any work while the engine is not ready
        try:
            return await until_disconnected(request, lambda: self.host.call(fn))
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
