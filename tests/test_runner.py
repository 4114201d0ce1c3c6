"""RunnerState: compiling the grid (before serving or in the background), counting compiles,
turning a failing step into an error."""

import functools
import threading

import jax
import numpy as np
import pytest
import trio

from engine import load_model, runner
from engine.device.program import DeviceProgram
from engine.host import packing, planning
from engine.host.buckets import default_buckets
from engine.host.packing import empty_batch
from engine.loaders import load_checkpoint
from engine.messages import Batch
from engine.runner import RunnerState, batch_shape

COMPILE_EVENTS = (
    "/jax/core/compile/backend_compile_duration",  # one per XLA compile
    "/jax/compilation_cache/cache_retrieval_time_sec",  # one per program loaded from the cache
)


@pytest.fixture(scope="module")
def model(tiny_checkpoints):
    return load_model(tiny_checkpoints["qwen2"], dtype="float32")


def test_empty_batch_has_the_shape_asked_for():
    b = empty_batch(128, 16, 4, 64)
    assert batch_shape(b) == (128, 16, 4)
    assert b.meta.block_kv.shape == (2, 2)


def test_warm_up_compiles_each_shape_once(model):
    runner = RunnerState(model.program, block_size=64)
    runner.warm_up([(128, 64, 4), (256, 128, 4)], progress=False)
    assert runner.stats.compiles == 2
    seqs, labels = [[1, 2, 3]], [[5, 6]]
    buckets = default_buckets(512)
    inputs, *_ = packing.pack(seqs, labels, planning.group_by_prefix(seqs), buckets)
    assert batch_shape(inputs) == (128, 64, 4)
    done = runner.execute(Batch(id=7, inputs=inputs, rows=[(0, 0)], real_tokens=3, build_s=0.0))
    assert runner.stats.compiles == 2 and runner.stats.batches == 1
    np.testing.assert_allclose(done.outputs[0, :2], model.row_outputs(seqs, labels)[0], atol=1e-6)


def test_warm_up_skips_a_shape_a_batch_compiled(model, monkeypatch):
    runner = RunnerState(model.program, block_size=64)
    runner.execute(
        Batch(id=1, inputs=empty_batch(128, 4, 4, 64), rows=[], real_tokens=0, build_s=0)
    )
    compiled = []
    monkeypatch.setattr(model.program, "compile", lambda shape, block: compiled.append(shape))
    runner.warm_up([(128, 4, 4), (128, 16, 4)], progress=False)
    assert compiled == [(128, 16, 4)]
    assert runner.stats.compiles == 2 and runner.compiled == {(128, 4, 4), (128, 16, 4)}


class _Recording:
    """A program whose compile records the shapes and how many compile at once; each waits at
    `barrier` (None: none) so that compiles meant to overlap are seen to."""

    def __init__(self, barrier: threading.Barrier | None = None, fail: tuple | None = None):
        self.barrier, self.fail = barrier, fail
        self.shapes, self.now, self.most = [], 0, 0
        self.lock = threading.Lock()

    def compile(self, shape, block_size):
        with self.lock:
            self.shapes.append(shape)
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            if shape == self.fail:
                raise RuntimeError(f"cannot compile {shape}")
        finally:
            with self.lock:
                self.now -= 1


SIX = [(128 * t, 4, 4) for t in range(1, 7)]


def test_warm_up_compiles_workers_programs_at_once():
    program = _Recording(threading.Barrier(3, timeout=120))  # three at once, or it breaks
    runner = RunnerState(program, block_size=64)
    runner.warm_up(SIX, workers=3, progress=False)
    assert sorted(program.shapes) == SIX and program.most == 3
    assert runner.stats.compiles == 6 and runner.compiled == set(SIX)


def test_warm_up_raises_a_compile_error_once_the_others_finish():
    program = _Recording(fail=(256, 4, 4))
    runner = RunnerState(program, block_size=64)
    with pytest.raises(RuntimeError, match=r"cannot compile \(256, 4, 4\)"):
        runner.warm_up(SIX, workers=2, progress=False)
    assert program.now == 0 and (256, 4, 4) in program.shapes


def test_warm_up_stops_starting_programs_when_check_raises():
    program = _Recording()
    started = []

    class ShutDown(Exception):
        pass

    def check():
        if len(started) == 4:
            raise ShutDown
        started.append(1)

    runner = RunnerState(program, block_size=64)
    with pytest.raises(ShutDown):
        runner.warm_up(SIX, workers=2, check=check, progress=False)
    assert sorted(program.shapes) == SIX[:4] and program.now == 0


@pytest.fixture(scope="module")
def pooled(tiny_checkpoints):
    """A program with a KV pool, which each step donates and replaces."""
    checkpoint = load_checkpoint(tiny_checkpoints["qwen2"], progress=False)
    return DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=2**20)


