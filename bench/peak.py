"""The machine's matmul peak, measured in the run that reports MFU against it.

Square GEMMs in JAX per dtype (`engine.plan.devices.gemm_gflops`): bf16 inputs with f32
accumulation (the engine's bf16 path) and f32. Each size's best of `repeats` timed calls after a
warm-up, in GFLOP/s; the peak is the best size (on this CPU 2048 beats 4096 by ~25%, so one size
alone would understate the peak).
"""

import jax.numpy as jnp

from engine.plan.devices import gemm_gflops


def measure_peaks(sizes=(1024, 2048, 4096), repeats: int = 5) -> dict:
    """{"bfloat16": GFLOP/s, "float32": GFLOP/s, "by_size": {...}}: the best over `sizes`."""
    by_size = {
        name: {n: gemm_gflops(n, dtype, repeats) for n in sizes}
        for name, dtype in (("bfloat16", jnp.bfloat16), ("float32", jnp.float32))
    }
    return {name: max(v.values()) for name, v in by_size.items()} | {"by_size": by_size}
