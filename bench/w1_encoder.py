"""W1 for cross-encoders: one ~25-token query and 64 documents of 130-230 tokens, scored as
(query, document) pairs in one `Engine.rerank` request (raw scores: the classifier's logit),
beside sentence-transformers' `CrossEncoder.predict` on the same pairs.

    python -m bench w1 --shape minilm-l6 | --shape bge-reranker-v2-m3 | --model CROSS_ENCODER_DIR
        [--dtype bfloat16] [--paired ROUNDS] [--json bench/figures/w1-minilm-l6-bf16.json]

`bench.w1` hands a run here when `--shape` names an encoder shape (`bench.encoders`) or `--model`
is a cross-encoder checkpoint. The baseline is `CrossEncoder` (torch on the CPU with
`torch.set_num_threads` = cores, or on `--baseline-device cuda`; same weights and dtype,
activation Identity so that both sides give raw logits), which tokenises the pairs itself, sorts
them by length and pads each batch; batch sizes 8/16/32/64 are timed and the best is the
baseline. Both sides tokenise inside the timed call. `--paired ROUNDS` then times the two sides
in turns, the engine and CrossEncoder at its best batch size, each round's order swapped: on a
machine whose speed swings from minute to minute, the ratio within each round holds where
either side's best does not (the report's "paired"). Prints one summary line; writes the JSON
report and a bar chart beside it.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import trio
from tqdm import trange

from bench import common, sides
from bench.encoders import ENCODER_SHAPES
from bench.flops import encoder_flops
from bench.peak import measure_peaks
from bench.workloads import rerank_pairs
from engine import open_engine
from engine.host.pairs import PairOptions
from engine.messages import ScoreRequest
from engine.models import ENCODERS, MODEL_TYPES

KIND = "cross-encoder"  # the report's "kind": how `bench.w1` tells its reports apart
QUICK = dict(docs=8, doc_tokens=(20, 40), batch_sizes=[4, 8], repeats=1, gemm=[512])


def is_encoder(args) -> bool:
    """Whether the W1 asked for is a cross-encoder's: an encoder shape, or a checkpoint
    directory whose config.json names an encoder family."""
    if args.shape:
        return args.shape in ENCODER_SHAPES
    config = Path(args.model or "") / "config.json"
    if not args.model or not config.is_file():
        return False
    family = MODEL_TYPES.get(json.loads(config.read_text()).get("model_type"))
    return family in {f.name for f in ENCODERS}


def main(argv=None) -> dict:
    args = parse(argv)
    path, peaks = common.model_path(args), measure_peaks(args.gemm)
    eng = run_engine(sides.engine_config(args, path), args)
    query, docs = eng["request"]
    n = len(docs)
    if args.engine_only:
        return common.engine_only(eng, n, peaks, args.dtype)
    progress = not args.no_progress
    ce = load_cross_encoder(path, args.dtype, args.baseline_device)
    base = run_cross_encoder(ce, query, docs, args.batch_sizes, args.repeats, progress)
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    baseline = baseline_side(base, n, eng, peaks, args.dtype)
    config = sides.engine_config(args, path)
    paired = run_paired(config, ce, (query, docs), baseline["batch_size"], args.paired)
    del ce
    diff = np.abs(eng["scores"] - base[baseline["batch_size"]]["scores"])
    description = (
        f"1 query (~{args.query_tokens} tokens) + {n} documents "
        f"({args.doc_tokens[0]}-{args.doc_tokens[1]} tokens) as pairs, one rerank request"
    )
    report = {
        **common.report_head(
            args,
            path,
            eng["config"],
            peaks,
            "w1",
            description,
            kind=KIND,
            items=n,
            workload_tokens=eng["planned_real_tokens"],
        ),
        **common.versus(engine, baseline),
        "engine": engine,
        "baseline": baseline,
        "paired": paired,
        "max_abs_score_diff_vs_baseline": float(diff.max()),
        "truncated_tokens": eng["truncated_tokens"],  # by the pair truncation, all pairs
        "engine_score_range": [float(eng["scores"].min()), float(eng["scores"].max())],
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    common.rerank_batch_options(p, [8, 16, 32, 64])
    add_paired_option(p)
    return common.parse_args(p, argv, QUICK)


def add_paired_option(p) -> None:
    """`--paired ROUNDS` (see the module docstring)."""
    p.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="cross-encoders: then time the engine and CrossEncoder (its best batch size) in "
        "turns for ROUNDS rounds, and report the ratio within each round",
    )


def run_engine(config, args) -> dict:
    """One `Engine.rerank` request (raw scores): warm-up, then `args.repeats` timed passes."""
    return trio.run(_run_engine, config, args)


async def _run_engine(config, args) -> dict:
    start = time.perf_counter()
    async with open_engine(config) as engine:
        startup_s = time.perf_counter() - start
        startup_compiles = engine.stats().compiles  # the bucket grid, compiled before serving
        query, docs = rerank_pairs(
            engine.tokenizer,
            seed=args.seed,
            docs=args.docs,
            query_tokens=args.query_tokens,
            doc_tokens=tuple(args.doc_tokens),
        )
        warm = await engine.rerank(query, docs, raw_scores=True)  # warm-up: first run
        before = engine.stats()
        times = []
        for _ in trange(args.repeats, desc="engine", disable=not config.progress):
            t0 = time.perf_counter()
            await engine.rerank(query, docs, raw_scores=True)
            times.append(time.perf_counter() - t0)
        after = engine.stats()
        lengths = [len(s) for s in pair_sequences(engine, query, docs)]
        per_pass = lambda name: (getattr(after, name) - getattr(before, name)) / args.repeats
        scores = np.empty(len(docs))
        for hit in warm.results:
            scores[hit.index] = hit.relevance_score
        return {
            "startup_s": startup_s,
            "startup_compiles": startup_compiles,
            **sides.dense_facts(engine),
            "compiles": after.compiles,
            "times_s": times,
            "best_s": min(times),
            "scores": scores,
            "lengths": lengths,
            "flops": encoder_flops(engine.model_config, lengths),
            "planned_real_tokens": sum(lengths),
            "real_tokens": per_pass("real_tokens"),
            "padded_tokens": per_pass("padded_tokens"),
            "batches": per_pass("batches"),
            "device_busy_s": per_pass("device_busy_s"),
            "truncated_tokens": warm.truncated_tokens,
            "config": engine.model_config,
            "request": (query, docs),
        }


def run_paired(config, ce, request, batch_size: int, rounds: int) -> dict | None:
    """The engine's rerank and `CrossEncoder.predict` at `batch_size` in turns for `rounds`
    rounds (the first side of each round alternating), and the ratio of each round's times,
    CrossEncoder's over the engine's: their median, least and greatest. None for 0 rounds."""
    if rounds <= 0:
        return None
    times = trio.run(_run_paired, config, ce, request, batch_size, rounds)
    ratios = np.array(times["baseline"]) / np.array(times["engine"])
    return {
        "rounds": rounds,
        "batch_size": batch_size,
        "engine_times_s": times["engine"],
        "baseline_times_s": times["baseline"],
        "ratio_median": float(np.median(ratios)),
        "ratio_min": float(ratios.min()),
        "ratio_max": float(ratios.max()),
    }


async def _run_paired(config, ce, request, batch_size: int, rounds: int) -> dict:
    query, docs = request
    pairs = [(query, d) for d in docs]
    times = {"engine": [], "baseline": []}
    async with open_engine(config) as engine:
        await engine.rerank(query, docs, raw_scores=True)  # warm-up, as `_run_engine`'s
        for r in range(rounds):
            for side in ("engine", "baseline") if r % 2 == 0 else ("baseline", "engine"):
                t0 = time.perf_counter()
                if side == "engine":
                    await engine.rerank(query, docs, raw_scores=True)
                else:
                    ce.predict(pairs, batch_size=batch_size, show_progress_bar=False)
                times[side].append(time.perf_counter() - t0)
    return times


def pair_sequences(engine, query: str, docs: list[str]) -> list[list[int]]:
    """The token sequences the engine's tokenizer makes of the pairs, truncated as rerank's."""
    cfg = engine.model_config
    labels, pairs = list(range(cfg.num_labels)), PairOptions(limit=cfg.max_length)
    request = ScoreRequest(query=query, items=docs, label_token_ids=labels, pairs=pairs)
    return engine.sequences(request)


def load_cross_encoder(path: Path, dtype: str, device: str = "cpu"):
    """sentence-transformers' CrossEncoder on torch device `device` in `dtype`, giving raw
    logits (as host numpy arrays)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(os.cpu_count())
    return CrossEncoder(
        str(path),
        device=device,
        activation_fn=torch.nn.Identity(),
        model_kwargs={"dtype": getattr(torch, dtype)},
    )


