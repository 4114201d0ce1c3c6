"""Packed attention kernels on a W2-like packing: the dense reference against the XLA kernel.

    python -m bench.bench_attention [--tokens 2048 8192] [--dtype bfloat16 float32]

Packing: one 2000-token prompt shared as a prefix by 20-token items, as many as fit in T tokens,
then padding. SmolLM2 attention shape (H=9, Hkv=3, D=64). Each kernel is jitted, warmed up, then
timed; the median of `--repeats` calls is reported with the host schedule build time.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernels import ATTENTION, AttentionMeta, make_meta

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def w2_spans(
    tokens: int, prompt_len: int = 2000, item_len: int = 20
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefix_start, prefix_end, own_start) i32[T]: prompt, items of `item_len`, padding."""
    items = max(0, (tokens - prompt_len) // item_len)
    used = prompt_len + items * item_len
    t = np.arange(tokens, dtype=np.int32)
    in_item = (t >= prompt_len) & (t < used)
    prefix_end = np.where(in_item, prompt_len, 0)
    own_start = np.where(in_item, prompt_len + (t - prompt_len) // item_len * item_len, 0)
    padding = t >= used
    prefix_start = np.where(padding, t, 0)
    prefix_end = np.where(padding, t, prefix_end)
    own_start = np.where(padding, t, own_start)
    return tuple(a.astype(np.int32) for a in (prefix_start, prefix_end, own_start))


def power_of_two_widths(blocks: int) -> tuple[int, ...]:
    widths = [1]
    while widths[-1] < blocks:
        widths.append(widths[-1] * 2)
    return tuple(widths)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_kernel(name: str, qkv, meta: AttentionMeta, repeats: int) -> float:
    kernel = jax.jit(lambda q, k, v, m: ATTENTION[name](q, k, v, m, scale=HEAD_DIM**-0.5))
    run = lambda: kernel(*qkv, meta)
    jax.block_until_ready(run())  # warm-up: compiles
    return median_ms(run, repeats)


def bench(tokens: int, dtype: str, block_size: int, repeats: int, max_reference: int) -> None:
    spans = w2_spans(tokens)
    widths = power_of_two_widths(tokens // block_size)
    build = lambda: make_meta(*spans, block_size=block_size, width_buckets=widths)
    schedule_ms = median_ms(build, repeats)
    meta = jax.tree.map(jnp.asarray, build())
    rng = np.random.default_rng(0)
    qkv = tuple(
        jnp.asarray(rng.standard_normal((tokens, heads, HEAD_DIM)), dtype)
        for heads in (HEADS, KV_HEADS, KV_HEADS)
    )
    xla_ms = time_kernel("xla", qkv, meta, repeats)
    line = (
        f"T={tokens} {dtype} B={block_size} K={meta.block_kv.shape[1]} "
        f"visited={int(meta.block_count.sum())}/{(tokens // block_size) ** 2} blocks  "
        f"schedule {schedule_ms:.2f} ms  xla {xla_ms:.1f} ms"
    )
    if tokens <= max_reference:
        reference_ms = time_kernel("reference", qkv, meta, repeats)
        line += f"  reference {reference_ms:.1f} ms  reference/xla {reference_ms / xla_ms:.2f}x"
    else:
        line += f"  reference skipped (T > --max-reference-tokens {max_reference})"
    print(line, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--max-reference-tokens",
        type=int,
        default=8192,
        help="skip the dense O(T^2) reference above this many tokens",
    )
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.default_backend()}")
    for dtype in args.dtype:
        for tokens in args.tokens:
            bench(tokens, dtype, args.block_size, args.repeats, args.max_reference_tokens)


if __name__ == "__main__":
    main()
