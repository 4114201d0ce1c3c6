"""The two sides of a workload: the engine (through `open_engine`, as a served request would go)
and the transformers baseline (torch on `--baseline-device`, same weights, same dtype,
`logits_to_keep=1`).

Timing excludes warm-up on both sides: the engine compiles its bucket grid at start and runs the
request once untimed, and its KV cache is flushed before each timed pass (a rerun of the same
request would otherwise read its prompt from the cache); the baseline runs one batch of each
batch size untimed. The engine's start-up (load and bucket-grid compile, the programs read from
JAX's persistent compile cache where it holds them) is reported on its own. The engine's
tokenizer cache is off, so each timed pass tokenises its texts as new traffic would; the baseline
gets the same token ids already tokenised (its tokenisation is not timed).
"""

import sys
import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np
import trio
from tqdm import tqdm, trange

from bench import common
from bench.baseline import hf_label_logprobs, load_transformers
from bench.flops import Cost, plan_flops
from engine import EngineConfig, open_engine
from engine.host import planning
from engine.messages import ScoreRequest


def engine_config(args, path) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        dtype=args.dtype,
        dense=args.dense,
        attention=args.attention,
        tensor_parallel=args.tensor_parallel,
        token_budget=args.token_budget,
        tokenizer_cache_size=0,
        precompile=not args.no_precompile,
        progress=not args.no_progress,
    )


def run_engine(config: EngineConfig, build: Callable, repeats: int) -> dict:
    """One `Engine.score` request: warm-up, then `repeats` timed passes.

    `build(engine)` makes the request `(query, items, labels)` from the started engine (its
    tokenizer); the result holds it under "request" for the baseline.
    """
    return trio.run(_run_engine, config, build, repeats)


def dense_facts(engine) -> dict:
    """The engine's dense path, and what its measured default chose (None when forced)."""
    info = engine.info()
    choice = info.dense_choice
    return {
        "dense": info.dense,
        "dense_choice": msgspec.to_builtins(choice) if choice is not None else None,
    }


async def _run_engine(config, build, repeats) -> dict:
    start = time.perf_counter()
    async with open_engine(config) as engine:
        startup_s = time.perf_counter() - start
        startup_compiles = engine.stats().compiles  # the bucket grid, compiled before serving
        query, items, labels = build(engine)
        warm = await engine.score(query, items, labels)  # warm-up: first run of this request
        before = engine.stats()
        times = []
        for _ in trange(repeats, desc="engine", disable=not config.progress):
            engine.flush_cache()  # each pass computes the request as new traffic would
            t0 = time.perf_counter()
            await engine.score(query, items, labels)
            times.append(time.perf_counter() - t0)
        after = engine.stats()
        seqs = engine_sequences(engine, query, items, labels)
        plan = planning.plan(seqs, token_budget=config.token_budget, buckets=engine.buckets)
        cost = Cost.of(engine.model_config)
        per_pass = lambda name: (getattr(after, name) - getattr(before, name)) / repeats
        return {
            "startup_s": startup_s,
            "startup_compiles": startup_compiles,
            **dense_facts(engine),
            "compiles": after.compiles,
            "times_s": times,
            "best_s": min(times),
            "logprobs": np.log(np.asarray(warm.scores, np.float64)),
            "seqs": seqs,
            "flops": plan_flops(cost, plan, seqs),
            "planned_real_tokens": sum(planning.real_tokens(b, seqs) for b in plan),
            "real_tokens": per_pass("real_tokens"),
            "padded_tokens": per_pass("padded_tokens"),
            "batches": per_pass("batches"),
            "device_busy_s": per_pass("device_busy_s"),
            "cost": cost,
            "config": engine.model_config,
            "request": (query, items, labels),
        }


def engine_sequences(engine, query, items, labels) -> list[list[int]]:
    """The token sequences the engine's tokenizer makes of a score request."""
    return engine.sequences(ScoreRequest(query=query, items=items, label_token_ids=labels))


def run_padded_baseline(
    hf, seqs: Sequence[Sequence[int]], labels: list[int], batch_sizes, repeats: int, progress: bool
) -> dict[int, dict]:
    """transformers over `seqs` in left-padded batches, per batch size: the best of `repeats`.

    Sequences are sorted by length first (longest first), as a careful user would, so a batch
    pads to its own longest member; batch size 1 pads nothing. Log-probs come back in input order.
    """
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    ordered = [seqs[i] for i in order]

    def run(bs: int) -> dict:
        hf_label_logprobs(hf, ordered[:bs], labels, bs)  # warm-up: one batch
        times, logprobs = [], None
        for _ in trange(repeats, desc=f"transformers bs={bs}", disable=not progress):
            t0 = time.perf_counter()
            logprobs = hf_label_logprobs(hf, ordered, labels, bs)
            times.append(time.perf_counter() - t0)
        unsorted = np.empty_like(logprobs)
        unsorted[order] = logprobs
        padded = sum(
            len(ordered[i]) * len(ordered[i : i + bs]) - sum(map(len, ordered[i : i + bs]))
            for i in range(0, len(ordered), bs)
        )
        return {"times_s": times, "best_s": min(times), "logprobs": unsorted, "padded": padded}

    return each_batch_size_that_fits(batch_sizes, run)


