"""Long sequence: one query + item far longer than the token budget, scored by chunked prefill
(pieces of at most a budget, each reading the pages of the pieces before it from the KV pool).

    python -m bench long --shape qwen3-0.6b --tokens 30000 [--dtype float32] [--check]

The engine runs with the default token budget and KV pool unless told otherwise, and compiles
only what the request uses (no bucket-grid precompile), so the time reported is one cold request
including its compiles (counted). Reported: seconds, batches, tokens laid out (the sequence's
own when every token is computed once), peak resident memory of the process (on CPU the
device's memory too) and the pool's size. A pool smaller than the sequence chunks what it holds
and computes the rest in one batch reading it. `--check` scores the same sequence again with the
prefix cache off (one pass in one batch, no chunking) and reports the largest log-prob
difference. Prints one summary line; writes the JSON report.
"""

import resource
import time

import numpy as np
import trio

from bench import common
from bench.parity import label_ids
from bench.w2 import ids_of
from engine import EngineConfig, open_engine

QUICK = dict(tokens=600, token_budget=128)


def parse(argv):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=30000, help="query + item tokens")
    p.add_argument("--item-tokens", type=int, default=10)
    p.add_argument(
        "--kv-cache-bytes", type=int, default=None, help="KV pool size (default: the engine's)"
    )
    p.add_argument("--check", action="store_true", help="compare with one-pass scoring")
    return common.parse_args(p, argv, QUICK)


def config(args, path, prefix_cache: bool) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        dtype=args.dtype,
        token_budget=args.token_budget,
        kv_cache_bytes=args.kv_cache_bytes,
        prefix_cache=prefix_cache,
        precompile=False,
        tokenizer_cache_size=0,
        progress=not args.no_progress,
    )


async def score_once(cfg: EngineConfig, args) -> dict:
    async with open_engine(cfg) as engine:
        tok, rng = engine.tokenizer, np.random.default_rng(args.seed)
        query = ids_of(tok, rng, args.tokens - args.item_tokens)
        item = ids_of(tok, rng, args.item_tokens)
        pool = engine.info().kv_pool
        start = time.perf_counter()
        result = await engine.score(query, [item], label_ids(tok))
        seconds = time.perf_counter() - start
        stats = engine.stats()
        return {
            "seconds": seconds,
            "batches": stats.batches,
            "compiles": stats.compiles,
            "device_busy_s": stats.device_busy_s,
            "laid_out_tokens": stats.real_tokens,  # the sequence's tokens, each computed once
            "pool_tokens": pool.capacity_tokens,
            "pool_bytes": pool.bytes,
            "scores": result.scores[0],
            "model_config": engine.model_config,
        }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None) -> dict:
    args = parse(argv)
    path = common.model_path(args)
    chunked = trio.run(score_once, config(args, path, True), args)
    chunked["peak_rss_bytes"] = peak_rss_bytes()
    model_config = chunked.pop("model_config")
    report = {
        "workload": "long",
        "description": (
            f"one {args.tokens}-token sequence, token budget {args.token_budget}: "
            "chunked prefill through the KV pool"
        ),
        **common.environment(args, path, model_config),
        "tokens": args.tokens,
        "token_budget": args.token_budget,
        "chunked": chunked,
    }
    if args.check:
        one = trio.run(score_once, config(args, path, False), args)
        one.pop("model_config")
        diff = np.abs(np.log(chunked["scores"]) - np.log(one["scores"]))
        report["one_pass"] = one
        report["max_logprob_deviation"] = float(diff.max())
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def summary(report: dict) -> str:
    c = report["chunked"]
    line = (
        f"{report['tokens']} tokens in {c['seconds']:.1f} s ({c['batches']} batches, "
        f"{c['compiles']} compiles, {c['laid_out_tokens']} tokens laid out), peak RSS "
        f"{c['peak_rss_bytes'] / 2**30:.2f} GiB, pool {c['pool_tokens']} tokens"
    )
    if "max_logprob_deviation" in report:
        line += f"; vs one pass max |dlogprob| {report['max_logprob_deviation']:.2g}"
    return line


def chart(report: dict, png) -> None:
    bars = {"chunked": report["chunked"]["seconds"]}
    if "one_pass" in report:
        bars["one pass"] = report["one_pass"]["seconds"]
    common.bar_chart(png, report["description"], bars, "seconds")
