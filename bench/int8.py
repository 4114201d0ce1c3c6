"""int8 compute beside bf16: W1 and W2 through the engine in f32, bf16 and int8 (its weights
rounded to nearest, and by GPTQ: `EngineConfig.int8_rounding`; by GPTQ with the down
projection left in bf16: `EngineConfig.int8_bf16`; and smoothed, alpha 0.5, then rounded to
nearest: `EngineConfig.int8_smoothing`), and transformers in bf16, in one run.

    python -m bench int8 [--model PATH] [--workloads w1 w2] [--repeats 3] [--quick]

Each workload is one `Engine.score` request (W1: a query and 64 documents of 130-230 tokens;
W2: a 2000-token prompt and 500 items of 20 tokens), timed as `python -m bench w1` / `w2` time
it (warm-up, then the best of `--repeats` passes with the KV cache flushed). Reported per mode:
items/s and the ratio to bf16; the label log-probs' deviation from the f32 engine (largest and
mean |d log-prob|); the Spearman rank correlation with the f32 engine of the rerank score
P(yes) / (P(yes) + P(no)), the Kendall tau of the yes-minus-no margins, and the margins'
deviation split into its mean over the items (a shift, which reorders nothing) and its spread
around that mean (what reorders items of close margins). transformers bf16
(W1: left-padded batches, the best of 1/8/16/32; W2: the prompt once, then the items on its KV
cache in batches of 32) is timed beside and compared the same way. Prints one line per
workload; writes the JSON report and a chart.
"""

from functools import partial

import msgspec
import numpy as np

from bench import common, sides, w1, w2
from bench.parity import kendall_tau, margin_moves, margins, spearman

# a side's name: its EngineConfig dtype, int8_rounding, int8_bf16 and int8_smoothing
MODES = {
    "float32": ("float32", "nearest", (), 0.0),
    "bfloat16": ("bfloat16", "nearest", (), 0.0),
    "int8": ("int8", "nearest", (), 0.0),
    "int8-gptq": ("int8", "gptq", (), 0.0),
    "int8-gptq-down-bf16": ("int8", "gptq", ("down",), 0.0),
    "int8-smoothed": ("int8", "nearest", (), 0.5),
}
QUICK = dict(
    docs=8,
    doc_tokens=(20, 40),
    prompt_tokens=100,
    shared_tokens=20,
    items=8,
    batch_sizes=[4],
    repeats=1,
)


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    common.w1_w2_options(p, [1, 8, 16, 32])
    return common.parse_args(p, argv, QUICK)


def main(argv=None) -> dict:
    args = parse(argv)
    description = (
        "W1 and W2 in f32, bf16 and int8 compute (nearest, GPTQ), beside transformers bf16"
    )
    return common.per_workload(args, "int8", description, run_workload, chart, summary)


def run_workload(args, path, name: str) -> tuple[dict, object]:
    """The workload's report in every mode and transformers bf16, and the model's config."""
    build = partial(w1.build if name == "w1" else w2.build, args)
    runs = {}
    for mode, (dtype, rounding, bf16, alpha) in MODES.items():
        args.dtype = dtype
        config = sides.engine_config(args, path)
        config = msgspec.structs.replace(
            config, int8_rounding=rounding, int8_bf16=bf16, int8_smoothing=alpha
        )
        runs[mode] = sides.run_engine(config, build, args.repeats)
    query, items, labels = runs["float32"]["request"]
    hf = sides.load_baseline(path, "bfloat16", args.baseline_device)
    base_s, base_logprobs = baseline(args, hf, name, runs["float32"], query, items, labels)
    del hf
    reference = runs["float32"]["logprobs"]
    sides_out = {
        mode: {
            "items_per_s": len(items) / run["best_s"],
            "times_s": run["times_s"],
            **deviation(run["logprobs"], reference),
        }
        for mode, run in runs.items()
    }
    sides_out["transformers-bfloat16"] = {
        "items_per_s": len(items) / base_s,
        **deviation(base_logprobs, reference),
    }
    speed = lambda mode: sides_out[mode]["items_per_s"]
    report = {
        "items": len(items),
        "sides": sides_out,
        "int8_over_bf16": speed("int8") / speed("bfloat16"),
        "int8_gptq_over_bf16": speed("int8-gptq") / speed("bfloat16"),
        "int8_gptq_down_bf16_over_bf16": speed("int8-gptq-down-bf16") / speed("bfloat16"),
        "int8_smoothed_over_bf16": speed("int8-smoothed") / speed("bfloat16"),
        "int8_over_transformers_bf16": speed("int8") / speed("transformers-bfloat16"),
    }
    return report, runs["float32"]["config"]


