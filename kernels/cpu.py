"""Fused packed two-span attention for the CPU: a native XLA custom call.

XLA on the CPU cannot fuse QK^T, the mask, the softmax and PV, so the score matrix makes several
round trips through memory and attention runs memory-bound at a small fraction of the matmul
peak. This kernel (`_native/attention.cc`) keeps each 64-key score tile in cache and fuses the
whole chain, with an online softmax in f32. It reads only the per-token spans, not the block
schedule: each tile of queries visits the key tiles its tokens' spans touch.

`AVAILABLE` is False when the native module was not built or the head dim is unsupported; the
registry then falls back to the portable XLA kernel.
"""

import jax
import numpy as np

from kernels.metadata import AttentionMeta

try:
    from _native import _attention
except ImportError:  # a source checkout without the compiled extension
    _attention = None

TARGET = "packed_attention"
HEAD_DIMS = (64, 128)
DTYPES = (np.dtype(jax.numpy.bfloat16), np.dtype(np.float32))
AVAILABLE = _attention is not None
if AVAILABLE:
    jax.ffi.register_ffi_target(TARGET, _attention.handler(), platform="cpu")


def supports(head_dim: int, dtype) -> bool:
    """Whether the native kernel handles this head dim and dtype."""
    return AVAILABLE and head_dim in HEAD_DIMS and np.dtype(dtype) in DTYPES


def set_threads(threads: int) -> None:
    """Worker threads per attention call; 0 (the default) uses every online core."""
    _native_module().set_threads(threads)


def available_isas() -> tuple[str, ...]:
    """Instruction-set builds of the kernel this CPU can run, narrowest first: "portable",
    "avx2", "avx512", "avx512bf16" (bf16 inputs use BF16 dot products there)."""
    return _native_module().available_isas()


def set_isa(name: str | None) -> None:
    """Run build `name` from now on (for tests and comparisons); None picks the widest."""
    _native_module().set_isa(name)


def isa() -> str:
    """The build attention calls use now."""
    return _native_module().isa()


def _native_module():
    if not AVAILABLE:
        raise RuntimeError("the native CPU attention kernel was not built")
    return _attention


def attention_cpu(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
) -> jax.Array:  # [T, H, D] in q's dtype
    """Attention over the prefix span and causal own span of every token, on the CPU.

    Query head h reads kv head `h // (H // Hkv)`; q, k and v share a dtype (bfloat16 or
    float32); D is 64 or 128. Scores, softmax and accumulation are f32.
    """
    if not supports(q.shape[-1], q.dtype):
        raise ValueError(
            f"the CPU attention kernel takes head_dim in {HEAD_DIMS} and bfloat16/float32, "
            f"got head_dim {q.shape[-1]} and {q.dtype}"
        )
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q, k, v, meta.prefix_start, meta.prefix_end, meta.own_start, scale=np.float32(scale)
    )
