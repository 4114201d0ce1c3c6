"""The host's share of a request: W1, W2 and W3-like traffic through the real engine with a
device program that computes nothing, so that every microsecond measured is the host's.

    python -m bench host [--model PATH | --shape qwen3-0.6b] [--repeats 5] [--profile]

The null program (`NullProgram`) is a compiled program that takes the whole batch, as a real
step does (every array passed in through the same call path, none pruned), and answers zeros of
the batch's output shape. Each workload runs once
untimed, then `--repeats` times with the KV cache flushed before each pass; the best pass is
reported with the engine's per-stage split of it (`Timings`, as `/metrics` and the `x-*-time`
headers give it): tokenisation and validation, the wait in the queue, the plan (prefix grouping,
radix match, splitting into batches), packing (layout, attention metadata, page tables), the
device call's dispatch (here: the transfer in) and its wait for the outputs, and the rest (actor
hops, gathering outputs, answers).
W3-like: `--clients` requests of a 15-40-token query and 1-8 items of 10-40 tokens at once.
`--profile` also prints where the main thread's time goes (cProfile, by cumulative time): the
scheduler and the answers run there; tokenisation and device calls run in worker threads.
"""

import cProfile
import io
import pstats
import time
from functools import partial
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import trio

from bench import common, sides
from bench.parity import label_ids
from bench.w1 import build as w1_request
from bench.w2 import make_request as w2_request
from bench.w3 import request_pool
from engine import open_engine
from engine.kinds import Output
from engine.messages import Timings
from engine.runner import batch_shape

QUICK = dict(docs=8, prompt_tokens=100, shared_tokens=20, items=8, clients=4, repeats=1, gemm=[256])
# the request's wall time in parts: `Timings` less the sums (batch_build = plan + pack, device =
# dispatch + wait), then the rest
STAGES = ("tokenize", "queue", "plan", "pack", "dispatch", "wait")


class NullProgram:
    """A device program that computes nothing: `run` dispatches a compiled program of the whole
    batch that answers zeros f32[S, L] (token states: f32[T, E]). Everything else is the wrapped
    program's."""

    def __init__(self, program):
        self.program = program

    def __getattr__(self, name):
        return getattr(self.program, name)

    def compile(self, shape, block_size: int) -> None:
        pass

    def run(self, inputs, output: Output | None = None) -> jax.Array:
        per_token = output is not None and output.per_token
        return _nothing(inputs, self.program.config.hidden_size if per_token else None)


@partial(jax.jit, static_argnums=1, keep_unused=True)  # every input goes in, as in a real step
def _nothing(inputs, hidden: int | None) -> jax.Array:
    """Zeros of the batch's output shape: f32[S, L], or f32[T, E] for token states."""
    tokens, rows, labels = batch_shape(inputs)
    return jnp.zeros((rows, labels) if hidden is None else (tokens, hidden), jnp.float32)


def split(timings: Timings) -> dict[str, float]:
    """Microseconds per stage of one request, the rest of its total (hops, answers) last."""
    parts = msgspec.structs.asdict(timings) | {"wait": timings.device - timings.dispatch}
    stages = {name: parts[name] * 1e6 for name in STAGES}
    stages["rest"] = timings.total * 1e6 - sum(stages.values())
    return stages


async def _timed(engine, calls, repeats: int) -> dict:
    """The best of `repeats` passes of the concurrent `calls` (each `engine -> result`)."""
    passes = []
    for i in range(repeats + 1):  # the first pass is the untimed warm-up
        engine.flush_cache()
        results = [None] * len(calls)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for j, call in enumerate(calls):
                nursery.start_soon(_store, results, j, call, engine)
        if i:
            passes.append((time.perf_counter() - start, results))
    wall, results = min(passes, key=lambda p: p[0])
    tokens = sum(r.prompt_tokens for r in results)
    per_request = [split(r.timings) for r in results]
    stages = {k: float(np.mean([s[k] for s in per_request])) for k in per_request[0]}
    return {
        "requests": len(calls),
        "tokens": tokens,
        "wall_us": wall * 1e6,
        "us_per_request": wall * 1e6 / len(calls),
        "us_per_token": wall * 1e6 / tokens,
        "stages_us": stages,
    }


async def _store(results, i, call, engine) -> None:
    results[i] = await call(engine)


def workloads(args, tokenizer) -> dict[str, list]:
    """Each workload's calls, `engine -> awaitable result`."""
    labels = label_ids(tokenizer)
    w1 = w1_request(args, SimpleNamespace(tokenizer=tokenizer))
    prompt, items = w2_request(tokenizer, args)
    bodies = request_pool(tokenizer, labels, args.clients, args.seed)
    w3 = [partial(_score, b["query"], b["items"], labels) for b in bodies]
    return {
        "w1": [partial(_score, *w1)],
        "w2": [partial(_score, prompt, items, labels)],
        "w3": w3,
    }


def _score(query, items, labels, engine):
    return engine.score(query, items, labels)


async def run(args, path) -> dict:
    config = sides.engine_config(args, path)
    config = msgspec.structs.replace(config, native_tokenizer=not args.reference_tokenizer)
    async with open_engine(config) as engine:
        for state in engine.runners:
            state.program = NullProgram(state.program)
        profile = cProfile.Profile() if args.profile else None
        out = {}
        for name, calls in workloads(args, engine.tokenizer).items():
            if profile:
                profile.enable()
            out[name] = await _timed(engine, calls, args.repeats)
            if profile:
                profile.disable()
        if profile:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
            out["profile"] = text.getvalue()
        return out


def table(results: dict) -> str:
    head = f"{'workload':<9}{'requests':>9}{'tokens':>8}{'us/request':>12}{'us/token':>10}"
    head += "".join(f"{s:>13}" for s in (*STAGES, "rest"))
    lines = [head]
    for name in ("w1", "w2", "w3"):
        r = results[name]
        row = f"{name:<9}{r['requests']:>9}{r['tokens']:>8}{r['us_per_request']:>12.0f}"
        row += f"{r['us_per_token']:>10.2f}"
        row += "".join(f"{r['stages_us'][s]:>13.0f}" for s in (*STAGES, "rest"))
        lines.append(row)
    return "\n".join(lines)


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    common.w1_w2_options(p, [1])
    p.add_argument("--clients", type=int, default=64, help="W3-like requests at once")
    p.set_defaults(repeats=5)
    p.add_argument("--profile", action="store_true", help="cProfile of the main thread")
    p.add_argument(
        "--reference-tokenizer",
        action="store_true",
        help="encode texts with `tokenizers` alone (EngineConfig.native_tokenizer=False)",
    )
    args = common.parse_args(p, argv, QUICK)
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    path = common.model_path(args)
    results = trio.run(run, args, path)
    print(table(results))
    if "profile" in results:
        print(results["profile"])
    json_path, _ = common.output_paths(args, "host", "null-device")
    common.write_report({"workload": "host", "dtype": args.dtype, **results}, json_path)
    print(f"-> {json_path}")
    return results


if __name__ == "__main__":
    main()