def run_cross_encoder(ce, query, docs, batch_sizes, repeats: int, progress: bool) -> dict:
    """`CrossEncoder.predict` over the pairs per batch size: the best of `repeats`, and the
    raw scores f64[N] (of several labels the last, as the engine's raw rerank score)."""
    pairs = [(query, d) for d in docs]
    out = {}
    for bs in batch_sizes:
        ce.predict(pairs[:bs], batch_size=bs, show_progress_bar=False)  # warm-up: one batch
        times, scores = [], None
        for _ in trange(repeats, desc=f"CrossEncoder bs={bs}", disable=not progress):
            t0 = time.perf_counter()
            scores = ce.predict(pairs, batch_size=bs, show_progress_bar=False)
            times.append(time.perf_counter() - t0)
        scores = np.asarray(scores, np.float64)
        out[bs] = {
            "times_s": times,
            "best_s": min(times),
            "scores": scores[:, -1] if scores.ndim > 1 else scores,
        }
    return out


def baseline_side(base: dict, n: int, eng: dict, peaks: dict, dtype: str) -> dict:
    """The CrossEncoder side: its best batch size, and every batch size's rate. It computes
    the same pairs as the engine (nothing shared), so the same FLOPs."""
    name, tokens = "sentence-transformers CrossEncoder", eng["planned_real_tokens"]
    return sides.per_batch_baseline(name, base, n, eng["flops"], tokens, peaks, dtype)


