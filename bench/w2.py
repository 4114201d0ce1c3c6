"""W2 large multi-item: one 2000-token prompt (100 shared + 1900 varied tokens) and 500 items of
20 tokens in one `Engine.score` request (token ids), beside two transformers baselines.

    python -m bench w2 [--model PATH | --shape qwen3-0.6b] [--dtype bfloat16] [--items 500]

Baselines (torch on the CPU or `--baseline-device cuda`, same weights and dtype,
`logits_to_keep=1`):
- prefix reuse, as a careful transformers user would do it: the prompt once with `use_cache=True`,
  then the items in batches of 1/8/16/32 on a copy of its KV cache expanded to the batch,
  positions continuing after the prompt. The best batch size is the baseline; its log-probs are
  checked against the engine's on every item (bf16/f32 tolerance).
- naive: every item as its own 2020-token sequence. Only a sample of items (`--naive-sample`) is
  timed and the rate extrapolated to all items; the output says so.
Prints one summary line; writes the JSON report and a bar chart beside it.

`--peer vllm --peer-python VENV/bin/python` also runs vLLM's CPU build on the same token ids
(each item as prompt + item, as the engine sees them; its prefix caching computes the prompt once),
as in `bench.w1`: the report gains `peer` and `ratio_vs_peer`, the chart its bar.
"""

from functools import partial

import numpy as np

from bench import common, peer, sides
from bench.flops import Cost
from bench.parity import label_ids
from bench.peak import measure_peaks
from bench.workloads import text_of_tokens

QUICK = dict(
    prompt_tokens=100,
    shared_tokens=20,
    items=8,
    batch_sizes=[1, 4],
    naive_sample=2,
    naive_batch_sizes=[1, 2],
    repeats=1,
    gemm=[512],
)
# |engine - transformers| on label log-probs that still counts as the same score
TOLERANCE = {"float32": 2e-3, "bfloat16": 0.15}


def ids_of(tokenizer, rng, tokens: int) -> list[int]:
    """Exactly `tokens` token ids of English-like text."""
    return tokenizer.encode(text_of_tokens(rng, tokenizer, tokens), add_special_tokens=False).ids[
        :tokens
    ]


def make_request(tokenizer, args):
    """(prompt ids, item ids): a shared header, varied text, then `items` items."""
    header = ids_of(tokenizer, np.random.default_rng(12345), args.shared_tokens)
    rng = np.random.default_rng(args.seed)
    prompt = header + ids_of(tokenizer, rng, args.prompt_tokens - args.shared_tokens)
    items = [ids_of(tokenizer, rng, args.item_tokens) for _ in range(args.items)]
    return prompt, items


