"""Fused packed two-span attention for the CPU: a native XLA custom call.

XLA on the CPU cannot fuse QK^T, the mask, the softmax and PV, so the score matrix makes several
round trips through memory and attention runs memory-bound at a small fraction of the matmul
peak. This kernel (`_native/attention.cc`) keeps each score tile (64 or 128 keys) in cache and
fuses the whole chain, with an online softmax in f32. It reads only the per-token spans, not the
block schedule: each tile of queries visits the key tiles its tokens' spans touch.

`AVAILABLE` is False when the native module was not built or the head dim is unsupported; the
registry then falls back to the portable XLA kernel.
"""

import jax
import numpy as np

from score_kernels import activations
from score_kernels.host import aligned_empty
from score_kernels.metadata import AttentionMeta
from score_kernels.paging import LayerPool, bits_dtype
from score_kernels.quant import ACT_BLOCK

try:
    from _native import _cpu
except ImportError:  # a source checkout without the compiled extension
    _cpu = None

TARGET = "packed_attention"
HEAD_DIMS = (32, 64, 128)
DTYPES = (np.dtype(jax.numpy.bfloat16), np.dtype(np.float32))
AVAILABLE = _cpu is not None
if AVAILABLE:
    jax.ffi.register_ffi_target(TARGET, _cpu.attention_handler(), platform="cpu")


def supports(head_dim: int, dtype) -> bool:
    """Whether the native kernel handles this head dim and dtype."""
    return AVAILABLE and head_dim in HEAD_DIMS and np.dtype(dtype) in DTYPES


def set_threads(threads: int) -> None:
    """Worker threads per native kernel call (attention and dense); 0 (the default) uses every
    core this process may run on (its affinity mask)."""
    _native_module().set_threads(threads)


def available_isas() -> tuple[str, ...]:
    """Instruction-set builds of the kernel this CPU can run, narrowest first: "portable",
    "avx2", "avx512", "avx512bf16" (bf16 inputs use BF16 dot products there), "amx" (bf16's
    QK^T and PV on AMX-BF16 tiles, the softmax as in "avx512bf16")."""
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
    return _cpu


def attention_cpu(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
) -> jax.Array:  # [T, H, D] in q's dtype
    """Attention over the prefix span and own span of every token, on the CPU.

    Query head h reads kv head `h // (H // Hkv)`; q, k and v share a dtype (bfloat16 or
    float32); D is 32, 64 or 128. Scores, softmax and accumulation are f32. The context region's
    keys are read in place from `pool`'s pages through `meta.context_pages`. It has no score
    soft-capping (`softcap` must be 0; Gemma 2's attention takes another implementation).
    """
    if softcap:
        raise ValueError("the CPU attention kernel has no score soft-capping: use 'xla'")
    if not supports(q.shape[-1], q.dtype):
        raise ValueError(
            f"the CPU attention kernel takes head_dim in {HEAD_DIMS} and bfloat16/float32, "
            f"got head_dim {q.shape[-1]} and {q.dtype}"
        )
    if pool is None:
        if meta.context_pages.shape[0]:
            raise ValueError("the metadata names context pages but no KV pool was given")
        empty = jax.numpy.zeros((1, 1, 1, *k.shape[1:]), bits_dtype(k.dtype))
        pool = LayerPool(empty, empty, jax.numpy.zeros((), np.int32))
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q,
        k,
        v,
        pool.k,
        pool.v,
        jax.numpy.asarray(pool.layer, np.int32),
        jax.numpy.asarray(meta.context_pages, np.int32),
        meta.prefix_start,
        meta.prefix_end,
        meta.own_start,
        meta.own_end,
        scale=np.float32(scale),
    )


DENSE_TARGET, GATED_TARGET, ACTIVATED_TARGET = "packed_dense", "packed_gated", "packed_activated"
QKV_TARGET, ADD_TARGET = "packed_qkv", "packed_dense_add"
# f32 outputs of at least this many bytes are written with streaming stores by the dense and
# int8 kernels (past the caches, which could not keep them for their reader anyway)
STREAM_BYTES = _cpu.stream_bytes() if AVAILABLE else 0
DENSE_AVAILABLE = AVAILABLE and _cpu.dense_isa() is not None
if DENSE_AVAILABLE:
    jax.ffi.register_ffi_target(DENSE_TARGET, _cpu.dense_handler(), platform="cpu")
    jax.ffi.register_ffi_target(GATED_TARGET, _cpu.gated_handler(), platform="cpu")
    jax.ffi.register_ffi_target(ACTIVATED_TARGET, _cpu.activated_handler(), platform="cpu")
    jax.ffi.register_ffi_target(QKV_TARGET, _cpu.qkv_handler(), platform="cpu")
    jax.ffi.register_ffi_target(ADD_TARGET, _cpu.add_handler(), platform="cpu")
