"""W1 rerank batch: one ~25-token query and 64 documents of 130-230 tokens, scored as
`query + document + " Answer yes or no:"` in one `Engine.score` request, beside transformers.

    python -m bench w1 [--model PATH | --shape qwen3-0.6b] [--dtype bfloat16] [--json FILE]

The baseline is transformers (torch on the CPU with `torch.set_num_threads` = cores, or on
`--baseline-device cuda`; same weights and dtype) on the same token ids, sorted by length and
left-padded into batches with correct positions and `logits_to_keep=1`; batch size 1 (no
padding) and 8/16/32 are timed and the best is the baseline. Prints one summary line; writes the
JSON report and a bar chart beside it. A cross-encoder (`--shape minilm-l6`,
`--shape bge-reranker-v2-m3`, or `--model` of one) runs `bench.w1_encoder`.

`--peer vllm --peer-python VENV/bin/python` also runs vLLM's CPU build (installed in its own
virtual environment) on the same token ids, bf16 and prefix caching on, the cache reset before
each of `--repeats` timed passes after a warm-up; `--peer-api generate|classify` picks how it
scores the labels (`bench.peer`). The report gains `peer` and `ratio_vs_peer`, the chart its bar.
"""

from functools import partial

import numpy as np

from bench import common, peer, sides, w1_encoder
from bench.flops import Cost
from bench.parity import label_ids
from bench.peak import measure_peaks
from bench.workloads import rerank_pairs

SUFFIX = " Answer yes or no:"
QUICK = dict(docs=8, doc_tokens=(20, 40), batch_sizes=[1, 4], repeats=1, gemm=[512])


def main(argv=None) -> dict:
    args = parse(argv)
    if w1_encoder.is_encoder(args):
        if args.peer:
            raise peer.PeerError("--peer: the peer is compared on decoder models, not encoders")
        return w1_encoder.main(argv)
    path, peaks = common.model_path(args), measure_peaks(args.gemm)
    eng = sides.run_engine(sides.engine_config(args, path), partial(build, args), args.repeats)
    _, items, labels = eng["request"]
    if args.engine_only:
        return common.engine_only(eng, len(items), peaks, args.dtype)
    seqs = eng["seqs"]
    hf = sides.load_baseline(path, args.dtype, args.baseline_device)
    progress = not args.no_progress
    base = sides.run_padded_baseline(hf, seqs, labels, args.batch_sizes, args.repeats, progress)
    del hf
    n = len(items)
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    baseline = baseline_side(base, n, eng["cost"], seqs, peaks, args.dtype)
    diff = np.abs(eng["logprobs"] - base[baseline["batch_size"]]["logprobs"])
    description = (
        f"1 query (~{args.query_tokens} tokens) + {n} documents "
        f"({args.doc_tokens[0]}-{args.doc_tokens[1]} tokens) + '{SUFFIX.strip()}', one request"
    )
    tokens = sum(map(len, seqs))
    report = {
        **common.report_head(
            args, path, eng["config"], peaks, "w1", description, items=n, workload_tokens=tokens
        ),
        **common.versus(engine, baseline),
        "engine": engine,
        "baseline": baseline,
        "max_abs_logprob_diff_vs_baseline": float(diff.max()),
        **peer.measure(args, path, eng, engine),
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    common.rerank_batch_options(p, [1, 8, 16, 32])
    w1_encoder.add_paired_option(p)
    peer.add_options(p)
    args = common.parse_args(p, argv, QUICK)
    peer.check_options(p, args)
    if args.paired and not w1_encoder.is_encoder(args):
        p.error("--paired: cross-encoders only (a decoder's W1 times its sides in sequence)")
    return args


def build(args, model):
    """The request `(query, documents + SUFFIX, labels)` in the model's tokenizer."""
    query, docs = rerank_pairs(
        model.tokenizer,
        seed=args.seed,
        docs=args.docs,
        query_tokens=args.query_tokens,
        doc_tokens=tuple(args.doc_tokens),
    )
    return query, [d + SUFFIX for d in docs], label_ids(model.tokenizer)


def baseline_side(base: dict, n: int, cost: Cost, seqs, peaks: dict, dtype: str) -> dict:
    """The transformers side: its best batch size, and every batch size's rate."""
    bs = sides.best_batch(base)
    flops = cost.sequences(seqs)  # every pair whole: nothing shared
    return {
        "batch_size": bs,
        "items_per_s": n / base[bs]["best_s"],
        **common.summary_numbers(flops, base[bs]["best_s"], sum(map(len, seqs)), peaks, dtype),
        "flops": flops,
        "per_batch_size": {
            b: {
                "items_per_s": n / r["best_s"],
                "times_s": r["times_s"],
                "padded_tokens": r["padded"],
            }
            for b, r in base.items()
        },
    }


def summary(report: dict) -> str:
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    return (
        f"engine {common.fmt_side(engine, dtype)}, transformers ({report['baseline_device']}) "
        f"bs={baseline['batch_size']} {common.fmt_side(baseline, dtype)}, "
        f"ratio {report['ratio']:.2f}x; {common.fmt_startup(engine)}; "
        f"{common.fmt_peaks(report['peak_gflops'])}; "
        f"max |dlogprob| {report['max_abs_logprob_diff_vs_baseline']:.3g}"
        f"{peer.summary(report)}"
    )


def chart(report: dict, png) -> None:
    """The bar chart of a W1 report: engine, the peer if any, transformers per batch size, in
    items/s."""
    if report.get("kind") == w1_encoder.KIND:
        return w1_encoder.chart(report, png)
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    bars = {"engine": engine["items_per_s"], **peer.bars(report)}
    bars |= {
        f"transformers bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()
    }
    common.bar_chart(
        png,
        f"W1 rerank batch: {report['description']}\n"
        f"{common.report_tag(report)} {dtype}, {report['cores']} CPU cores",
        bars,
        "items/s",
        notes=f"engine/best transformers = {report['ratio']:.2f}x{peer.note(report)}; MFU engine "
        f"{engine['mfu']:.1%}, transformers {baseline['mfu']:.1%} of {dtype} peak "
        f"{report['peak_gflops'][dtype]:.0f} GFLOP/s",
    )


if __name__ == "__main__":
    main()