def baseline(args, hf, name, run, query, items, labels) -> tuple[float, np.ndarray]:
    """transformers bf16 on the workload: (best seconds, log-probs in item order)."""
    progress = not args.no_progress
    if name == "w1":
        base = sides.run_padded_baseline(
            hf, run["seqs"], labels, args.batch_sizes, args.repeats, progress
        )
    else:
        bs = [max(args.batch_sizes)]
        base = sides.run_prefix_baseline(hf, query, items, labels, bs, args.repeats, progress)
    best = sides.best_batch(base)
    return base[best]["best_s"], base[best]["logprobs"]


def deviation(logprobs: np.ndarray, reference: np.ndarray) -> dict:
    """|d log-prob| from the f32 engine, the rank correlations of the rerank scores
    (Spearman's) and of the yes-minus-no margins (Kendall's tau), and how the margins moved
    (`parity.margin_moves`: their shift and their spread)."""
    logprobs = np.asarray(logprobs)
    diff = np.abs(logprobs - reference)
    shift, spread = margin_moves(logprobs, reference)
    return {
        "max_abs_logprob_dev_vs_f32": float(diff.max()),
        "mean_abs_logprob_dev_vs_f32": float(diff.mean()),
        "spearman_vs_f32": spearman(relevance(logprobs), relevance(reference)),
        "kendall_tau_vs_f32": kendall_tau(margins(logprobs), margins(reference)),
        "margin_shift_vs_f32": shift,
        "margin_spread_vs_f32": spread,
    }


def relevance(logprobs: np.ndarray) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) from the log-probs of (yes, no)."""
    p = np.exp(np.asarray(logprobs, np.float64)[:, :2])
    return p[:, 0] / p.sum(axis=1)


def summary(report: dict) -> str:
    parts = []
    for name, r in report["workloads"].items():
        sides_ = r["sides"]
        modes = ", ".join(
            f"{m} {s['items_per_s']:.2f} items/s (dev {s['mean_abs_logprob_dev_vs_f32']:.3g}, "
            f"rho {s['spearman_vs_f32']:.4f}, tau {s['kendall_tau_vs_f32']:.4f}, "
            f"margin spread {s['margin_spread_vs_f32']:.3g})"
            for m, s in sides_.items()
        )
        parts.append(
            f"{name}: {modes}; int8/bf16 {r['int8_over_bf16']:.2f}x, "
            f"int8-gptq/bf16 {r['int8_gptq_over_bf16']:.2f}x, "
            f"int8-gptq-down-bf16/bf16 {r['int8_gptq_down_bf16_over_bf16']:.2f}x, "
            f"int8-smoothed/bf16 {r['int8_smoothed_over_bf16']:.2f}x"
        )
    return "; ".join(parts)


def chart(report: dict, png) -> None:
    bars = {
        f"{m if m.startswith('transformers') else 'engine ' + m} {name.upper()}": s["items_per_s"]
        for name, r in report["workloads"].items()
        for m, s in r["sides"].items()
    }
    notes = "; ".join(
        f"{name}: int8/bf16 {r['int8_over_bf16']:.2f}x, mean |dlogprob| vs f32 int8 "
        f"{r['sides']['int8']['mean_abs_logprob_dev_vs_f32']:.3g} / bf16 "
        f"{r['sides']['bfloat16']['mean_abs_logprob_dev_vs_f32']:.3g}"
        for name, r in report["workloads"].items()
    )
    title = f"int8 compute, {common.report_tag(report)}, {report['cores']} CPU cores"
    common.bar_chart(png, title, bars, "items/s", notes)