F32_TARGET = "dense_f32"
F32_AVAILABLE = AVAILABLE and _cpu.f32_isa() is not None
if F32_AVAILABLE:
    jax.ffi.register_ffi_target(F32_TARGET, _cpu.f32_handler(), platform="cpu")


def dense_supports(k: int, n: int, dtype=jax.numpy.bfloat16) -> bool:
    """Whether a native dense kernel takes a [K, N] weight of `dtype`: the bf16 kernel (AVX2 or
    AVX512-BF16) or the f32 one (AVX2 or AVX-512)."""
    if np.dtype(dtype) == np.float32:
        return F32_AVAILABLE and n % 16 == 0
    return DENSE_AVAILABLE and np.dtype(dtype) == jax.numpy.bfloat16 and k % 2 == 0 and n % 16 == 0


def dense_isas() -> tuple[str, ...]:
    """Builds of the bf16 dense kernel this CPU can run, narrowest first: "avx2" (f32 FMAs on
    the widened bf16 values), "avx512bf16" (the hardware bf16 dot product), "amx" (AMX-BF16 tiles;
    the widest where the CPU and the kernel let this process use them)."""
    return _native_module().dense_isas()


def set_dense_isa(name: str | None) -> None:
    """Run bf16 dense build `name` from now on (for tests and comparisons); None picks the
    widest."""
    _native_module().set_dense_isa(name)


def dense_isa() -> str | None:
    """The build bf16 dense calls use now."""
    return _native_module().dense_isa()


def f32_isas() -> tuple[str, ...]:
    """Builds of the f32 dense kernel this CPU can run, narrowest first: "avx2", "avx512"."""
    return _native_module().f32_isas()


def set_f32_isa(name: str | None) -> None:
    """Run f32 dense build `name` from now on (for tests and comparisons); None picks the
    widest."""
    _native_module().set_f32_isa(name)


def f32_isa() -> str | None:
    """The build f32 dense calls use now."""
    return _native_module().f32_isa()


