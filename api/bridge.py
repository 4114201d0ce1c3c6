"""Where the engine runs for the HTTP layer: in the server's loop under trio, in its own trio
thread under asyncio.

`host_engine(config)` yields an `EngineHost` at once and loads the engine in the background, so
`/health` can answer 503 while the model loads and compiles. `await host.call(fn)` runs
`await fn(engine)` where the engine lives; cancelling the caller cancels that call there, so the
engine drops the call's queued work.
"""

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
import outcome
import sniffio
import trio

from engine import Engine, EngineClosed, EngineConfig, open_engine

T = TypeVar("T")
log = logging.getLogger("api")


class EngineNotReady(RuntimeError):
    """The engine is still loading, failed to start, or has shut down."""


class EngineHost:
    """The engine of a running service (None until loaded) and how to call it.

    This class runs the engine in the current trio loop; `ThreadedEngineHost` in a thread.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self.engine: Engine | None = None
        self.error: str | None = None  # why the engine failed to start or stopped
        self.settled = threading.Event()  # set once the engine is ready or has failed to start
        self._calls: trio.Nursery | None = None

    @property
    def status(self) -> str:
        """ "ready", "loading" or "failed"."""
        if self.engine is not None:
            return "ready"
        return "loading" if self.error is None else "failed"

    def ready_engine(self) -> Engine:
        """The engine; EngineNotReady while there is none."""
        engine = self.engine
        if engine is None:
            reason = "is loading" if self.error is None else f"is not running: {self.error}"
            raise EngineNotReady(f"the engine {reason}")
        return engine

    async def call(self, fn: Callable[[Engine], Awaitable[T]]) -> T:
        """`await fn(engine)`, in the engine's loop."""
        return await fn(self.ready_engine())

    async def serve(self) -> None:
        """Open the engine, publish it, keep it open until cancelled (runs in a trio loop)."""
        start = time.perf_counter()
        log.info("loading %s (%s)", self.config.model or "the default model", self.config.dtype)
        try:
            async with open_engine(self.config) as engine, trio.open_nursery() as calls:
                log.info(
                    "engine ready in %.1f s (%d programs compiled)",
                    time.perf_counter() - start,
                    engine.stats().compiles,
                )
                self._calls = calls
                self.engine = engine  # last: other threads take a set engine as ready
                self.settled.set()
                try:
                    await trio.sleep_forever()
                finally:
                    self.engine = None
                    log.info("engine shutting down")
        except Exception as e:  # a failed load must leave /health answering, not kill the server
            self.error = _reason(e)
            log.error("engine stopped: %s", self.error, exc_info=e)
        finally:
            self.settled.set()


class ThreadedEngineHost(EngineHost):
    """Runs the engine under `trio.run` in a thread; `call` works from an asyncio loop."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="engine")
        self._thread.daemon = True  # a hung device step must not keep the process alive
        self._started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None

    async def _main(self) -> None:
        with trio.CancelScope() as scope:
            self._token, self._scope = trio.lowlevel.current_trio_token(), scope
            self._started.set()
            await self.serve()

    async def start(self) -> None:
        self._thread.start()
        await anyio.to_thread.run_sync(self._started.wait)

    async def stop(self) -> None:
        self._soon(self._scope.cancel)
        await anyio.to_thread.run_sync(self._thread.join)

    def _soon(self, fn, *args) -> bool:
        try:
            self._token.run_sync_soon(fn, *args)
            return True
        except trio.RunFinishedError:
            return False

    async def call(self, fn: Callable[[Engine], Awaitable[T]]) -> T:
        engine = self.ready_engine()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[outcome.Outcome] = loop.create_future()
        scope = trio.CancelScope()
        if not self._soon(self._spawn, fn, engine, scope, loop, future):
            raise EngineClosed("engine shut down")
        try:
            result = await future
        except asyncio.CancelledError:
            self._soon(scope.cancel)
            raise
        return result.unwrap()

    def _spawn(self, fn, engine, scope, loop, future) -> None:
        # runs as a trio run_sync_soon callback, where an exception would crash the whole run
        try:
            self._calls.start_soon(_run_call, fn, engine, scope, loop, future)
        except RuntimeError:  # the nursery closed: the engine is shutting down
            _settle(loop, future, outcome.Error(EngineClosed("engine shut down")))


def _reason(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]  # the engine's nursery wraps what failed inside it
    return f"{type(error).__name__}: {error}"


async def _run_call(fn, engine, scope: trio.CancelScope, loop, future) -> None:
    """Trio side of `ThreadedEngineHost.call`; always settles the asyncio future."""
    result = outcome.Error(EngineClosed("engine shut down"))
    try:
        with scope:
            try:
                result = outcome.Value(await fn(engine))
            except Exception as e:
                result = outcome.Error(e)
    finally:
        _settle(loop, future, result)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result) -> None:
    def settle() -> None:
        if not future.done():  # done: the caller was cancelled meanwhile
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the server's loop is closed: nobody waits
        loop.call_soon_threadsafe(settle)


@asynccontextmanager
async def host_engine(config: EngineConfig) -> AsyncIterator[EngineHost]:
    """An `EngineHost` for the running async library, loading in the background; stopped on exit.

    Under trio the engine shares the caller's loop; under asyncio it gets a trio thread.
    """
    if sniffio.current_async_library() == "trio":
        host = EngineHost(config)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.serve)
            try:
                yield host
            finally:
                nursery.cancel_scope.cancel()
    else:
        host = ThreadedEngineHost(config)
        await host.start()
        try:
            yield host
        finally:
            await host.stop()