def test_a_precompiled_shape_runs_without_compiling_again(pooled):
    """The grid's programs are compiled for the pool's shapes and placement (`KVPool.spec`), not
    its arrays, which a running step may hold: the step's own call must find them compiled."""
    compiles = []  # XLA compiles, and loads from the persistent cache when one is on
    listen = lambda event, seconds, **kw: (
        compiles.append(event) if event in COMPILE_EVENTS else None
    )
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        runner = RunnerState(pooled, block_size=64)
        runner.warm_up([(256, 12, 4)], progress=False)  # a shape no other test compiles
        assert compiles
        before = len(compiles)
        inputs = empty_batch(256, 12, 4, 64)
        runner.execute(Batch(id=1, inputs=inputs, rows=[], real_tokens=0, build_s=0.0))
        assert len(compiles) == before and runner.stats.batches == 1
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_a_raising_step_becomes_the_batch_error(model, monkeypatch):
    runner = RunnerState(model.program, block_size=64)
    monkeypatch.setattr(model.program, "run", lambda inputs, output: 1 / 0)
    done = runner.execute(
        Batch(id=1, inputs=empty_batch(128, 4, 4, 64), rows=[], real_tokens=0, build_s=0.0)
    )
    assert done.error == "ZeroDivisionError: division by zero" and done.outputs is None
    assert runner.stats.failed == 1


class _Compiling:
    """A runner state whose warm-up counts the runners compiling at once, and blocks until
    `gate` is set so that overlapping warm-ups are seen."""

    def __init__(self, record: dict, gate: threading.Event):
        self.record, self.gate = record, gate

    def warm_up(self, shapes, *, workers, progress, check):
        self.record["now"] += 1
        self.record["most"] = max(self.record["most"], self.record["now"])
        self.gate.wait(60)
        self.record["now"] -= 1


@pytest.mark.parametrize("limit", [1, 3])
def test_runners_compile_no_more_at_once_than_their_limiter_allows(limit):
    """Runners sharing the host's memory compile one at a time (eight at once took 18 GiB)."""
    record, gate = {"now": 0, "most": 0}, threading.Event()

    async def main():
        compiling = trio.CapacityLimiter(limit)
        done, _ = trio.open_memory_channel(0)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                closed, batches = trio.open_memory_channel(0)
                closed.close()  # no batches: each runner ends once compiled
                run = functools.partial(runner.run, compiling=compiling, progress=False)
                args = (_Compiling(record, gate), batches, done, [])
                nursery.start_soon(functools.partial(nursery.start, run, *args))
            with trio.fail_after(120):  # a generous bound on states polled, not a timing
                while compiling.statistics().tasks_waiting < 3 - limit:  # the rest queue behind
                    await trio.sleep(0.01)
                while record["now"] < limit:
                    await trio.sleep(0.01)
            gate.set()

    trio.run(main)
    assert record["most"] == limit


class _Gated:
    """A runner state whose grid compiles until `gate` is set (or the runner is cancelled), and
    whose batches run at once."""

    def __init__(self, gate: threading.Event):
        self.gate, self.grids = gate, []

    def warm_up(self, shapes, *, workers, progress, check):
        while not self.gate.wait(0.01):  # polled so that a cancelled runner stops compiling
            check()
        if shapes == ["fails"]:
            raise RuntimeError("out of memory")
        self.grids.append(shapes)

    def execute(self, batch):
        return f"done {batch}"


def _run_gated(state, grid, body):
    """`runner.run` of `state` in the background mode; `body(send, receive, compiled)` drives
    it once started, and closes `send` to end it."""

    async def main():
        to_runner, batches = trio.open_memory_channel(1)
        to_scheduler, done = trio.open_memory_channel(1)
        compiled = trio.Event()
        run = functools.partial(runner.run, progress=False, background=True, compiled=compiled)
        async with trio.open_nursery() as nursery:
            await nursery.start(run, state, batches, to_scheduler, grid)
            await body(to_runner, done, compiled)

    trio.run(main)


def test_a_background_grid_serves_batches_while_it_compiles():
    gate = threading.Event()
    state = _Gated(gate)

    async def body(send, receive, compiled):
        await send.send("a")  # started, and serving, with the grid still compiling
        assert await receive.receive() == "done a"
        assert not compiled.is_set()
        gate.set()
        await compiled.wait()
        await send.send("b")
        assert await receive.receive() == "done b"
        await send.aclose()

    _run_gated(state, [(128, 4, 4)], body)
    assert state.grids == [[(128, 4, 4)]]


def test_a_background_grid_stops_when_the_runner_ends():
    state = _Gated(threading.Event())  # never opened: the grid would compile forever

    async def body(send, receive, compiled):
        await send.aclose()

    _run_gated(state, [(128, 4, 4)], body)
    assert state.grids == []  # cancelled, not finished


def test_a_background_grid_that_fails_leaves_the_runner_serving(caplog):
    gate = threading.Event()
    gate.set()

    async def body(send, receive, compiled):
        await compiled.wait()
        await send.send("a")
        assert await receive.receive() == "done a"
        await send.aclose()

    _run_gated(_Gated(gate), ["fails"], body)
    assert "the bucket grid stopped compiling (RuntimeError: out of memory)" in caplog.text