def pack_dense(w, dtype=jax.numpy.bfloat16) -> np.ndarray:
    """Weights [..., K, N] packed for `dense_cpu`. bfloat16: bf16 [..., N/16, K/2, 32], per
    16-column group and row pair (k, k+1) the columns' (w[k, n], w[k+1, n]) pairs; float32:
    f32 [..., N/16, K, 16], per 16-column group its K rows. The result is aligned for
    `score_kernels.host.to_device`."""
    w = np.asarray(w)
    *lead, k, n = w.shape
    if np.dtype(dtype) == np.float32:
        out = aligned_empty((*lead, n // 16, k, 16), np.float32)
        out[...] = np.swapaxes(
            w.astype(np.float32, copy=False).reshape(*lead, k, n // 16, 16), -3, -2
        )
        return out
    out = aligned_empty((*lead, n // 16, k // 2, 16, 2), jax.numpy.bfloat16)
    _pack_into(out, w)
    return out.reshape(*lead, n // 16, k // 2, 32)


def pack_gated(w_gate, w_up) -> np.ndarray:
    """Gate and up weights [..., K, I] packed for `gated_cpu` as bf16 [..., 2I/16, K/2, 32]:
    `pack_dense` of each, their 16-column groups interleaved (gate, up, gate, up, ...)."""
    gate, up = np.asarray(w_gate), np.asarray(w_up)
    *lead, k, i = gate.shape
    out = aligned_empty((*lead, i // 16, 2, k // 2, 16, 2), jax.numpy.bfloat16)
    _pack_into(out[..., 0, :, :, :], gate)
    _pack_into(out[..., 1, :, :, :], up)
    return out.reshape(*lead, 2 * (i // 16), k // 2, 32)


def _pack_into(out: np.ndarray, w: np.ndarray) -> None:
    """`w` [..., K, N] rounded to bf16 and written to `out` [..., N/16, K/2, 16, 2]."""
    *lead, k, n = w.shape
    # round once in memory order, then move 16-column runs as raw 16-bit words (numpy copies
    # those far faster than a strided cast or a bf16-typed copy)
    rows = w.astype(jax.numpy.bfloat16).view(np.uint16).reshape(*lead, k // 2, 2, n // 16, 16)
    words = out.view(np.uint16)
    for half in range(2):  # row k, then row k + 1 of each pair
        words[..., half] = np.swapaxes(rows[..., half, :, :], -3, -2)


def dense_cpu(
    x: jax.Array,  # [M, K], cast to w's dtype
    w: jax.Array,  # bf16[L, N/16, K/2, 32] or f32[L, N/16, K, 16] from `pack_dense`
    layer: jax.Array,  # i32[]: which of the L matrices
    rows: jax.Array | None = None,  # i32[]: the real rows of x, the first ones (None: all)
) -> jax.Array:  # f32[M, N]
    """`x @ W[layer]` on the CPU in the weights' dtype: bf16 inputs with exact f32 products,
    or f32 inputs with fused multiply-adds; f32 accumulation in order over K. Rows of x past
    `rows` (a batch's padding) are not multiplied: their output rows are zeros."""
    m, k = x.shape
    f32 = w.dtype == np.float32
    depth, width = (k, 16) if f32 else (k // 2, 32)  # w's last two dimensions
    if w.ndim != 4 or w.shape[2] != depth or w.shape[3] != width or (not f32 and k % 2):
        raise ValueError(f"dense_cpu: weights of shape {w.shape} do not take x of shape {x.shape}")
    out = jax.ShapeDtypeStruct((m, w.shape[1] * 16), np.float32)
    call = jax.ffi.ffi_call(F32_TARGET if f32 else DENSE_TARGET, out)
    return call(x.astype(w.dtype), w, jax.numpy.asarray(layer, np.int32), _rows(rows, m))


def dense_add_cpu(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # bf16[L, N/16, K/2, 32] from `pack_dense`
    layer: jax.Array,  # i32[]
    residual: jax.Array,  # f32[M, N]
    bias: jax.Array | None = None,  # f32[N]
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
) -> jax.Array:  # f32[M, N]
    """`(residual + x @ W[layer]) + bias` in f32, added as the product is written (a layer's
    output projection onto its residual stream): the sums as `dense_cpu` computes them, and
    the additions as XLA's f32 adds in that order. Rows past `rows` are zeros."""
    m, k = x.shape
    if w.dtype != jax.numpy.bfloat16 or w.ndim != 4 or w.shape[2] * 2 != k or w.shape[3] != 32:
        raise ValueError(f"dense_add_cpu: weights {w.dtype}{w.shape} do not take x of {x.shape}")
    out, tail = _residual_operands("dense_add_cpu", m, w, residual, bias)
    # written over the residual's buffer where XLA may reuse it (the stream's old value is
    # dead after the add): each line is read and written once, instead of read, its fresh
    # output line fetched before writing and written, in freshly allocated pages
    call = jax.ffi.ffi_call(ADD_TARGET, out, input_output_aliases={4: 0})
    layer = jax.numpy.asarray(layer, np.int32)
    return call(x.astype(jax.numpy.bfloat16), w, layer, _rows(rows, m), *tail)


def _residual_operands(name: str, m: int, w, residual, bias):
    """The shape of a residual call's output (f32[M, N]) and its operands after the common
    ones: the residual f32[M, N] and the bias f32[N] (empty where None); raises ValueError naming
    `name` where they do not fit the weights' N columns."""
    n = w.shape[1] * 16
    if residual.shape != (m, n) or (bias is not None and bias.shape != (n,)):
        bias_shape = None if bias is None else bias.shape
        raise ValueError(f"{name}: residual {residual.shape}, bias {bias_shape} for {m}x{n}")
    bias = np.zeros(0, np.float32) if bias is None else bias
    f32 = lambda t: jax.numpy.asarray(t, np.float32)
    return jax.ShapeDtypeStruct((m, n), np.float32), (f32(residual), f32(bias))


def gated_cpu(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # bf16[L, 2I/16, K/2, 32] from `pack_gated`
    layer: jax.Array,  # i32[]
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
    activation: str = "silu",  # a name of `score_kernels.activations.FUNCTIONS`
) -> jax.Array:  # bf16[M, I]
    """`act(x @ W_gate) * (x @ W_up)` of layer `layer`, rounded to bf16 once: a gated MLP's
    input of the down projection (SwiGLU, GeGLU), with f32 products, accumulation and
    activation (as `activated_cpu` computes it)."""
    m, k = x.shape
    if w.ndim != 4 or w.shape[1] % 2 or w.shape[2] * 2 != k or w.shape[3] != 32:
        raise ValueError(f"gated_cpu: weights of shape {w.shape} do not take x of shape {x.shape}")
    out = jax.ShapeDtypeStruct((m, w.shape[1] * 8), jax.numpy.bfloat16)
    call = jax.ffi.ffi_call(GATED_TARGET, out)
    x = x.astype(jax.numpy.bfloat16)
    return call(x, w, jax.numpy.asarray(layer, np.int32), _rows(rows, m), **_act(activation))


def activated_cpu(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # bf16[L, N/16, K/2, 32] from `pack_dense`
    layer: jax.Array,  # i32[]
    bias: jax.Array,  # f32[N]
    activation: str,  # a name of `score_kernels.activations.FUNCTIONS`
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
) -> jax.Array:  # bf16[M, N]
    """`act(x @ W[layer] + bias)` rounded to bf16 once, with f32 products, accumulation, bias
    and activation (an encoder MLP's up projection, the down projection's input): the f32
    product never reaches memory. The activations are computed to ~1e-6 relative (GELU's erf
    by a fitted polynomial), far inside the bf16 rounding that follows."""
    m, k = x.shape
    if w.dtype != jax.numpy.bfloat16 or w.ndim != 4 or w.shape[2] * 2 != k or w.shape[3] != 32:
        raise ValueError(f"activated_cpu: weights {w.dtype}{w.shape} do not take x of {x.shape}")
    if bias.shape != (w.shape[1] * 16,):
        raise ValueError(f"activated_cpu: bias of shape {bias.shape} for weights {w.shape}")
    out = jax.ShapeDtypeStruct((m, w.shape[1] * 16), jax.numpy.bfloat16)
    call = jax.ffi.ffi_call(ACTIVATED_TARGET, out)
    return call(
        x.astype(jax.numpy.bfloat16),
        w,
        jax.numpy.asarray(layer, np.int32),
        _rows(rows, m),
        bias.astype(np.float32),
        **_act(activation),
    )


def qkv_order(heads: int, kv_heads: int, d: int) -> np.ndarray:
    """The column order `pack_qkv` packs a fused q/k/v matrix in (i64[N], N = (H + 2 Hkv) D, its
    columns by kv head: `score_kernels.dense.split_qkv`): within each q and k head, groups of 16
    columns holding 8 of the head's first half and the 8 that are D/2 further, the pairs
    rotate-half RoPE turns together; v heads in order."""
    group = heads // kv_heads
    inner = np.arange(d).reshape(2, d // 16, 8).transpose(1, 0, 2).reshape(d)  # paired halves
    slots = [inner] * (group + 1) + [np.arange(d)]  # the G query heads and k; v in order
    slots *= kv_heads
    return np.concatenate([slot + n * d for n, slot in enumerate(slots)])


def pack_qkv(w, heads: int, kv_heads: int) -> np.ndarray:
    """A fused q/k/v stack [L, K, N] (columns by kv head) packed for `qkv_cpu`: `pack_dense`
    of its columns in `qkv_order`."""
    w = np.asarray(w)
    d = w.shape[-1] // (heads + 2 * kv_heads)
    return pack_dense(w[..., qkv_order(heads, kv_heads, d)])


def qkv_cpu(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # bf16[L, N/16, K/2, 32] from `pack_qkv`, N = (H + 2 Hkv) D
    layer: jax.Array,  # i32[]
    bias: jax.Array,  # f32[N], columns by kv head (as the matrix before `pack_qkv`)
    heads: int,  # H
    kv_heads: int,  # Hkv
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
    rope: tuple[jax.Array, jax.Array] | None = None,  # cos, sin f32[M, D/2]
) -> tuple[jax.Array, jax.Array, jax.Array]:  # bf16 q [M, H, D], k and v [M, Hkv, D]
    """`x @ W[layer] + bias`, q and k rotated by rotate-half RoPE where `rope` is given (as
    `score_kernels.rope.rotate`), rounded to bf16 once (f32 products, accumulation, bias and
    rotation), its columns written straight into q, k and v (`score_kernels.dense.split_qkv`'s
    layout), D a multiple of 16. Neither the f32 product nor a split copy reaches memory."""
    m, k = x.shape
    if w.dtype != jax.numpy.bfloat16 or w.ndim != 4 or w.shape[2] * 2 != k or w.shape[3] != 32:
        raise ValueError(f"qkv_cpu: weights {w.dtype}{w.shape} do not take x of {x.shape}")
    outs, tail = _qkv_operands("qkv_cpu", m, w, bias, heads, kv_heads, rope)
    call = jax.ffi.ffi_call(QKV_TARGET, outs)
    layer = jax.numpy.asarray(layer, np.int32)
    return call(x.astype(jax.numpy.bfloat16), w, layer, _rows(rows, m), *tail)


def _qkv_operands(name: str, m: int, w, bias, heads: int, kv_heads: int, rope):
    """The shapes of a fused q/k/v call's three outputs (bf16 q [M, H, D], k and v [M, Hkv, D])
    and its operands after the common ones: the bias f32[N] in `qkv_order`, cos and sin
    f32[M, D/2] (empty without RoPE); raises ValueError naming `name` where the heads do not
    split the weights' N columns into heads of a multiple of 16 or the tables do not fit."""
    n = w.shape[1] * 16
    d = n // (heads + 2 * kv_heads) if heads % kv_heads == 0 else 0
    if not d or d % 16 or d * (heads + 2 * kv_heads) != n or bias.shape != (n,):
        raise ValueError(
            f"{name}: {heads} heads and {kv_heads} kv heads do not split weights {w.shape} "
            f"(bias {bias.shape}) into heads of a multiple of 16 columns"
        )
    cos, sin = rope if rope is not None else (np.zeros(0, np.float32),) * 2
    if rope is not None and (cos.shape != (m, d // 2) or sin.shape != cos.shape):
        raise ValueError(f"{name}: RoPE tables {cos.shape}, {sin.shape} for {m} rows of D {d}")
    q = jax.ShapeDtypeStruct((m, heads, d), jax.numpy.bfloat16)
    kv = jax.ShapeDtypeStruct((m, kv_heads, d), jax.numpy.bfloat16)
    f32 = lambda t: jax.numpy.asarray(t, np.float32)
    return (q, kv, kv), (f32(bias)[qkv_order(heads, kv_heads, d)], f32(cos), f32(sin))


def _act(activation: str) -> dict:
    """The `activation` attribute of the gated and activated calls."""
    return {"activation": np.int32(activations.CODES[activation])}


def _rows(rows: jax.Array | None, m: int) -> jax.Array:
    """The native dense calls' `rows` operand, i32[]: all m rows when None."""
    return jax.numpy.asarray(m if rows is None else rows, np.int32)


INT8_TARGET, INT8_GATED_TARGET = "dense_int8", "gated_int8"
INT8_ACTIVATED_TARGET, INT8_ADD_TARGET, INT8_QKV_TARGET = (
    "activated_int8",
    "dense_int8_add",
    "qkv_int8",
)
INT8_AVAILABLE = AVAILABLE and _cpu.int8_isa() is not None
if INT8_AVAILABLE:
    jax.ffi.register_ffi_target(INT8_TARGET, _cpu.int8_handler(), platform="cpu")
    jax.ffi.register_ffi_target(INT8_GATED_TARGET, _cpu.int8_gated_handler(), platform="cpu")
    jax.ffi.register_ffi_target(
        INT8_ACTIVATED_TARGET, _cpu.int8_activated_handler(), platform="cpu"
    )
    jax.ffi.register_ffi_target(INT8_ADD_TARGET, _cpu.int8_add_handler(), platform="cpu")
    jax.ffi.register_ffi_target(INT8_QKV_TARGET, _cpu.int8_qkv_handler(), platform="cpu")


def int8_supports(k: int, n: int) -> bool:
    """Whether the native int8 kernel takes a [K, N] weight (it needs AVX2 or AVX512-VNNI)."""
    return INT8_AVAILABLE and k % 4 == 0 and n % 16 == 0


def int8_isas() -> tuple[str, ...]:
    """Builds of the int8 kernel this CPU can run, narrowest first: "avx2" (the VNNI dot
    product emulated exactly), "avxvnni", "avx512vnni", "amx" (AMX-INT8 tiles; the widest where
    the CPU and the kernel let this process use them)."""
    return _native_module().int8_isas()


def set_int8_isa(name: str | None) -> None:
    """Run int8 build `name` from now on (for tests and comparisons); None picks the widest."""
    _native_module().set_int8_isa(name)


def int8_isa() -> str | None:
    """The build int8 calls use now."""
    return _native_module().int8_isa()


def pack_int8(q) -> np.ndarray:
    """int8 weights [..., K, N] packed for `dense_int8` as u8 [..., N/16, K/4, 64]: q + 128,
    per 16-column group and quad of rows, each column's four bytes. Aligned for
    `score_kernels.host.to_device`."""
    q = np.asarray(q)
    *lead, k, n = q.shape
    out = aligned_empty((*lead, n // 16, k // 4, 16, 4), np.uint8)
    _pack_int8_into(out, q)
    return out.reshape(*lead, n // 16, k // 4, 64)


def pack_int8_gated(q_gate, q_up) -> np.ndarray:
    """int8 gate and up weights [..., K, I] packed for `gated_int8` as u8 [..., 2I/16, K/4, 64]:
    `pack_int8` of each, their 16-column groups interleaved (gate, up, gate, up, ...)."""
    gate, up = np.asarray(q_gate), np.asarray(q_up)
    *lead, k, i = gate.shape
    out = aligned_empty((*lead, i // 16, 2, k // 4, 16, 4), np.uint8)
    _pack_int8_into(out[..., 0, :, :, :], gate)
    _pack_int8_into(out[..., 1, :, :, :], up)
    return out.reshape(*lead, 2 * (i // 16), k // 4, 64)


def interleave_int8_scales(scale_gate, scale_up) -> np.ndarray:
    """Gate and up column scales [..., I] as `gated_int8` takes them, f32 [..., 2I]: their
    16-column groups interleaved as `pack_int8_gated` interleaves the weights."""
    gate, up = np.asarray(scale_gate, np.float32), np.asarray(scale_up, np.float32)
    *lead, i = gate.shape
    pairs = np.stack([gate.reshape(*lead, i // 16, 16), up.reshape(*lead, i // 16, 16)], -2)
    return pairs.reshape(*lead, 2 * i)


def _pack_int8_into(out: np.ndarray, q: np.ndarray) -> None:
    """`q` [..., K, N] plus 128 written to `out` [..., N/16, K/4, 16, 4]."""
    *lead, k, n = q.shape
    rows = (q.astype(np.int16) + 128).astype(np.uint8).reshape(*lead, k // 4, 4, n // 16, 16)
    out[...] = np.moveaxis(rows, (-4, -3, -2, -1), (-3, -1, -4, -2))


def dense_int8(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, N/16, K/4, 64] from `pack_int8`
    scale: jax.Array,  # f32[L, N]
    layer: jax.Array,  # i32[]: which of the L matrices
    block: int = ACT_BLOCK,
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
) -> jax.Array:  # f32[M, N]
    """`x @ (q * scale)[layer]` on the CPU with x quantised per row block of `block`: the
    arithmetic of `score_kernels.quant.int8_matmul`, int32 sums of AMX or VNNI dot products."""
    m, k = x.shape
    if w.ndim != 4 or w.shape[2] * 4 != k or w.shape[3] != 64:
        raise ValueError(f"dense_int8: weights of shape {w.shape} do not take x of shape {x.shape}")
    out = jax.ShapeDtypeStruct((m, w.shape[1] * 16), np.float32)
    return _int8_call(INT8_TARGET, out, x, w, scale, layer, block, rows)


def gated_int8(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, 2I/16, K/4, 64] from `pack_int8_gated`
    scale: jax.Array,  # f32[L, 2I] from `interleave_int8_scales`
    layer: jax.Array,  # i32[]
    block: int = ACT_BLOCK,
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
    activation: str = "silu",  # a name of `score_kernels.activations.FUNCTIONS`
) -> jax.Array:  # bf16[M, I]
    """`act(x @ W_gate) * (x @ W_up)` of layer `layer` in int8 (as `dense_int8`), rounded to
    bf16 once: a gated MLP's input of the down projection."""
    m, k = x.shape
    if w.ndim != 4 or w.shape[1] % 2 or w.shape[2] * 4 != k or w.shape[3] != 64:
        raise ValueError(f"gated_int8: weights of shape {w.shape} do not take x of shape {x.shape}")
    out = jax.ShapeDtypeStruct((m, w.shape[1] * 8), jax.numpy.bfloat16)
    return _int8_call(INT8_GATED_TARGET, out, x, w, scale, layer, block, rows, **_act(activation))


def activated_int8(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, N/16, K/4, 64] from `pack_int8`
    scale: jax.Array,  # f32[L, N]
    layer: jax.Array,  # i32[]
    bias: jax.Array,  # f32[N]
    activation: str,  # a name of `score_kernels.activations.FUNCTIONS`
    block: int = ACT_BLOCK,
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
) -> jax.Array:  # bf16[M, N]
    """`act(x @ (q * scale)[layer] + bias)` rounded to bf16 once: `dense_int8`'s product with
    `activated_cpu`'s epilogue (an encoder MLP's up projection)."""
    n = w.shape[1] * 16
    if bias.shape != (n,):
        raise ValueError(f"activated_int8: bias of shape {bias.shape} for weights {w.shape}")
    out = jax.ShapeDtypeStruct((x.shape[0], n), jax.numpy.bfloat16)
    bias = jax.numpy.asarray(bias, np.float32)
    return _int8_call(
        INT8_ACTIVATED_TARGET, out, x, w, scale, layer, block, rows, bias, **_act(activation)
    )


def dense_add_int8(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, N/16, K/4, 64] from `pack_int8`
    scale: jax.Array,  # f32[L, N]
    layer: jax.Array,  # i32[]
    residual: jax.Array,  # f32[M, N]
    bias: jax.Array | None = None,  # f32[N]
    block: int = ACT_BLOCK,
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
) -> jax.Array:  # f32[M, N]
    """`(residual + x @ (q * scale)[layer]) + bias` in f32: `dense_int8`'s product added to the
    residual stream as it is written (as `dense_add_cpu` adds the bf16 one)."""
    out, tail = _residual_operands("dense_add_int8", x.shape[0], w, residual, bias)
    # over the residual's buffer, as `dense_add_cpu` writes it
    return _int8_call(INT8_ADD_TARGET, out, x, w, scale, layer, block, rows, *tail, aliases={5: 0})


def qkv_int8(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, N/16, K/4, 64]: `pack_int8` of the columns in `qkv_order`
    scale: jax.Array,  # f32[L, N], in the same order
    layer: jax.Array,  # i32[]
    bias: jax.Array,  # f32[N], columns by kv head (as the matrix before reordering)
    heads: int,  # H
    kv_heads: int,  # Hkv
    block: int = ACT_BLOCK,
    rows: jax.Array | None = None,  # i32[]: the real rows of x (as `dense_cpu`)
    rope: tuple[jax.Array, jax.Array] | None = None,  # cos, sin f32[M, D/2]
) -> tuple[jax.Array, jax.Array, jax.Array]:  # bf16 q [M, H, D], k and v [M, Hkv, D]
    """`qkv_cpu`'s fused q/k/v projection on `dense_int8`'s product: bias, split and RoPE in f32,
    rounded to bf16 once, written straight into q, k and v."""
    outs, tail = _qkv_operands("qkv_int8", x.shape[0], w, bias, heads, kv_heads, rope)
    return _int8_call(INT8_QKV_TARGET, outs, x, w, scale, layer, block, rows, *tail)


def _int8_call(target, out, x, w, scale, layer, block: int, rows, *extra, aliases=None, **attrs):
    """An int8 call: x, w, scale, layer and rows, then the form's `extra` operands."""
    call = jax.ffi.ffi_call(target, out, input_output_aliases=aliases)
    layer = jax.numpy.asarray(layer, np.int32)
    x = x.astype(jax.numpy.bfloat16)
    rows = _rows(rows, x.shape[0])
    return call(x, w, scale, layer, rows, *extra, block=np.int64(block), **attrs)
