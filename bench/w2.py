"""W2 large multi-item: one 2000-token prompt (100 shared + 1900 varied tokens) and 500 items of
20 tokens in one `Engine.score` request (token ids), beside two transformers baselines.

    python -m bench w2 [--model PATH | --shape qwen3-0.6b] [--dtype bfloat16] [--items 500]

Baselines (torch CPU, same weights and dtype, `logits_to_keep=1`):
- prefix reuse, as a careful transformers user would do it: the prompt once with `use_cache=True`,
  then the items in batches of 1/8/16/32 on a copy of its KV cache expanded to the batch,
  positions continuing after the prompt. The best batch size is the baseline; its log-probs are
  checked against the engine's on every item (bf16/f32 tolerance).
- naive: every item as its own 2020-token sequence. Only a sample of items (`--naive-sample`) is
  timed and the rate extrapolated to all items; the output says so.
Prints one summary line; writes the JSON report and a bar chart beside it.
"""

import numpy as np

from bench import common, sides
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
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--shared-tokens", type=int, default=100, help="of the prompt, fixed text")
    p.add_argument("--items", type=int, default=500)
    p.add_argument("--item-tokens", type=int, default=20)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--naive-sample", type=int, default=8, help="items timed by the naive baseline")
    p.add_argument("--naive-batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=2)
    args = common.parse_args(p, argv, QUICK)
    progress = not args.no_progress
    path = common.model_path(args)
    peaks = measure_peaks(args.gemm)

    def build(model):
        prompt, items = make_request(model.tokenizer, args)
        return prompt, items, label_ids(model.tokenizer)

    eng = sides.run_engine(sides.engine_config(args, path), build, args.repeats)
    prompt, items, labels = eng["request"]
    n, plen = len(items), len(prompt)
    hf = sides.load_baseline(path, args.dtype)
    prefix = sides.run_prefix_baseline(
        hf, prompt, items, labels, args.batch_sizes, args.repeats, progress
    )
    sample = [prompt + it for it in items[: args.naive_sample]]
    naive_bs = sorted({min(b, len(sample)) for b in args.naive_batch_sizes})
    naive = sides.run_naive_sample(hf, sample, labels, naive_bs, progress)
    del hf

    cost: Cost = eng["cost"]
    workload_tokens = sum(map(len, eng["seqs"]))
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    bs = sides.best_batch(prefix)
    prefix_tokens = plen + n * args.item_tokens
    prefix_flops = cost.chunk(plen, [args.item_tokens] * n, rows=n + 1)  # + the prompt's row
    baseline = {
        "kind": "prefix reuse (prompt KV cache expanded to the batch)",
        "batch_size": bs,
        "items_per_s": n / prefix[bs]["best_s"],
        **common.summary_numbers(
            prefix_flops, prefix[bs]["best_s"], prefix_tokens, peaks, args.dtype
        ),
        "flops": prefix_flops,
        "per_batch_size": {
            b: {"items_per_s": n / r["best_s"], "times_s": r["times_s"]} for b, r in prefix.items()
        },
    }
    nbs = min(naive, key=lambda b: naive[b]["s_per_item"])
    per_item = naive[nbs]["s_per_item"]
    naive_side = {
        "kind": f"naive (each item its own {plen + args.item_tokens}-token sequence)",
        "extrapolated_from_items": len(sample),
        "batch_size": nbs,
        "items_per_s": 1 / per_item,
        **common.summary_numbers(
            cost.sequences(sample), naive[nbs]["best_s"], sum(map(len, sample)), peaks, args.dtype
        ),
        "estimated_seconds_for_all_items": per_item * n,
        "per_batch_size": {b: {"items_per_s": 1 / r["s_per_item"]} for b, r in naive.items()},
    }
    ref = prefix[bs]["logprobs"]
    check = {
        "tolerance": TOLERANCE[args.dtype],
        "items_compared": n,
        "max_abs_logprob_diff_engine_vs_prefix": float(np.abs(eng["logprobs"] - ref).max()),
        "max_abs_logprob_diff_naive_vs_prefix": float(
            np.abs(naive[nbs]["logprobs"] - ref[: len(sample)]).max()
        ),
    }
    check["ok"] = check["max_abs_logprob_diff_engine_vs_prefix"] <= check["tolerance"]
    report = {
        "workload": "w2",
        "description": (
            f"{plen}-token prompt ({args.shared_tokens} shared + {plen - args.shared_tokens} "
            f"varied) + {n} items of {args.item_tokens} tokens, one request"
        ),
        **common.environment(args, path, eng["config"]),
        "items": n,
        "workload_tokens": workload_tokens,
        "peak_gflops": peaks,
        "engine_items_per_s": engine["items_per_s"],
        "baseline_items_per_s": baseline["items_per_s"],
        "ratio": engine["items_per_s"] / baseline["items_per_s"],
        "naive_items_per_s": naive_side["items_per_s"],
        "ratio_vs_naive": engine["items_per_s"] / naive_side["items_per_s"],
        "engine": engine,
        "baseline": baseline,
        "naive_baseline": naive_side,
        "score_check": check,
    }
    tag = common.model_tag(args, path)
    json_path, png = common.output_paths(args, "w2", tag)
    common.write_report(report, json_path)
    chart(report, png)
    print(
        f"w2 {tag} {args.dtype}: engine {engine['items_per_s']:.2f} items/s "
        f"({engine['tokens_per_s']:.0f} tok/s, {common.fmt_mfu(engine, args.dtype)}); "
        f"transformers prefix-reuse bs={bs} {baseline['items_per_s']:.2f} items/s "
        f"({baseline['tokens_per_s']:.0f} tok/s, {common.fmt_mfu(baseline, args.dtype)}), "
        f"ratio {report['ratio']:.2f}x; naive bs={nbs} {naive_side['items_per_s']:.3f} items/s "
        f"(extrapolated from {len(sample)} items; {naive_side['tokens_per_s']:.0f} tok/s, "
        f"{common.fmt_mfu(naive_side, args.dtype)}), ratio {report['ratio_vs_naive']:.1f}x; "
        f"max |dlogprob| engine vs prefix {check['max_abs_logprob_diff_engine_vs_prefix']:.3g} "
        f"({'ok' if check['ok'] else 'OVER'} tol {check['tolerance']}); peaks bf16 "
        f"{peaks['bfloat16']:.0f} / f32 {peaks['float32']:.0f} GFLOP/s -> {json_path}"
    )
    return report


def chart(report: dict, png) -> None:
    """The bar chart of a W2 report: engine, prefix reuse and naive per batch size, items/s."""
    engine, baseline, naive = report["engine"], report["baseline"], report["naive_baseline"]
    dtype = report["dtype"]
    bars = {"engine": engine["items_per_s"]}
    bars |= {f"prefix bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()}
    bars |= {f"naive bs={b} (est.)": v["items_per_s"] for b, v in naive["per_batch_size"].items()}
    common.bar_chart(
        png,
        f"W2 large multi-item: {report['description']}\n{common.report_tag(report)} {dtype}, "
        f"{report['cores']} CPU cores",
        bars,
        "items/s",
        notes=f"engine/prefix-reuse transformers = {report['ratio']:.2f}x, engine/naive = "
        f"{report['ratio_vs_naive']:.1f}x (naive extrapolated from "
        f"{naive['extrapolated_from_items']} items); MFU engine {engine['mfu']:.1%} of {dtype} "
        f"peak {report['peak_gflops'][dtype]:.0f} GFLOP/s",
    )


if __name__ == "__main__":
    main()
