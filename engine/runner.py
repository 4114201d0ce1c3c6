"""Device-runner actor: owns the device program, runs one batch at a time.

At start it compiles the bucket grid (progress bar; JAX's persistent cache makes a restart fast)
and only then reports started, or, in the background, reports started at once and serves while
the grid compiles. Batches run in a worker thread so the trio loop stays live while the device
works; a batch that fails reports its error and the runner keeps serving.
"""

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import trio
from tqdm import tqdm

from engine.device.program import DeviceProgram
from engine.messages import Batch, BatchDone
from engine.models import PackedInputs

log = logging.getLogger("engine")


@dataclass
class RunnerStats:
    batches: int = 0
    failed: int = 0
    retried: int = 0  # not run: planned against a KV pool lost since
    compiles: int = 0
    busy_s: float = 0.0


def batch_shape(inputs: PackedInputs) -> tuple[int, int, int]:
    return (int(inputs.tokens.shape[0]), *map(int, inputs.label_ids.shape))


class RunnerState:
    """The device program, the shapes compiled so far, and device counters."""

    def __init__(self, program: DeviceProgram, *, block_size: int):
        self.program = program
        self.block_size = block_size
        # (T, S, L) shapes, and (T, S, L, True) those of the token-states program
        self.compiled: set[tuple] = set()
        self.stats = RunnerStats()
        self._counting = threading.Lock()  # a grid compiling in the background counts too

    def warm_up(
        self,
        shapes: list[tuple[int, int, int]],
        *,
        workers: int = 1,
        progress: bool = True,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        """Compile the program of every (T, S, L) shape not compiled yet, without running any,
        `workers` at once; `check` runs in the calling thread before each program starts and may
        raise to stop (a shutdown while compiling): the programs compiling then finish first."""
        bar = tqdm(
            total=len(shapes), desc="compiling", unit="program", disable=not (progress and shapes)
        )
        with bar, ThreadPoolExecutor(workers, thread_name_prefix="compile") as pool:
            running: set[Future] = set()
            for shape in shapes:
                check()
                if len(running) == workers:
                    running = _finish(running, bar, FIRST_COMPLETED)
                running.add(pool.submit(self._compile, shape))
            _finish(running, bar, ALL_COMPLETED)

    def _compile(self, shape: tuple[int, int, int]) -> None:
        if self._count_compile(shape):  # else a batch of that shape compiled it
            self.program.compile(shape, self.block_size)

    def execute(self, batch: Batch) -> BatchDone:
        """Run one batch to completion; any exception becomes the batch's error. A batch that
        reads KV pool pages of a pool lost since it was planned is not run (`retry`)."""
        if batch.pool_generation != self.program.kv.resets and _reads_pool(batch.inputs):
            self.stats.retried += 1
            return BatchDone(id=batch.id, error="the KV pool was lost", retry=True)
        start = time.perf_counter()
        try:
            shape = batch_shape(batch.inputs)
            self._count_compile(self.program.shape_key(shape, batch.output))
            pending = self.program.run(batch.inputs, batch.output)
            dispatched = time.perf_counter()
            outputs = self.program.fetch(pending, batch.output)
        except Exception as e:  # one bad batch must not stop the runner
            self.stats.failed += 1
            reset = self.program.kv.recover()
            return BatchDone(id=batch.id, error=f"{type(e).__name__}: {e}", pool_reset=reset)
        elapsed = time.perf_counter() - start
        self.stats.batches += 1
        self.stats.busy_s += elapsed
        return BatchDone(
            id=batch.id, outputs=outputs, device_s=elapsed, dispatch_s=dispatched - start
        )

    def _count_compile(self, shape: tuple) -> bool:
        """True when `shape` is new: its program is compiled by the caller."""
        with self._counting:
            if shape in self.compiled:
                return False
            self.stats.compiles += 1
            self.compiled.add(shape)
            return True


def _finish(running: set[Future], bar: tqdm, until: str) -> set[Future]:
    """Wait for `until` of the `running` compiles; those still running. A compile's error is
    raised."""
    done, running = wait(running, return_when=until)
    for future in done:
        future.result()
        bar.update()
    return running


def _reads_pool(inputs: PackedInputs) -> bool:
    return inputs.meta.context_pages.shape[0] > 0


async def run(
    state: RunnerState,
    batches: trio.MemoryReceiveChannel,
    done: trio.MemorySendChannel,
    warm_up: list[tuple[int, int, int]],
    *,
    progress: bool = True,
    compiling: trio.CapacityLimiter | None = None,
    compile_workers: int = 1,
    background: bool = False,
    compiled: trio.Event | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Compile the grid, `compile_workers` programs at once (holding `compiling`, which bounds
    the runners that compile at once), report started, then run batches as the scheduler hands
    them over. With `background`, report started at once and serve while the grid compiles: a
    batch whose shape is not compiled yet compiles it first, and the grid skips it; a grid that
    fails to compile is logged, and the runner serves on. `compiled` is set once the grid is
    done."""

    async def compile_grid() -> None:
        check = trio.from_thread.check_cancelled  # a shutdown need not wait for the whole grid
        try:
            await trio.to_thread.run_sync(
                functools.partial(
                    state.warm_up, warm_up, workers=compile_workers, progress=progress, check=check
                ),
                limiter=compiling,
            )
            if background:
                log.info("the bucket grid is compiled (%d programs)", len(warm_up))
        except Exception as e:
            if not background:  # the engine does not start
                raise
            log.warning(
                "the bucket grid stopped compiling (%s: %s); batches compile their own shapes",
                type(e).__name__,
                e,
            )
        if compiled is not None:
            compiled.set()

    if not background:
        await compile_grid()
        task_status.started()
        await _serve(state, batches, done)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(compile_grid)
        task_status.started()
        await _serve(state, batches, done)
        nursery.cancel_scope.cancel()  # no more batches: the rest of the grid is not needed


async def _serve(
    state: RunnerState, batches: trio.MemoryReceiveChannel, done: trio.MemorySendChannel
) -> None:
    async for batch in batches:
        await done.send(await trio.to_thread.run_sync(state.execute, batch))
