"""Start-up: how long until the engine serves, and until its bucket grid is compiled, with the
grid compiled before serving and in the background (`EngineConfig.precompile_in_background`).

    python -m bench startup [--shape qwen3-0.6b] [--modes before background] [--token-budget N]
                            [--compile-workers N]

Each mode opens a fresh engine with no compile cache (every program compiled, none loaded from an
earlier start) and measures: seconds until it serves (load, then what is compiled before
serving), one W3-like request right after (in the background mode it compiles its own program
while the grid compiles), seconds until the whole grid is compiled, and the same request again
once it is (the KV cache flushed first, so that it runs the same shape). Prints one line per
mode; writes the JSON report.
"""

import time

import msgspec
import trio

from bench import common, sides
from bench.parity import label_ids
from bench.w3 import request_pool
from engine import open_engine

QUICK = dict(token_budget=512)
MODES = {"before": False, "background": True}


def parse(argv):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument(
        "--compile-workers",
        type=int,
        default=1,
        help="programs compiled at once (EngineConfig.compile_workers; %(default)s)",
    )
    return common.parse_args(p, argv, QUICK)


async def start_once(config, args) -> tuple[dict, object]:
    """One engine's start-up in `config`'s mode, and the model's config."""
    start = time.perf_counter()
    async with open_engine(config) as engine:
        ready_s = time.perf_counter() - start
        body = request_pool(engine.tokenizer, label_ids(engine.tokenizer), 1, args.seed)[0]
        request = (body["query"], body["items"], body["label_token_ids"])
        first_s = await _timed(engine, request)
        # shown before the grid is done, which can take minutes on a GPU
        print(f"ready {ready_s:.1f} s, first request {first_s * 1e3:.0f} ms", flush=True)
        grid = len(engine.buckets.grid(config.token_budget))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_show_compiles, engine, grid, start)
            await engine.grid_compiled()
            nursery.cancel_scope.cancel()
        grid_s = time.perf_counter() - start
        engine.flush_cache()
        numbers = {
            "ready_s": ready_s,
            "first_request_s": first_s,
            "grid_compiled_s": grid_s,
            "programs": engine.stats().compiles,
            "grid_programs": grid,
            "warm_request_s": await _timed(engine, request),
        }
        return numbers, engine.model_config


async def _show_compiles(engine, grid: int, start: float, every_s: float = 20.0) -> None:
    """A line every `every_s` while the grid compiles: a start cut short still shows its rate."""
    while True:
        await trio.sleep(every_s)
        compiled = engine.stats().compiles
        print(
            f"{compiled} of {grid} programs compiled at {time.perf_counter() - start:.0f} s",
            flush=True,
        )


async def _timed(engine, request) -> float:
    start = time.perf_counter()
    await engine.score(*request)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    args = parse(argv)
    path = common.model_path(args)
    workers = args.compile_workers
    base = msgspec.structs.replace(
        sides.engine_config(args, path),
        precompile=True,
        compile_cache_dir=None,
        compile_workers=workers,
    )
    modes = {}
    for mode in args.modes:
        config = msgspec.structs.replace(base, precompile_in_background=MODES[mode])
        modes[mode], model_config = trio.run(start_once, config, args)
        print(f"{mode}: {line(modes[mode])}", flush=True)
    report = {
        "workload": "startup",
        "description": f"start-up, token budget {args.token_budget}: grid compiled before "
        f"serving or in the background, {workers} at once, no compile cache",
        **common.environment(args, path, model_config),
        "token_budget": args.token_budget,
        "compile_workers": workers,
        "modes": modes,
    }
    summary = "; ".join(f"{mode}: ready {m['ready_s']:.1f} s" for mode, m in modes.items())
    common.publish(report, args, common.model_tag(args, path), chart, summary)
    return report


def line(m: dict) -> str:
    return (
        f"ready {m['ready_s']:.1f} s, first request {m['first_request_s'] * 1e3:.0f} ms, "
        f"grid of {m['programs']} programs compiled at {m['grid_compiled_s']:.1f} s, "
        f"the request once it is {m['warm_request_s'] * 1e3:.0f} ms"
    )


def chart(report: dict, png) -> None:
    bars = {}
    for mode, m in report["modes"].items():
        bars[f"{mode}: ready"] = m["ready_s"]
        bars[f"{mode}: grid compiled"] = m["grid_compiled_s"]
    common.bar_chart(png, report["description"], bars, "seconds")


if __name__ == "__main__":
    main()
