"""An engine in a trio loop of its own thread, called from plain synchronous code: what the
synchronous front door (`engine.offline`) runs on.

A call is handed to the engine's loop through its token and waited for on a queue, not with
`trio.from_thread`, which refuses a caller that runs a trio loop of its own (a blocking call
inside async code stalls that loop, as any blocking call does, but works).
"""

import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import outcome
import trio

from engine.config import EngineConfig
from engine.engine import Engine, open_engine
from engine.errors import EngineClosed

T = TypeVar("T")


class EngineThread:
    """`open_engine(config)` in a daemon thread, open once the constructor returns (which raises
    what opening it raised); `call` and `call_sync` run work in its loop; `close` shuts it down."""

    def __init__(self, config: EngineConfig):
        self.engine: Engine | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._calls: trio.Nursery | None = None
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, config), name="engine", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, config: EngineConfig) -> None:
        try:
            async with open_engine(config) as engine, trio.open_nursery() as calls:
                self._token, self._calls = trio.lowlevel.current_trio_token(), calls
                self.engine = engine
                self._ready.set()
                await trio.sleep_forever()  # until `close` cancels the calls' nursery
        except BaseException as e:  # handed to the thread that opened it
            if self.engine is not None:
                raise
            self._error = e
        finally:
            self.engine = None
            self._ready.set()

    def call(self, fn: Callable[..., Awaitable[T]], *args, **kwargs) -> T:
        """`await fn(*args, **kwargs)` in the engine's loop; its result, or its error raised."""
        answer: queue.SimpleQueue = queue.SimpleQueue()

        async def run() -> None:
            try:
                answer.put(outcome.Value(await fn(*args, **kwargs)))
            except trio.Cancelled:  # the engine is closing
                answer.put(outcome.Error(EngineClosed("engine shut down")))
                raise
            except BaseException as e:  # the caller's to handle
                answer.put(outcome.Error(e))

        def start() -> None:
            try:
                self._calls.start_soon(run)
            except RuntimeError:  # the calls' nursery closed meanwhile
                answer.put(outcome.Error(EngineClosed("engine shut down")))

        self._soon(start)
        return self._wait(answer)

    def call_sync(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`fn(*args, **kwargs)` in the engine's loop (state only its thread may touch)."""
        answer: queue.SimpleQueue = queue.SimpleQueue()
        self._soon(lambda: answer.put(outcome.capture(fn, *args, **kwargs)))
        return self._wait(answer)

    def _wait(self, answer: queue.SimpleQueue):
        """The call's result, or EngineClosed if the engine's thread ends without answering."""
        while True:
            try:
                return answer.get(timeout=1.0).unwrap()
            except queue.Empty:
                if not self._thread.is_alive():
                    raise EngineClosed("engine shut down") from None

    def _soon(self, fn: Callable[[], object]) -> None:
        if self.engine is None:
            raise RuntimeError("the model is closed")
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            raise RuntimeError("the model is closed") from None

    def close(self) -> None:
        """Shut the engine down and wait for its thread (callers still waiting get
        EngineClosed); nothing happens the second time."""
        if self.engine is not None:
            with contextlib.suppress(trio.RunFinishedError):  # it stopped meanwhile
                self._token.run_sync_soon(self._calls.cancel_scope.cancel)
        self._thread.join()