def summary(report: dict) -> str:
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    return (
        f"engine {common.fmt_side(engine, dtype)}, CrossEncoder ({report['baseline_device']}) "
        f"bs={baseline['batch_size']} {common.fmt_side(baseline, dtype)}, "
        f"ratio {report['ratio']:.2f}x{_fmt_paired(report['paired'])}; "
        f"{common.fmt_startup(engine)}; "
        f"{common.fmt_peaks(report['peak_gflops'])}; "
        f"max |dscore| {report['max_abs_score_diff_vs_baseline']:.3g}"
    )


def _fmt_paired(paired: dict | None) -> str:
    if paired is None:
        return ""
    return (
        f", paired {paired['ratio_median']:.2f}x (median of {paired['rounds']} rounds, "
        f"{paired['ratio_min']:.2f}-{paired['ratio_max']:.2f}, bs={paired['batch_size']})"
    )


def chart(report: dict, png) -> None:
    """The bar chart of a cross-encoder W1 report: engine and CrossEncoder per batch size."""
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    bars = {"engine": engine["items_per_s"]}
    bars |= {
        f"CrossEncoder bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()
    }
    common.bar_chart(
        png,
        f"W1 cross-encoder rerank batch: {report['description']}\n"
        f"{common.report_tag(report)} {dtype}, {report['cores']} CPU cores",
        bars,
        "items/s",
        notes=f"engine/best CrossEncoder = {report['ratio']:.2f}x; MFU engine "
        f"{engine['mfu']:.1%}, CrossEncoder {baseline['mfu']:.1%} of {dtype} peak "
        f"{report['peak_gflops'][dtype]:.0f} GFLOP/s; max |dscore| "
        f"{report['max_abs_score_diff_vs_baseline']:.2g}",
    )


if __name__ == "__main__":
    main()