def each_batch_size_that_fits(batch_sizes, run: Callable[[int], dict]) -> dict[int, dict]:
    """`run(bs)` per batch size, leaving out with a warning each that runs out of the
    baseline device's memory (a GPU shared with the engine); at least one must fit."""
    import torch

    out, tried = {}, []
    for bs in batch_sizes:
        tried.append(bs)
        try:
            out[bs] = run(bs)
        except torch.OutOfMemoryError:
            print(f"transformers bs={bs}: out of device memory, left out", file=sys.stderr)
        torch.cuda.empty_cache()  # a no-op without CUDA
    if not out:
        raise RuntimeError(f"transformers: every batch size {tried} ran out of device memory")
    return out


def best_batch(results: dict[int, dict]) -> int:
    return min(results, key=lambda bs: results[bs]["best_s"])


def per_batch_baseline(
    name: str, base: dict, n: int, flops: float, tokens: int, peaks: dict, dtype: str
) -> dict:
    """A baseline timed at several batch sizes (`base`: batch size -> its `best_s` and
    `times_s`): its best batch size with the rates of `n` items, `flops` and `tokens` there,
    and every batch size's rate."""
    bs = best_batch(base)
    return {
        "name": name,
        "batch_size": bs,
        "items_per_s": n / base[bs]["best_s"],
        **common.summary_numbers(flops, base[bs]["best_s"], tokens, peaks, dtype),
        "flops": flops,
        "per_batch_size": {
            b: {"items_per_s": n / r["best_s"], "times_s": r["times_s"]} for b, r in base.items()
        },
    }


def prefix_reuse_logprobs(hf, prompt: list[int], items: list[list[int]], labels, bs: int):
    """transformers with the prompt run once (`use_cache=True`), then the items in batches of
    `bs` on a copy of its KV cache expanded to the batch, positions continuing after the prompt.

    Items must all have the same length (no padding inside the batch). Log-probs f64[N, L].
    """
    import torch
    from transformers import DynamicCache

    n = len(items[0])
    if any(len(it) != n for it in items):
        raise ValueError("prefix reuse baseline: items must have equal lengths")
    p = len(prompt)
    out = []
    device = hf.device
    with torch.no_grad():
        cache = hf(
            input_ids=torch.tensor([prompt], device=device), use_cache=True, logits_to_keep=1
        ).past_key_values
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        positions = torch.arange(p, p + n, device=device).unsqueeze(0)
        for i in range(0, len(items), bs):
            chunk = torch.tensor(items[i : i + bs], device=device)
            b = chunk.shape[0]
            # DynamicCache copies its inputs (cat onto an empty tensor): the prompt cache stays
            batch_cache = DynamicCache(
                [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv]
            )
            logits = hf(
                input_ids=chunk,
                attention_mask=torch.ones((b, p + n), dtype=torch.long, device=device),
                position_ids=positions.expand(b, -1),
                past_key_values=batch_cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
            out.append(torch.log_softmax(logits.double(), -1)[:, labels].cpu().numpy())
    return np.concatenate(out)


def run_prefix_baseline(hf, prompt, items, labels, batch_sizes, repeats, progress) -> dict:
    """Per batch size: the best of `repeats` full passes (prompt + all items), and log-probs."""

    def run(bs: int) -> dict:
        prefix_reuse_logprobs(hf, prompt, items[:bs], labels, bs)  # warm-up
        times, logprobs = [], None
        for _ in trange(repeats, desc=f"transformers prefix bs={bs}", disable=not progress):
            t0 = time.perf_counter()
            logprobs = prefix_reuse_logprobs(hf, prompt, items, labels, bs)
            times.append(time.perf_counter() - t0)
        return {"times_s": times, "best_s": min(times), "logprobs": logprobs}

    return each_batch_size_that_fits(batch_sizes, run)


def run_naive_sample(hf, seqs, labels, batch_sizes, progress) -> dict:
    """Seconds per item of full-sequence scoring, timed on `seqs` (a sample), per batch size."""
    hf_label_logprobs(hf, seqs[:1], labels, 1)  # warm-up: one sequence

    def run(bs: int) -> dict:
        t0 = time.perf_counter()
        logprobs = hf_label_logprobs(hf, seqs, labels, bs)
        seconds = time.perf_counter() - t0
        return {"best_s": seconds, "s_per_item": seconds / len(seqs), "logprobs": logprobs}

    sizes = tqdm(batch_sizes, desc="transformers naive", disable=not progress)
    return each_batch_size_that_fits(sizes, run)


def load_baseline(path, dtype: str, device: str = "cpu"):
    return load_transformers(path, dtype, device)
