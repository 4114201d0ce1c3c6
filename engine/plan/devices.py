"""The devices a plan is made for: this machine's CPU, measured, and accelerators from their
published figures (dense matmul peak per dtype, memory bandwidth, memory per chip)."""

import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from score_kernels import devices


class Device(NamedTuple):
    """One chip as the roofline sees it."""

    name: str
    peak: dict[str, float]  # dtype name -> dense matmul FLOP/s
    bandwidth: float  # memory bytes/s
    memory: int  # bytes
    source: str  # where the figures come from


# Dense (not sparse) peaks from the vendors' datasheets. f32 on a TPU is its bf16 MXU at
# precision HIGHEST (6 passes); on Hopper, the CUDA cores' FP32 (exact f32, no TF32).
PUBLISHED: dict[str, Device] = {
    "h100": Device(
        "NVIDIA H100 SXM5 80GB",
        {"bfloat16": 989e12, "float32": 67e12},
        3.35e12,
        80 * 10**9,
        "NVIDIA H100 datasheet: BF16 tensor 989 TFLOP/s dense, FP32 67 TFLOP/s, HBM3 3.35 TB/s",
    ),
    "h200": Device(
        "NVIDIA H200 SXM 141GB",
        {"bfloat16": 989e12, "float32": 67e12},
        4.8e12,
        141 * 10**9,
        "NVIDIA H200 datasheet: BF16 tensor 989 TFLOP/s dense, FP32 67 TFLOP/s, HBM3e 4.8 TB/s",
    ),
    "tpu-v5e": Device(
        "Google TPU v5e",
        {"bfloat16": 197e12, "float32": 197e12 / 6},
        819e9,
        16 * 2**30,
        "Cloud TPU v5e docs: 197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s",
    ),
    "tpu-v6e": Device(
        "Google TPU v6e (Trillium)",
        {"bfloat16": 918e12, "float32": 918e12 / 6},
        1640e9,
        32 * 2**30,
        "Cloud TPU v6e docs: 918 TFLOP/s bf16, 32 GiB HBM at 1640 GB/s",
    ),
}
KINDS = ("cpu", *PUBLISHED)


def kinds_for_this_host() -> tuple[str, ...]:
    """The kinds a loaded program is planned on here: the published accelerators, and this CPU
    when the program runs on it."""
    return KINDS if devices.backend() == "cpu" else tuple(PUBLISHED)


def gemm_gflops(n: int, dtype, repeats: int) -> float:
    """Best GFLOP/s of an n x n x n matmul in `dtype` (f32 accumulation) over `repeats` calls,
    after a warm-up call that compiles it."""
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n), np.float32), dtype) for _ in range(2))
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    return 2 * n**3 / _best_seconds(lambda: f(a, b).block_until_ready(), repeats) / 1e9


def copy_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Best bytes/s of an elementwise pass over `mib` MiB (read once, written once)."""
    x = jnp.ones(mib * 2**20 // 4, jnp.float32)
    f = jax.jit(lambda a: a * 1.5)
    f(x).block_until_ready()
    return 2 * x.nbytes / _best_seconds(lambda: f(x).block_until_ready(), repeats)


def measure_cpu(gemm_size: int = 2048, repeats: int = 3) -> Device:
    """This machine's CPU: matmul peak per dtype and copy bandwidth measured now, memory from
    the OS."""
    peak = {
        name: gemm_gflops(gemm_size, dtype, repeats) * 1e9
        for name, dtype in (("bfloat16", jnp.bfloat16), ("float32", jnp.float32))
    }
    memory = devices.host_memory()
    source = f"measured here: {gemm_size}^3 GEMM best of {repeats}, {os.cpu_count()} cores"
    return Device("this machine's CPU", peak, copy_bandwidth(), memory, source)


def device(kind: str) -> Device:
    """The device of `kind` ("cpu" is measured); ValueError for an unknown kind."""
    if kind == "cpu":
        return measure_cpu()
    if kind not in PUBLISHED:
        raise ValueError(f"unknown device {kind!r}; known: {list(KINDS)}")
    return PUBLISHED[kind]


def _best_seconds(f, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best
