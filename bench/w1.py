"""W1 rerank batch: one ~25-token query and 64 documents of 130-230 tokens, scored as
`query + document + " Answer yes or no:"` in one `Engine.score` request, beside transformers.

    python -m bench w1 [--model PATH | --shape qwen3-0.6b] [--dtype bfloat16] [--json FILE]

The baseline is transformers (torch CPU, same weights and dtype, `torch.set_num_threads` = cores)
on the same token ids, sorted by length and left-padded into batches with correct positions and
`logits_to_keep=1`; batch size 1 (no padding) and 8/16/32 are timed and the best is the baseline.
Prints one summary line; writes the JSON report and a bar chart beside it.
"""

import numpy as np

from bench import common, sides
from bench.flops import Cost
from bench.parity import label_ids
from bench.peak import measure_peaks
from bench.workloads import rerank_pairs

SUFFIX = " Answer yes or no:"
QUICK = dict(docs=8, doc_tokens=(20, 40), batch_sizes=[1, 4], repeats=1, gemm=[512])


def main(argv=None) -> dict:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--query-tokens", type=int, default=25)
    p.add_argument("--doc-tokens", type=int, nargs=2, default=(130, 230))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--repeats", type=int, default=3)
    args = common.parse_args(p, argv, QUICK)
    progress = not args.no_progress
    path = common.model_path(args)
    peaks = measure_peaks(args.gemm)

    def build(model):
        query, docs = rerank_pairs(
            model.tokenizer,
            seed=args.seed,
            docs=args.docs,
            query_tokens=args.query_tokens,
            doc_tokens=tuple(args.doc_tokens),
        )
        return query, [d + SUFFIX for d in docs], label_ids(model.tokenizer)

    eng = sides.run_engine(sides.engine_config(args, path), build, args.repeats)
    _, items, labels = eng["request"]
    seqs = eng["seqs"]
    hf = sides.load_baseline(path, args.dtype)
    base = sides.run_padded_baseline(hf, seqs, labels, args.batch_sizes, args.repeats, progress)
    del hf
    bs = sides.best_batch(base)
    cost: Cost = eng["cost"]
    n, tokens = len(items), sum(map(len, seqs))
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    baseline_flops = cost.sequences(seqs)  # every pair whole: nothing shared
    baseline = {
        "batch_size": bs,
        "items_per_s": n / base[bs]["best_s"],
        **common.summary_numbers(baseline_flops, base[bs]["best_s"], tokens, peaks, args.dtype),
        "flops": baseline_flops,
        "per_batch_size": {
            b: {
                "items_per_s": n / r["best_s"],
                "times_s": r["times_s"],
                "padded_tokens": r["padded"],
            }
            for b, r in base.items()
        },
    }
    diff = np.abs(eng["logprobs"] - base[bs]["logprobs"])
    report = {
        "workload": "w1",
        "description": (
            f"1 query (~{args.query_tokens} tokens) + {n} documents "
            f"({args.doc_tokens[0]}-{args.doc_tokens[1]} tokens) + '{SUFFIX.strip()}', "
            "one request"
        ),
        **common.environment(args, path, eng["config"]),
        "items": n,
        "workload_tokens": tokens,
        "peak_gflops": peaks,
        "engine_items_per_s": engine["items_per_s"],
        "baseline_items_per_s": baseline["items_per_s"],
        "ratio": engine["items_per_s"] / baseline["items_per_s"],
        "engine": engine,
        "baseline": baseline,
        "max_abs_logprob_diff_vs_baseline": float(diff.max()),
    }
    json_path, png = common.output_paths(args, "w1", common.model_tag(args, path))
    common.write_report(report, json_path)
    chart(report, png)
    print(
        f"w1 {common.model_tag(args, path)} {args.dtype}: engine {engine['items_per_s']:.2f} "
        f"items/s ({engine['tokens_per_s']:.0f} tok/s, {common.fmt_mfu(engine, args.dtype)}), "
        f"transformers bs={bs} {baseline['items_per_s']:.2f} items/s "
        f"({baseline['tokens_per_s']:.0f} tok/s, {common.fmt_mfu(baseline, args.dtype)}), "
        f"ratio {report['ratio']:.2f}x; peaks bf16 {peaks['bfloat16']:.0f} / f32 "
        f"{peaks['float32']:.0f} GFLOP/s; max |dlogprob| {diff.max():.3g} -> {json_path}"
    )
    return report


def chart(report: dict, png) -> None:
    """The bar chart of a W1 report: engine and transformers per batch size, items/s."""
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    bars = {"engine": engine["items_per_s"]}
    bars |= {
        f"transformers bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()
    }
    common.bar_chart(
        png,
        f"W1 rerank batch: {report['description']}\n"
        f"{common.report_tag(report)} {dtype}, {report['cores']} CPU cores",
        bars,
        "items/s",
        notes=f"engine/best transformers = {report['ratio']:.2f}x; MFU engine "
        f"{engine['mfu']:.1%}, transformers {baseline['mfu']:.1%} of {dtype} peak "
        f"{report['peak_gflops'][dtype]:.0f} GFLOP/s",
    )


if __name__ == "__main__":
    main()
