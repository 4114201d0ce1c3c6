"""Run by `tests/test_placement.py` in a subprocess whose XLA_FLAGS give the CPU 8 host devices:
scores the same requests from many concurrent clients with each data x tensor layout, with and
without the KV cache, and prints one JSON line per run. With several runners, the first batch
is held on its device until another runner has taken a batch: a spread the scheduler must make,
not one the machine's timing happens to allow.

    python -m tests.multi_device MODEL_DIR [--fault | --heads]

`--heads`: one runner on one device and on a mesh of two, the native attention kernel forced,
each with the number of heads the kernel computes on a device and the collectives that gather
them (a model whose head dim that kernel runs); then the error that refuses the Mosaic GPU
form's interpreter on the mesh.
"""

import json
import re
import sys
import threading

import jax
import trio

from engine import EngineConfig, EngineError, open_engine
from engine.errors import InvalidInput
from engine.host.packing import empty_batch
from tests.conftest import inject_faults

LAYOUTS = [(1, 1), (8, 1), (4, 2), (2, 4), (1, 8)]
CLIENTS = 24


def requests() -> list[tuple[list[int], list[list[int]]]]:
    """Requests of token ids: some sharing a long prompt, some not, of varied lengths."""
    shared = [(7 * i) % 300 + 3 for i in range(90)]
    out = []
    for c in range(CLIENTS):
        prompt = shared + [c + 3] if c % 2 else [(c * 13 + i) % 300 + 3 for i in range(20 + c)]
        items = [[(c + i * 5 + j) % 300 + 3 for j in range(4 + (c + i) % 9)] for i in range(3)]
        out.append((prompt, items))
    return out


def config(model: str, data: int, tensor: int, cache: bool, **options) -> EngineConfig:
    fields = dict(
        model=model,
        dtype="float32",
        token_budget=256,
        data_parallel=data,
        tensor_parallel=tensor,
        kv_cache_bytes=None if cache else 0,
        prefix_cache=cache,
        precompile=False,
        progress=False,
        compile_cache_dir=None,
        batch_linger_ms=0,
    )
    return EngineConfig(**(fields | options))


async def score_all(engine, fault_runner: int | None = None) -> list:
    results: list = [None] * CLIENTS
    if fault_runner is not None:
        faulty = inject_faults_at(engine, fault_runner)

    async def client(i: int, prompt, items) -> None:
        try:
            r = await engine.score(prompt, items, [1, 2])
            results[i] = r.scores
        except EngineError as e:
            results[i] = f"error: {e}"

    async with trio.open_nursery() as nursery:
        for i, (prompt, items) in enumerate(requests()):
            nursery.start_soon(client, i, prompt, items)
    if fault_runner is not None:
        assert faulty.calls >= 1
    return results


class _Once:
    """A fault that fails the first batch it sees that scores items (label 1 in its rows; a
    batch that only computes a shared prefix answers no request). Runners call it from their own
    threads at once: the lock makes "first" one batch."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = 0
        self.failed = False

    def __call__(self, inputs) -> None:
        with self.lock:
            self.calls += 1
            fail = not self.failed and bool((inputs.label_ids == 1).any())
            self.failed |= fail
        if fail:
            raise RuntimeError("injected device fault")


class _HoldFirst:
    """Holds the first batch any runner gets until another runner gets one (at most 120 s:
    then it goes on, and the runners' batch counts show the spread that did not happen)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.first: int | None = None
        self.spread = threading.Event()

    def at(self, runner: int):
        return lambda inputs: self(runner)

    def __call__(self, runner: int) -> None:
        with self.lock:
            if self.first is None:
                self.first = runner
        if runner == self.first:
            self.spread.wait(120)
        else:
            self.spread.set()


def _wrap(engine, runner: int, fault) -> None:
    saved = engine.runners[0]
    try:
        engine.runners[0] = engine.runners[runner]  # inject_faults wraps the first runner's
        inject_faults(engine, fault)
    finally:
        engine.runners[0] = saved


def hold_until_spread(engine) -> None:
    hold = _HoldFirst()
    for i in range(len(engine.runners)):
        _wrap(engine, i, hold.at(i))


def inject_faults_at(engine, runner: int) -> _Once:
    """One fault shared by every runner, `runner`'s first: it fails the first batch that scores
    items, whichever runner is handed it (a runner handed only prefix pieces fails none, so a
    fault in one runner alone left the test to the scheduling)."""
    fault = _Once()
    for i in [runner] + [i for i in range(len(engine.runners)) if i != runner]:
        _wrap(engine, i, fault)
    return fault


async def main(model: str, fault: bool) -> None:
    assert len(jax.devices()) == 8, jax.devices()
    layouts = [(4, 2)] if fault else LAYOUTS
    for cache in [True] if fault else [True, False]:
        for data, tensor in layouts:
            async with open_engine(config(model, data, tensor, cache)) as engine:
                if data > 1 and not fault:
                    hold_until_spread(engine)
                scores = await score_all(engine, fault_runner=1 if fault else None)
                stats = engine.stats()
            line = {
                "data": data,
                "tensor": tensor,
                "cache": cache,
                "scores": scores,
                "runner_batches": stats.runner_batches,
                "failed_batches": stats.failed_batches,
                "hit_tokens": stats.prefix_cache_hit_tokens,
            }
            print(json.dumps(line), flush=True)


def attention_on_a_device(program) -> tuple[int, int]:
    """The heads the attention kernel's call computes on one device in `program`'s compiled
    forward (T = 256), and the all-gathers in that forward."""
    batch = empty_batch(256, 4, 2, 64, program.config.window)
    text = program._forward.lower(program.params, batch, program.kv.spec).compile().as_text()
    calls = re.findall(r"= f32\[256,(\d+),\d+\]\S* custom-call\(.*packed_attention", text)
    return int(calls[0]), len(re.findall(r" all-gather(?:-start)?\(", text))


async def heads(model: str) -> None:
    for tensor in (1, 2):
        async with open_engine(config(model, 1, tensor, True, attention="cpu")) as engine:
            scores = await score_all(engine)
            computed, gathers = attention_on_a_device(engine.programs[0])
        line = {"tensor": tensor, "scores": scores, "heads": computed, "all_gathers": gathers}
        print(json.dumps(line), flush=True)
    mosaic = config(model, 1, 2, True, attention="mosaic", dtype="bfloat16")
    try:
        async with open_engine(mosaic):
            pass
    except InvalidInput as e:
        print(json.dumps({"mosaic_on_a_mesh": e.field, "detail": e.detail}), flush=True)


if __name__ == "__main__":
    if "--heads" in sys.argv:
        trio.run(heads, sys.argv[1])
    else:
        trio.run(main, sys.argv[1], "--fault" in sys.argv)
