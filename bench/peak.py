"""The machine's matmul peak, measured in the run that reports MFU against it.

The bf16 peak is the fastest square GEMM any path on this machine reaches (bf16 inputs, f32
accumulation): XLA's dot, the native bf16 kernel and oneDNN's matmul on weights packed
once (the engine's dense strategies, where they run), and torch's matmul (oneDNN, the reference
library) when torch is installed. No single path is fastest on every CPU (on Intel CPUs with AMX
the native kernel reaches a third of what oneDNN does), so MFU against the best of them means
the same on every machine. f32 is XLA's dot. Each size's best of `repeats` timed calls after a
warm-up; a path's peak is its best size. The report names the CPU and its matrix instructions.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from bench.common import timed
from engine.plan.devices import gemm_gflops
from score_kernels import dense, dense_choice, dense_runs, devices


def measure_peaks(sizes=(1024, 2048, 4096), repeats: int = 5) -> dict:
    """{"bfloat16": GFLOP/s, "float32": GFLOP/s, "bfloat16_path": the fastest path's name,
    "by_path": {path: {size: GFLOP/s}}, "cpu": model, "matrix_isa": ...}."""
    by_path = {"xla": {n: gemm_gflops(n, jnp.bfloat16, repeats) for n in sizes}}
    for name in ("cpu", "onednn"):
        if dense_runs(name, devices.backend(), dtype=jnp.bfloat16):
            by_path[name] = {n: packed_gflops(dense.STRATEGIES[name], n, repeats) for n in sizes}
    if (torch_peak := torch_gflops(sizes, repeats)) is not None:
        by_path["torch"] = torch_peak
    best = {path: max(v.values()) for path, v in by_path.items()}
    fastest = max(best, key=best.get)
    facts = dense_choice.machine()
    return {
        "bfloat16": best[fastest],
        "float32": max(gemm_gflops(n, jnp.float32, repeats) for n in sizes),
        "bfloat16_path": fastest,
        "by_path": by_path,
        "cpu": facts["cpu"],
        "matrix_isa": dense_choice.matrix_isa(facts["flags"]),
    }


def packed_gflops(strategy: dense.Dense, n: int, repeats: int) -> float:
    """An n x n x n product through a dense strategy, its weights prepared (packed) first."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, n), np.float32), jnp.bfloat16)
    w = strategy.prepare(rng.standard_normal((1, n, n), np.float32), jnp.bfloat16)
    f = jax.jit(lambda x, w: strategy.matmul(x, w, jnp.int32(0)))
    return 2 * n**3 / _best(lambda: f(x, w).block_until_ready(), repeats) / 1e9


# seconds: a reference GEMM call slower than this ends the sizes timed. On a CPU without AVX-512
# torch's bf16 matmul is a scalar loop on one core (about 1 GFLOP/s on an AVX2 AMD EPYC): its
# 4096^3 products alone would take the peak's measurement past half an hour.
SLOW_CALL_S = 2.0


def torch_gflops(sizes, repeats: int) -> dict[int, float] | None:
    """torch's bf16 matmul per size on every core this process may use, None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    out = {}
    for n in sizes:
        a, b = (torch.randn(n, n, dtype=torch.bfloat16) for _ in range(2))
        call = lambda a=a, b=b: torch.matmul(a, b)
        first = timed(call)  # the warm-up, and the only call where it is this slow
        if first > SLOW_CALL_S:  # no fast bf16 path here: one call stands, larger ones are skipped
            out[n] = 2 * n**3 / first / 1e9
            break
        out[n] = 2 * n**3 / min(first, *(timed(call) for _ in range(repeats))) / 1e9
    return out


def _best(call, repeats: int) -> float:
    call()  # warm-up
    return min(timed(call) for _ in range(repeats))
