"""Offline throughput through `Engine` beside `ScoringModel` on the same work, with the
per-stage breakdown of where a request's time goes.

    python -m bench.engine_offline [--model PATH] [--dtype bfloat16] [--json FILE]

Workloads: (a) one query with 64 documents of ~150 tokens (one score call, and 64 concurrent
one-document calls), (b) 64 unrelated query/document pairs (64 concurrent calls). Warm-up
(compiling the bucket grid) is excluded from timing and reported separately. The tokenizer cache
is off unless `--token-cache` is given, so every pass tokenises its texts as new traffic would.
"""

import argparse
import json
import time
from pathlib import Path

import trio

from bench.parity import label_ids
from bench.workloads import rerank_pairs
from engine import EngineConfig, load_model, open_engine
from engine.loaders import default_model_path

SUFFIX = " Answer yes or no:"


def workloads(tokenizer):
    query, docs = rerank_pairs(tokenizer, seed=0, docs=64, query_tokens=25, doc_tokens=(130, 170))
    shared = [(query, d + SUFFIX) for d in docs]
    unrelated = []
    for seed in range(64):
        q, (d,) = rerank_pairs(
            tokenizer, seed=100 + seed, docs=1, query_tokens=25, doc_tokens=(130, 170)
        )
        unrelated.append((q, d + SUFFIX))
    return {"shared_query": shared, "unrelated_pairs": unrelated}


def offline_pairs_per_s(model, pairs, labels, repeats) -> float:
    seqs = [model.sequences(q, [d], item_first=False)[0] for q, d in pairs]
    model.row_outputs(seqs, [labels] * len(seqs))  # warm-up
    best = min(
        _timed(lambda: model.row_outputs(seqs, [labels] * len(seqs))) for _ in range(repeats)
    )
    return len(pairs) / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def engine_pass(engine, pairs, labels, *, one_call: bool):
    """Seconds for the pairs, and the summed per-stage timings of every call (the KV cache
    flushed first: each pass computes the pairs as new traffic would)."""
    engine.flush_cache()
    start = trio.current_time()
    if one_call:
        results = [await engine.score(pairs[0][0], [d for _, d in pairs], labels)]
    else:
        results = [None] * len(pairs)

        async def one(i, q, d):
            results[i] = await engine.score(q, [d], labels)

        async with trio.open_nursery() as nursery:
            for i, (q, d) in enumerate(pairs):
                nursery.start_soon(one, i, q, d)
    elapsed = trio.current_time() - start
    stages = {
        k: sum(getattr(r.timings, k) for r in results)
        for k in ("tokenize", "queue", "batch_build", "device", "total")
    }
    return elapsed, stages


async def engine_runs(config, cases, labels, repeats):
    out = {}
    start = time.perf_counter()
    async with open_engine(config) as engine:
        warm = time.perf_counter() - start
        for name, pairs, one_call in cases:
            await engine_pass(engine, pairs, labels, one_call=one_call)  # warm this shape
            runs = [
                await engine_pass(engine, pairs, labels, one_call=one_call) for _ in range(repeats)
            ]
            elapsed, stages = min(runs, key=lambda r: r[0])
            out[name] = {
                "pairs_per_s": len(pairs) / elapsed,
                "tokenize_share": stages["tokenize"] / stages["total"],
                "stage_seconds_summed": stages,
            }
        out["stats"] = {k: getattr(engine.stats(), k) for k in engine.stats().__struct_fields__}
    out["startup_s"] = warm
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--token-cache", type=int, default=0, help="tokenizer cache entries")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    path = Path(args.model) if args.model else default_model_path()
    model = load_model(path, dtype=args.dtype)
    labels = label_ids(model.tokenizer)
    loads = workloads(model.tokenizer)
    report = {"dtype": args.dtype, "scoring_model": {}}
    for name, pairs in loads.items():
        report["scoring_model"][name] = offline_pairs_per_s(model, pairs, labels, args.repeats)
    del model
    cases = [
        ("shared_query/one_call", loads["shared_query"], True),
        ("shared_query/64_calls", loads["shared_query"], False),
        ("unrelated_pairs/64_calls", loads["unrelated_pairs"], False),
    ]
    config = EngineConfig(model=str(path), dtype=args.dtype, tokenizer_cache_size=args.token_cache)
    report["engine"] = trio.run(engine_runs, config, cases, labels, args.repeats)
    for name, _, _ in cases:
        e = report["engine"][name]
        base = report["scoring_model"][name.split("/")[0]]
        print(
            f"{name}: engine {e['pairs_per_s']:.2f} pairs/s vs ScoringModel {base:.2f} "
            f"({e['pairs_per_s'] / base:.2f}x); tokenize share {e['tokenize_share']:.1%}"
        )
    print(
        f"engine start-up (load + compile grid): {report['engine']['startup_s']:.1f}s; "
        f"stats {json.dumps(report['engine']['stats'])}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
