"""Offline throughput of `ScoringModel.score` beside transformers on the same pairs and dtype.

    python -m bench.score_offline [--model PATH] [--dtype bfloat16 float32] [--json FILE]

Workload: one ~25-token query and 64 items of ~150 tokens (130-170), scored as `query + item +
" Answer yes or no:"`. The baseline runs transformers (torch CPU) on the same token sequences in
padded batches (left padding, correct positions) with `logits_to_keep=1`; the best batch size is
reported. bf16 runs also report deviation from f32 and the rank correlation of item scores.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.baseline import hf_label_logprobs, load_transformers
from bench.parity import label_ids, spearman
from bench.workloads import rerank_pairs
from engine import load_model
from engine.loaders import default_model_path

SUFFIX = " Answer yes or no:"


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def engine_run(path, dtype, query, items, labels, repeats):
    model = load_model(path, dtype=dtype)
    run = lambda: model.score(query, items, labels)
    start = time.perf_counter()
    scores = run()  # warm-up: compiles
    compile_s = time.perf_counter() - start
    return model, np.array(scores), _best_of(run, repeats), compile_s


def baseline_run(path, dtype, seqs, labels, batch_sizes, repeats):
    hf = load_transformers(path, dtype)
    results = {}
    for bs in batch_sizes:
        scores = np.exp(hf_label_logprobs(hf, seqs, labels, bs))  # warm-up, kept for comparison
        results[bs] = (
            _best_of(lambda bs=bs: hf_label_logprobs(hf, seqs, labels, bs), repeats),
            scores,
        )
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    path = Path(args.model) if args.model else default_model_path()
    probe = load_model(path, dtype="float32")
    query, docs = rerank_pairs(
        probe.tokenizer, seed=0, docs=args.items, query_tokens=25, doc_tokens=(130, 170)
    )
    items = [d + SUFFIX for d in docs]
    labels = label_ids(probe.tokenizer)
    seqs = probe.sequences(query, items, item_first=False)
    del probe
    report = {"items": len(items), "tokens": sum(map(len, seqs)), "runs": {}}
    for dtype in args.dtype:
        _, scores, secs, compile_s = engine_run(path, dtype, query, items, labels, args.repeats)
        base = baseline_run(path, dtype, seqs, labels, args.batch_sizes, args.repeats)
        best_bs = min(base, key=lambda b: base[b][0])
        run = {
            "engine_items_per_s": len(items) / secs,
            "engine_compile_s": compile_s,
            "baseline_items_per_s": {bs: len(items) / t for bs, (t, _) in base.items()},
            "baseline_best_batch": best_bs,
            "ratio": base[best_bs][0] / secs,
            "max_abs_logprob_diff_vs_baseline": float(
                np.abs(np.log(scores) - np.log(base[best_bs][1])).max()
            ),
            "scores": scores.tolist(),
        }
        report["runs"][dtype] = run
        print(
            f"{dtype}: engine {run['engine_items_per_s']:.2f} pairs/s, transformers best "
            f"{len(items) / base[best_bs][0]:.2f} pairs/s (batch {best_bs}), "
            f"ratio {run['ratio']:.2f}x, compile {compile_s:.1f}s"
        )
    if {"float32", "bfloat16"} <= report["runs"].keys():
        f32 = np.array(report["runs"]["float32"]["scores"])
        b16 = np.array(report["runs"]["bfloat16"]["scores"])
        report["bf16_vs_f32"] = {
            "max_abs_logprob_diff": float(np.abs(np.log(f32) - np.log(b16)).max()),
            "mean_abs_logprob_diff": float(np.abs(np.log(f32) - np.log(b16)).mean()),
            "spearman_p_yes": spearman(f32[:, 0] / f32.sum(1), b16[:, 0] / b16.sum(1)),
        }
        print("bf16 vs f32:", json.dumps(report["bf16_vs_f32"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