def main(argv=None) -> dict:
    args = parse(argv)
    path, peaks = common.model_path(args), measure_peaks(args.gemm)
    eng = sides.run_engine(sides.engine_config(args, path), partial(build, args), args.repeats)
    prompt, items, labels = eng["request"]
    if args.engine_only:
        return common.engine_only(eng, len(items), peaks, args.dtype)
    n, plen, cost = len(items), len(prompt), eng["cost"]
    sample = [prompt + it for it in items[: args.naive_sample]]
    prefix, naive = run_baselines(args, path, prompt, items, labels, sample)
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    baseline = prefix_side(prefix, cost, plen, n, args.item_tokens, peaks, args.dtype)
    extrapolated = naive_side(naive, cost, sample, n, plen + args.item_tokens, peaks, args.dtype)
    ref = prefix[baseline["batch_size"]]["logprobs"]
    check = score_check(
        eng["logprobs"], ref, naive[extrapolated["batch_size"]]["logprobs"], args.dtype
    )
    description = (
        f"{plen}-token prompt ({args.shared_tokens} shared + {plen - args.shared_tokens} "
        f"varied) + {n} items of {args.item_tokens} tokens, one request"
    )
    tokens = sum(map(len, eng["seqs"]))
    report = {
        **common.report_head(
            args, path, eng["config"], peaks, "w2", description, items=n, workload_tokens=tokens
        ),
        **common.versus(engine, baseline),
        "naive_items_per_s": extrapolated["items_per_s"],
        "ratio_vs_naive": engine["items_per_s"] / extrapolated["items_per_s"],
        "engine": engine,
        "baseline": baseline,
        "naive_baseline": extrapolated,
        "score_check": check,
        **peer.measure(args, path, eng, engine),
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--shared-tokens", type=int, default=100, help="of the prompt, fixed text")
    p.add_argument("--items", type=int, default=500)
    p.add_argument("--item-tokens", type=int, default=20)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--naive-sample", type=int, default=8, help="items timed by the naive baseline")
    p.add_argument("--naive-batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=2)
    peer.add_options(p)
    args = common.parse_args(p, argv, QUICK)
    peer.check_options(p, args)
    return args


def build(args, model):
    """The request `(prompt ids, item ids, labels)` in the model's tokenizer."""
    prompt, items = make_request(model.tokenizer, args)
    return prompt, items, label_ids(model.tokenizer)


def run_baselines(args, path, prompt, items, labels, sample) -> tuple[dict, dict]:
    """(prefix reuse per batch size, naive per batch size on `sample`), one model load."""
    progress = not args.no_progress
    hf = sides.load_baseline(path, args.dtype, args.baseline_device)
    prefix = sides.run_prefix_baseline(
        hf, prompt, items, labels, args.batch_sizes, args.repeats, progress
    )
    naive_bs = sorted({min(b, len(sample)) for b in args.naive_batch_sizes})
    return prefix, sides.run_naive_sample(hf, sample, labels, naive_bs, progress)


def prefix_side(prefix: dict, cost: Cost, plen: int, n: int, item_tokens: int, peaks, dtype):
    """The prefix-reuse baseline: its best batch size, and every batch size's rate."""
    bs = sides.best_batch(prefix)
    flops = cost.chunk(plen, [item_tokens] * n, rows=n + 1)  # + the prompt's row
    tokens = plen + n * item_tokens
    return {
        "kind": "prefix reuse (prompt KV cache expanded to the batch)",
        "batch_size": bs,
        "items_per_s": n / prefix[bs]["best_s"],
        **common.summary_numbers(flops, prefix[bs]["best_s"], tokens, peaks, dtype),
        "flops": flops,
        "per_batch_size": {
            b: {"items_per_s": n / r["best_s"], "times_s": r["times_s"]} for b, r in prefix.items()
        },
    }


def naive_side(naive: dict, cost: Cost, sample, n: int, seq_tokens: int, peaks, dtype):
    """The naive baseline, extrapolated from `sample` to all `n` items."""
    bs = min(naive, key=lambda b: naive[b]["s_per_item"])
    per_item = naive[bs]["s_per_item"]
    tokens = sum(map(len, sample))
    return {
        "kind": f"naive (each item its own {seq_tokens}-token sequence)",
        "extrapolated_from_items": len(sample),
        "batch_size": bs,
        "items_per_s": 1 / per_item,
        **common.summary_numbers(cost.sequences(sample), naive[bs]["best_s"], tokens, peaks, dtype),
        "estimated_seconds_for_all_items": per_item * n,
        "per_batch_size": {b: {"items_per_s": 1 / r["s_per_item"]} for b, r in naive.items()},
    }


def score_check(engine, ref, naive, dtype: str) -> dict:
    """The engine's log-probs (f64[N, L]) and the naive ones (of the first items) against the
    prefix-reuse baseline's, `ref`."""
    engine_diff = float(np.abs(engine - ref).max())
    return {
        "tolerance": TOLERANCE[dtype],
        "items_compared": len(ref),
        "max_abs_logprob_diff_engine_vs_prefix": engine_diff,
        "max_abs_logprob_diff_naive_vs_prefix": float(np.abs(naive - ref[: len(naive)]).max()),
        "ok": engine_diff <= TOLERANCE[dtype],
    }


def summary(report: dict) -> str:
    engine, baseline, naive = report["engine"], report["baseline"], report["naive_baseline"]
    check, dtype = report["score_check"], report["dtype"]
    return (
        f"engine {common.fmt_side(engine, dtype)}; transformers ({report['baseline_device']}) "
        f"prefix-reuse bs={baseline['batch_size']} {common.fmt_side(baseline, dtype)}, "
        f"ratio {report['ratio']:.2f}x; naive bs={naive['batch_size']} "
        f"{naive['items_per_s']:.3f} items/s (extrapolated from "
        f"{naive['extrapolated_from_items']} items; {naive['tokens_per_s']:.0f} tok/s, "
        f"{common.fmt_mfu(naive, dtype)}), ratio {report['ratio_vs_naive']:.1f}x; "
        f"max |dlogprob| engine vs prefix {check['max_abs_logprob_diff_engine_vs_prefix']:.3g} "
        f"({'ok' if check['ok'] else 'OVER'} tol {check['tolerance']}); "
        f"{common.fmt_startup(engine)}; "
        f"{common.fmt_peaks(report['peak_gflops'])}{peer.summary(report)}"
    )


def chart(report: dict, png) -> None:
    """The bar chart of a W2 report: engine, the peer if any, prefix reuse and naive per batch
    size, items/s."""
    engine, baseline, naive = report["engine"], report["baseline"], report["naive_baseline"]
    dtype = report["dtype"]
    bars = {"engine": engine["items_per_s"], **peer.bars(report)}
    bars |= {f"prefix bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()}
    bars |= {f"naive bs={b} (est.)": v["items_per_s"] for b, v in naive["per_batch_size"].items()}
    common.bar_chart(
        png,
        f"W2 large multi-item: {report['description']}\n{common.report_tag(report)} {dtype}, "
        f"{report['cores']} CPU cores",
        bars,
        "items/s",
        notes=f"engine/prefix-reuse transformers = {report['ratio']:.2f}x, engine/naive = "
        f"{report['ratio_vs_naive']:.1f}x{peer.note(report)} (naive extrapolated from "
        f"{naive['extrapolated_from_items']} items); MFU engine {engine['mfu']:.1%} of {dtype} "
        f"peak {report['peak_gflops'][dtype]:.0f} GFLOP/s",
    )


if __name__ == "__main__":
    main()
