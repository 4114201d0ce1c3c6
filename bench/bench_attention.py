"""Packed attention kernels on a W2-like or short-text packing: Pallas, XLA, the dense mask.

    python -m bench.bench_attention [--tokens 2048 8192] [--dtype bfloat16 float32]
    python -m bench.bench_attention --backend gpu --tokens 2048 8192 32768 --shape qwen3-0.6b
    python -m bench.bench_attention --packing texts --shape minilm --kernels cpu xla

Packing "w2" (the default): one 2000-token prompt shared as a prefix by 20-token items, as many
as fit in T tokens, then padding, causal. "texts": an embedder's or cross-encoder's batch, texts
of 8-256 tokens (log-normal around 60, as `bench embed` draws them) each attending to all of
itself. Attention shape of SmolLM2 (H=9, Hkv=3, D=64), Qwen3-0.6B (H=16, Hkv=8, D=128),
all-MiniLM-L6-v2 (H=Hkv=12, D=32) or BERT-base (H=Hkv=12, D=64: ColBERT, SPLADE).
Each kernel is jitted, warmed up, then timed; the median of `--repeats` calls is reported with
the host schedule build time. `--kernels` picks the columns: "pallas" (compiled on GPU/TPU, the
Pallas interpreter on CPU: slow, for debugging only), "mosaic" (the Mosaic GPU form: Hopper and
newer, bfloat16; GPU interpret mode elsewhere), "xla" (block-sparse), "reference" (dense mask,
skipped above `--max-reference-tokens`) and, where built, "cpu" (the native kernel, its widest
build on this CPU) and "cpu-<build>" (one build of it: `score_kernels.cpu.available_isas()`, e.g.
`--kernels cpu-avx512bf16 cpu-amx`).
"""

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.workloads import text_lengths
from score_kernels import (
    ATTENTION,
    AttentionMeta,
    attention_mosaic_gpu,
    attention_pallas,
    cpu,
    devices,
    make_meta,
    pallas,
)
from score_kernels.tuning import BlockSizes

SHAPES = {
    "smollm2": (9, 3, 64),
    "qwen3-0.6b": (16, 8, 128),
    "minilm": (12, 12, 32),
    "bert-base": (12, 12, 64),
}  # H, Hkv, D
DEFAULT_KERNELS = {"cpu": ["xla", "reference"], "gpu": ["pallas", "xla", "reference"]}
DEFAULT_KERNELS["tpu"] = DEFAULT_KERNELS["gpu"]


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


def text_spans(tokens: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(prefix_start, prefix_end, own_start, own_end) i32[T]: texts of 8-256 tokens drawn as
    `bench embed` draws them, packed back to back, each seeing all of itself (no prefix); the
    last text is cut at T."""
    lengths = text_lengths(np.random.default_rng(seed), tokens)
    ends = np.minimum(np.cumsum(lengths), tokens)
    ends = ends[: np.searchsorted(ends, tokens) + 1]
    starts = np.concatenate([[0], ends[:-1]])
    own_start = np.repeat(starts, ends - starts).astype(np.int32)
    own_end = np.repeat(ends, ends - starts).astype(np.int32)
    zeros = np.zeros(tokens, np.int32)
    return zeros, zeros, own_start, own_end


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


def kernel_table(backend: str, block_sizes: BlockSizes | None) -> dict[str, Callable]:
    """The kernels by name, Pallas bound to `backend` (interpreted where it has no lowering)."""
    interpret = backend not in pallas.PLATFORMS
    kernels = dict(ATTENTION)
    kernels["pallas"] = functools.partial(
        attention_pallas,
        interpret=interpret,
        block_sizes=block_sizes,
        platform=None if interpret else backend,
    )
    kernels["mosaic"] = functools.partial(
        attention_mosaic_gpu, interpret=backend != "gpu", block_sizes=block_sizes
    )
    if backend == "cpu" and cpu.AVAILABLE:
        kernels.update({f"cpu-{isa}": NativeBuild(isa) for isa in cpu.available_isas()})
    return kernels


class NativeBuild:
    """The native CPU kernel run in one instruction-set build (chosen at each call's run)."""

    def __init__(self, isa: str):
        self.isa = isa

    def __call__(self, q, k, v, meta, *, scale):
        return cpu.attention_cpu(q, k, v, meta, scale=scale)


def time_kernel(kernel: Callable, qkv, meta: AttentionMeta, head_dim: int, repeats: int) -> float:
    jitted = jax.jit(lambda q, k, v, m: kernel(q, k, v, m, scale=head_dim**-0.5))
    isa = getattr(kernel, "isa", None)

    def run():
        if isa is not None:  # the build is read when the call runs, not when it is traced
            cpu.set_isa(isa)
        return jitted(*qkv, meta)

    try:
        jax.block_until_ready(run())  # warm-up: compiles
        return median_ms(run, repeats)
    finally:
        if isa is not None:
            cpu.set_isa(None)


def bench(tokens: int, dtype: str, args, kernels: dict[str, Callable]) -> dict:
    heads, kv_heads, head_dim = SHAPES[args.shape]
    *spans, own_end = text_spans(tokens) if args.packing == "texts" else (*w2_spans(tokens), None)
    widths = power_of_two_widths(tokens // args.block_size)
    build = lambda: make_meta(
        *spans, block_size=args.block_size, width_buckets=widths, own_end=own_end
    )
    schedule_ms = median_ms(build, args.repeats)
    meta = jax.tree.map(jnp.asarray, build())
    rng = np.random.default_rng(0)
    qkv = tuple(
        jnp.asarray(rng.standard_normal((tokens, h, head_dim)), dtype)
        for h in (heads, kv_heads, kv_heads)
    )
    row = {"tokens": tokens, "dtype": dtype, "schedule_ms": schedule_ms, "ms": {}}
    line = (
        f"T={tokens} {dtype} B={args.block_size} K={meta.block_kv.shape[1]} "
        f"visited={int(meta.block_count.sum())}/{(tokens // args.block_size) ** 2} blocks  "
        f"schedule {schedule_ms:.2f} ms"
    )
    for name in args.kernels:
        if name == "reference" and tokens > args.max_reference_tokens:
            line += f"  reference skipped (T > --max-reference-tokens {args.max_reference_tokens})"
            continue
        row["ms"][name] = time_kernel(kernels[name], qkv, meta, head_dim, args.repeats)
        line += f"  {name} {row['ms'][name]:.2f} ms"
    first = args.kernels[0]
    for name, ms in row["ms"].items():
        if name != first and first in row["ms"]:
            line += f"  {name}/{first} {ms / row['ms'][first]:.2f}x"
    print(line, flush=True)
    return row


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument(
        "--packing",
        default="w2",
        choices=["w2", "texts"],
        help="w2: a shared prompt and short items (causal); texts: short texts, bidirectional",
    )
    parser.add_argument("--block-size", type=int, default=64, help="schedule block B")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--backend",
        choices=["cpu", "gpu", "tpu"],
        default=None,
        help="device to run on (default: JAX's default backend)",
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=None,
        help="columns, first is the baseline of the ratios (default: pallas xla reference on "
        "gpu/tpu, xla reference on cpu)",
    )
    parser.add_argument("--block-q", type=int, default=None, help="Pallas query tile (tuning)")
    parser.add_argument("--block-k", type=int, default=None, help="Pallas key tile (tuning)")
    parser.add_argument("--num-warps", type=int, default=None, help="Triton warps (tuning)")
    parser.add_argument("--num-stages", type=int, default=None, help="Triton stages (tuning)")
    parser.add_argument(
        "--max-reference-tokens",
        type=int,
        default=8192,
        help="skip the dense O(T^2) reference above this many tokens",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return parser, parser.parse_args(argv)


def block_sizes_arg(parser, args) -> BlockSizes | None:
    tiles = (args.block_q, args.block_k)
    if tiles == (None, None):
        return None
    if None in tiles:
        parser.error("--block-q and --block-k go together")
    return BlockSizes(*tiles, num_warps=args.num_warps, num_stages=args.num_stages)


def main(argv: list[str] | None = None) -> None:
    parser, args = parse_args(argv)
    backend = args.backend or devices.backend()
    kernels = kernel_table(backend, block_sizes_arg(parser, args))
    args.kernels = args.kernels or DEFAULT_KERNELS.get(backend, ["xla", "reference"])
    unknown = sorted(set(args.kernels) - set(kernels))
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {sorted(kernels)}")
    device = jax.devices(backend)[0]
    print(f"jax {jax.__version__} on {backend} ({device.device_kind}), shape {args.shape}")
    rows = []
    with jax.default_device(device):
        for dtype in args.dtype:
            for tokens in args.tokens:
                rows.append(bench(tokens, dtype, args, kernels))
    if args.json:
        report = {"backend": backend, "device": device.device_kind, "shape": args.shape}
        args.json.write_text(json.dumps({**report, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
