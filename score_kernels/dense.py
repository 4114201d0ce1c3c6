"""Dense matmul strategies: how the decoder's weight matrices are stored and multiplied.

A strategy is passed to the forward exactly as attention is. It prepares each host matrix once at
load (a stack `[L, K, N]` over layers, the gated pair of the MLP, the LM head) and multiplies by
the prepared form; the forward never looks inside. Two exist:

- `XLA`: the matrices in the weight dtype, `jnp.matmul` with f32 accumulation; any backend.
- `CPU`: matrices packed once for the native kernel of their dtype (`score_kernels.cpu`): bf16 for
  AMX tiles or AVX512-BF16 dot products, which take the same layout (f32 FMAs on AVX2), f32 for
  f32 FMAs on AVX2 or AVX-512 (its gated pair as one product, the activation in XLA); a matrix
  the kernel cannot take (K odd in bf16, N not a multiple of 16) stays in the XLA form. On bf16
  weights the kernel fuses what follows a product: the gated MLP's activation, a bias and an
  activation, the q/k/v bias, split and RoPE (`PackedQkv`), the residual add.
- `INT8_XLA`: layer matrices quantised once to int8 per column, activations per row block on
  the fly (`score_kernels.quant`), int32 sums in XLA; the LM head stays in the weight dtype.
- `INT8`: the same arithmetic in the native kernel (`score_kernels.cpu.dense_int8`: AMX-INT8 tiles,
  AVX512-VNNI, AVX-VNNI or AVX2), fusing what follows a product as `CPU` does on bf16 weights
  (`Int8PackedQkv` for the q/k/v split and RoPE), the head packed as `CPU` packs it; a matrix
  the kernel cannot take stays in the `INT8_XLA` form.
- `ONEDNN`: bf16 matrices packed once in the layout oneDNN picks for this CPU (AMX tiles where
  it has them: `score_kernels.onednn`); the gated pair as XLA's, its activation in XLA.

`chosen` mixes them per weight shape (the default, `score_kernels.dense_choice` measures which).

The layer products (all but `head`) take the count of x's real rows (i32[], the first ones;
None: all): the native kernels (`CPU`, `INT8`) multiply those alone and answer zeros for the
rest, a batch's padding, which the others compute as any row. The forward reads no padding
row's result.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from score_kernels import activations, cpu, onednn, quant
from score_kernels import rope as kernels_rope
from score_kernels.host import interleave_to_device, to_device


class Dense(NamedTuple):
    """One way to store and multiply weight matrices (see the module docstring).

    prepare(w [L, K, N], dtype) -> W;  matmul(x [M, K], W, layer i32[], rows) -> f32[M, N]
    prepare_gated(gate [L, K, I], up [L, K, I], dtype) -> G;
        gated(x [M, K], G, layer, rows, activation="silu") -> act(x @ gate) * (x @ up) [M, I]:
        bf16 where the strategy fuses it (as `activated`), else f32
    prepare_activated(w [L, K, N], dtype) -> W: a matrix multiplied by `activated` (as
        `prepare`, but for what `chosen` picks for it);
    activated(x [M, K], W, layer, bias f32[N], activation, rows) -> act(x @ W + bias) [M, N]:
        f32, or bf16 where the strategy fuses it (the native kernel on bf16 weights), which is
        the dtype the next product casts it to (`activation` names `score_kernels.activations`)
    prepare_qkv(w [L, K, N], dtype, heads, kv_heads) -> W: a fused q/k/v stack, its columns
        by kv head (`split_qkv`);
    qkv(x [M, K], W, layer, bias f32[N], heads, kv_heads, rows, rope) -> q [M, H, D], k and v
        [M, Hkv, D]: x @ W + bias split as `split_qkv`, q and k rotated by `rope` (cos, sin
        f32[M, D/2]; None: not, `score_kernels.rope`): bf16 where the strategy fuses it, written
        straight into the three, else f32
    prepare_residual(w [L, K, N], dtype) -> W: a matrix multiplied by `residual` (as
        `prepare`, but for what `chosen` picks for it);
    residual(x [M, K], W, layer, residual f32[M, N], bias f32[N] or None, rows) -> f32[M, N]:
        (residual + x @ W) + bias, the sum written as the product is where the strategy fuses
        it (a layer's output projections)
    (rows: i32[] or None, the real rows of x; see the module docstring)
    prepare_head(w [V, E], dtype) -> H;  head(h [S, E], H) -> f32[S, V] = h @ w.T
    """

    name: str
    prepare: Callable
    matmul: Callable
    prepare_gated: Callable
    gated: Callable
    prepare_activated: Callable
    activated: Callable
    prepare_qkv: Callable
    qkv: Callable
    prepare_residual: Callable
    residual: Callable
    prepare_head: Callable
    head: Callable
    choice: Any = None  # what picked each shape's strategy (`chosen`); None for a fixed one


def _xla_prepare(w, dtype) -> jax.Array:
    return to_device(w, dtype)


def _xla_matmul(x: jax.Array, w: jax.Array, layer: jax.Array, rows=None) -> jax.Array:
    w = w[layer]  # [K, N]
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def _xla_prepare_gated(gate, up, dtype) -> jax.Array:
    # [L, K, 2I], gate and up columns side by side: any split of the columns into equal parts
    # (tensor parallelism) keeps the pairs whole
    return interleave_to_device([gate, up], dtype)


def _pairs(gate, up) -> np.ndarray:
    """Gate and up [L, K, I] as one [L, K, 2I], each gate column beside its up column."""
    pair = np.stack([np.asarray(gate), np.asarray(up)], axis=-1)  # [L, K, I, gate/up]
    return pair.reshape(*pair.shape[:-2], -1)


def _gate(y: jax.Array, activation: str) -> jax.Array:
    """act(gate) * up from a product f32[M, 2I] over `_pairs` columns."""
    y = y.reshape(y.shape[0], -1, 2)  # f32[M, I, gate/up]
    return activations.apply(activation, y[..., 0]) * y[..., 1]


def _xla_gated(x, w: jax.Array, layer, rows=None, activation: str = "silu") -> jax.Array:
    return _gate(_xla_matmul(x, w, layer), activation)


def _then_activate(matmul: Callable) -> Callable:
    """`activated` of a strategy with no fused form: its product, then the bias and the
    activation in XLA, in f32."""

    def activated(x, w, layer, bias, activation: str, rows=None) -> jax.Array:
        return activations.apply(activation, matmul(x, w, layer, rows) + bias)

    return activated


def split_qkv(y: jax.Array, heads: int, kv_heads: int) -> tuple[jax.Array, ...]:
    """q [M, H, D], k and v [M, Hkv, D] of a fused q/k/v product y [M, (H + 2 Hkv) D] whose
    columns are laid out by kv head: for each kv head its G = H / Hkv query heads, then its k
    and its v (so any split of the columns into parts that divide Hkv keeps whole heads)."""
    m, group = y.shape[0], heads // kv_heads
    by_head = y.reshape(m, kv_heads, group + 2, -1)  # [M, Hkv, G + 2, D]
    q = by_head[:, :, :group].reshape(m, heads, -1)
    return q, by_head[:, :, group], by_head[:, :, group + 1]


def _then_split(activated: Callable) -> Callable:
    """`qkv` of a strategy with no fused form: its `activated` product with the identity, then
    `split_qkv` and RoPE in XLA, in f32."""

    def qkv(x, w, layer, bias, heads: int, kv_heads: int, rows=None, rope=None):
        y = activated(x, w, layer, bias, "identity", rows)
        q, k, v = split_qkv(y, heads, kv_heads)
        if rope is None:
            return q, k, v
        return kernels_rope.rotate(q, *rope), kernels_rope.rotate(k, *rope), v

    return qkv


def _then_add(matmul: Callable) -> Callable:
    """`residual` of a strategy with no fused form: its product, then the sums in XLA."""

    def residual(x, w, layer, residual, bias=None, rows=None) -> jax.Array:
        out = residual + matmul(x, w, layer, rows)
        return out if bias is None else out + bias

    return residual


def _plain_qkv(prepare: Callable) -> Callable:
    """`prepare_qkv` of a strategy that stores a q/k/v stack as any other matrix."""
    return lambda w, dtype, heads, kv_heads: prepare(w, dtype)


def _xla_head(h: jax.Array, w: jax.Array) -> jax.Array:
    # w stays [V, E]: the product with its transpose keeps XLA's own operand layout (a
    # transposed copy rounds differently for a few score rows)
    return jnp.matmul(h.astype(w.dtype), w.T, preferred_element_type=jnp.float32)


XLA = Dense(
    "xla",
    _xla_prepare,
    _xla_matmul,
    _xla_prepare_gated,
    _xla_gated,
    _xla_prepare,
    _then_activate(_xla_matmul),
    _plain_qkv(_xla_prepare),
    _then_split(_then_activate(_xla_matmul)),
    _xla_prepare,
    _then_add(_xla_matmul),
    _xla_prepare,
    _xla_head,
)


class Packed(NamedTuple):
    """A stack of matrices packed for `score_kernels.cpu.dense_cpu` / `gated_cpu` (the packers
    return fresh aligned buffers, which `jax.device_put` adopts on the CPU without copying)."""

    data: jax.Array  # bf16[L, N/16, K/2, 32] or f32[L, N/16, K, 16]


def _cpu_prepare(w, dtype) -> Packed | jax.Array:
    if not cpu.dense_supports(*w.shape[-2:], dtype):
        return _xla_prepare(w, dtype)
    return Packed(jax.device_put(cpu.pack_dense(w, dtype)))


def _cpu_matmul(x: jax.Array, w: Packed | jax.Array, layer: jax.Array, rows=None) -> jax.Array:
    if isinstance(w, Packed):
        return cpu.dense_cpu(x, w.data, layer, rows)
    return _xla_matmul(x, w, layer)


def _cpu_prepare_gated(gate, up, dtype) -> Packed | jax.Array:
    if not cpu.dense_supports(*gate.shape[-2:], dtype):
        return _xla_prepare_gated(gate, up, dtype)
    if np.dtype(dtype) == np.float32:  # one product of the pairs (f32 has no fused kernel)
        return _cpu_prepare(_pairs(gate, up), dtype)
    return Packed(jax.device_put(cpu.pack_gated(gate, up)))


def _cpu_gated(x, w: Packed | jax.Array, layer, rows=None, activation: str = "silu") -> jax.Array:
    if not isinstance(w, Packed):
        return _xla_gated(x, w, layer, rows, activation)
    if w.data.dtype == np.float32:
        return _gate(cpu.dense_cpu(x, w.data, layer, rows), activation)
    return cpu.gated_cpu(x, w.data, layer, rows, activation)


def _cpu_activated(x, w: Packed | jax.Array, layer, bias, activation: str, rows=None):
    if isinstance(w, Packed) and w.data.dtype == jnp.bfloat16:
        return cpu.activated_cpu(x, w.data, layer, bias, activation, rows)
    return _then_activate(_cpu_matmul)(x, w, layer, bias, activation, rows)


class PackedQkv(NamedTuple):
    """A fused q/k/v stack packed for `score_kernels.cpu.qkv_cpu` (`pack_qkv`: q and k columns in
    RoPE's pairs)."""

    data: jax.Array  # bf16[L, N/16, K/2, 32]


def _cpu_prepare_qkv(w, dtype, heads: int, kv_heads: int) -> PackedQkv | Packed | jax.Array:
    d = w.shape[-1] // (heads + 2 * kv_heads)
    if np.dtype(dtype) != jnp.bfloat16 or d % 16 or not cpu.dense_supports(*w.shape[-2:]):
        return _cpu_prepare(w, dtype)
    return PackedQkv(jax.device_put(cpu.pack_qkv(w, heads, kv_heads)))


def _cpu_qkv(x, w, layer, bias, heads: int, kv_heads: int, rows=None, rope=None):
    if isinstance(w, PackedQkv):
        return cpu.qkv_cpu(x, w.data, layer, bias, heads, kv_heads, rows, rope)
    return _then_split(_then_activate(_cpu_matmul))(x, w, layer, bias, heads, kv_heads, rows, rope)


def _cpu_residual(x, w: Packed | jax.Array, layer, residual, bias=None, rows=None):
    if isinstance(w, Packed) and w.data.dtype == jnp.bfloat16:
        return cpu.dense_add_cpu(x, w.data, layer, residual, bias, rows)
    return _then_add(_cpu_matmul)(x, w, layer, residual, bias, rows)


def _cpu_prepare_head(w, dtype) -> Packed | jax.Array:
    if not cpu.dense_supports(*w.shape[::-1], dtype):
        return _xla_prepare(w, dtype)
    return Packed(jax.device_put(cpu.pack_dense(np.asarray(w).T[None], dtype)))  # [1, E, V]


def _cpu_head(h: jax.Array, w: Packed | jax.Array) -> jax.Array:
    if isinstance(w, Packed):
        return cpu.dense_cpu(h, w.data, jnp.int32(0))
    return _xla_head(h, w)


CPU = Dense(
    "cpu",
    _cpu_prepare,
    _cpu_matmul,
    _cpu_prepare_gated,
    _cpu_gated,
    _cpu_prepare,
    _cpu_activated,
    _cpu_prepare_qkv,
    _cpu_qkv,
    _cpu_prepare,
    _cpu_residual,
    _cpu_prepare_head,
    _cpu_head,
)


@jax.tree_util.register_pytree_node_class
class OneDnnPacked:
    """A stack of matrices packed for `score_kernels.onednn.dense`, with their column count (static:
    the output's shape)."""

    def __init__(self, data: jax.Array, n: int):
        self.data = data  # u8[L, bytes]
        self.n = n

    def tree_flatten(self):
        return (self.data,), self.n

    @classmethod
    def tree_unflatten(cls, n, children):
        return cls(children[0], n)


def _onednn_prepare(w, dtype) -> OneDnnPacked | jax.Array:
    k, n = w.shape[-2:]
    if np.dtype(dtype) != jnp.bfloat16 or not onednn.supports(k, n):
        return _xla_prepare(w, dtype)
    return OneDnnPacked(jax.device_put(onednn.pack(w)), n)


def _onednn_matmul(
    x: jax.Array, w: OneDnnPacked | jax.Array, layer: jax.Array, rows=None
) -> jax.Array:
    if isinstance(w, OneDnnPacked):
        return onednn.dense(x, w.data, layer, w.n)
    return _xla_matmul(x, w, layer)


def _onednn_prepare_gated(gate, up, dtype) -> OneDnnPacked | jax.Array:
    return _onednn_prepare(_pairs(gate, up), dtype)  # the layout of _xla_prepare_gated


def _onednn_gated(x, w: OneDnnPacked | jax.Array, layer, rows=None, activation="silu"):
    return _gate(_onednn_matmul(x, w, layer), activation)


def _onednn_prepare_head(w, dtype) -> OneDnnPacked | jax.Array:
    packed = _onednn_prepare(np.asarray(w).T[None], dtype)  # [1, E, V]
    return packed if isinstance(packed, OneDnnPacked) else _xla_prepare(w, dtype)


def _onednn_head(h: jax.Array, w: OneDnnPacked | jax.Array) -> jax.Array:
    if isinstance(w, OneDnnPacked):
        return onednn.dense(h, w.data, jnp.int32(0), w.n)
    return _xla_head(h, w)


ONEDNN = Dense(
    "onednn",
    _onednn_prepare,
    _onednn_matmul,
    _onednn_prepare_gated,
    _onednn_gated,
    _onednn_prepare,
    _then_activate(_onednn_matmul),
    _plain_qkv(_onednn_prepare),
    _then_split(_then_activate(_onednn_matmul)),
    _onednn_prepare,
    _then_add(_onednn_matmul),
    _onednn_prepare_head,
    _onednn_head,
)


class Int8(NamedTuple):
    """A stack of matrices quantised per column (`score_kernels.quant.quantize_columns`)."""

    q: jax.Array  # i8[L, K, N]
    scale: jax.Array  # f32[L, N]
    unsmooth: jax.Array | None = None  # f32[L, K]: 1 / each input channel's smoothing divisor


class Int8Packed(NamedTuple):
    """`Int8` packed for `score_kernels.cpu.dense_int8` / `gated_int8`."""

    data: jax.Array  # u8[L, N/16, K/4, 64]: q + 128
    scale: jax.Array  # f32[L, N]
    unsmooth: jax.Array | None = None  # f32[L, K], as `Int8`'s


def _unsmooth(smooth) -> jax.Array | None:
    """The multipliers of a stack's activations, 1 / its smoothing divisors (None: none)."""
    return None if smooth is None else to_device((1 / np.asarray(smooth)).astype(np.float32))


def _smoothed(x: jax.Array, w, layer) -> jax.Array:
    """x with its channels divided by `w`'s smoothing divisors (SmoothQuant: `quant.smoothing`),
    rounded to bf16 as the int8 arithmetic rounds its inputs; x itself where `w` has none. (An
    elementwise pass over x, which XLA can fuse into x's producer where that is one too.)"""
    if w.unsmooth is None:
        return x
    return (x.astype(jnp.float32) * w.unsmooth[layer]).astype(jnp.bfloat16)


def _pair_smooth(gate, up):
    """The smoothing divisors of a gated pair: gate and up multiply the same inputs, so theirs
    are one (`score_kernels.calibration` smooths an input once for all its matrices)."""
    if (gate is None) != (up is None) or (gate is not None and not np.array_equal(gate, up)):
        raise ValueError("a gated pair's gate and up are smoothed differently")
    return gate


def _int8_prepare(w, dtype) -> Int8:
    q, scale, smooth = quant.rounded(w)
    return Int8(to_device(q), to_device(scale), _unsmooth(smooth))


def _int8_matmul(x: jax.Array, w: Int8, layer: jax.Array, rows=None) -> jax.Array:
    return quant.int8_matmul(_smoothed(x, w, layer), w.q[layer], w.scale[layer])


def _int8_prepare_gated(gate, up, dtype) -> Int8:
    (qg, sg, smooth), (qu, su, smooth_up) = quant.rounded(gate), quant.rounded(up)
    smooth = _pair_smooth(smooth, smooth_up)
    scale = np.stack([sg, su], axis=-1).reshape(*sg.shape[:-1], -1)  # as `_pairs` the columns
    return Int8(to_device(_pairs(qg, qu)), to_device(scale), _unsmooth(smooth))


def _int8_gated(x, w: Int8, layer, rows=None, activation: str = "silu") -> jax.Array:
    return _gate(_int8_matmul(x, w, layer), activation)


INT8_XLA = Dense(
    "int8-xla",
    _int8_prepare,
    _int8_matmul,
    _int8_prepare_gated,
    _int8_gated,
    _int8_prepare,
    _then_activate(_int8_matmul),
    _plain_qkv(_int8_prepare),
    _then_split(_then_activate(_int8_matmul)),
    _int8_prepare,
    _then_add(_int8_matmul),
    _xla_prepare,
    _xla_head,
)


def _vnni_prepare(w, dtype) -> Int8Packed | Int8:
    if not cpu.int8_supports(*w.shape[-2:]):
        return _int8_prepare(w, dtype)
    q, scale, smooth = quant.rounded(w)
    return Int8Packed(jax.device_put(cpu.pack_int8(q)), to_device(scale), _unsmooth(smooth))


def _vnni_matmul(x: jax.Array, w: Int8Packed | Int8, layer: jax.Array, rows=None) -> jax.Array:
    if isinstance(w, Int8Packed):
        return cpu.dense_int8(_smoothed(x, w, layer), w.data, w.scale, layer, rows=rows)
    return _int8_matmul(x, w, layer)


class Int8PackedQkv(NamedTuple):
    """A fused q/k/v stack packed for `score_kernels.cpu.qkv_int8`: `Int8Packed` of its columns
    in `score_kernels.cpu.qkv_order` (q and k columns in RoPE's pairs)."""

    data: jax.Array  # u8[L, N/16, K/4, 64]: q + 128
    scale: jax.Array  # f32[L, N]
    unsmooth: jax.Array | None = None  # f32[L, K], as `Int8`'s


def _vnni_prepare_qkv(w, dtype, heads: int, kv_heads: int) -> Int8PackedQkv | Int8Packed | Int8:
    d = w.shape[-1] // (heads + 2 * kv_heads)
    if d % 16 or not cpu.int8_supports(*w.shape[-2:]):
        return _vnni_prepare(w, dtype)
    q, scale, smooth = quant.rounded(w)  # per column: the same values whatever the columns' order
    order = cpu.qkv_order(heads, kv_heads, d)
    packed = cpu.pack_int8(np.asarray(q)[..., order])
    scale = to_device(np.asarray(scale)[..., order])
    return Int8PackedQkv(jax.device_put(packed), scale, _unsmooth(smooth))


def _vnni_qkv(x, w, layer, bias, heads: int, kv_heads: int, rows=None, rope=None):
    if isinstance(w, Int8PackedQkv):
        x = _smoothed(x, w, layer)
        return cpu.qkv_int8(x, w.data, w.scale, layer, bias, heads, kv_heads, rows=rows, rope=rope)
    return _then_split(_then_activate(_vnni_matmul))(x, w, layer, bias, heads, kv_heads, rows, rope)


def _vnni_activated(x, w: Int8Packed | Int8, layer, bias, activation: str, rows=None):
    if isinstance(w, Int8Packed):
        x = _smoothed(x, w, layer)
        return cpu.activated_int8(x, w.data, w.scale, layer, bias, activation, rows=rows)
    return _then_activate(_int8_matmul)(x, w, layer, bias, activation, rows)


def _vnni_residual(x, w: Int8Packed | Int8, layer, residual, bias=None, rows=None):
    if isinstance(w, Int8Packed):
        x = _smoothed(x, w, layer)
        return cpu.dense_add_int8(x, w.data, w.scale, layer, residual, bias, rows=rows)
    return _then_add(_int8_matmul)(x, w, layer, residual, bias, rows)


def _vnni_prepare_gated(gate, up, dtype) -> Int8Packed | Int8:
    if not cpu.int8_supports(*gate.shape[-2:]):
        return _int8_prepare_gated(gate, up, dtype)
    (qg, sg, smooth), (qu, su, smooth_up) = quant.rounded(gate), quant.rounded(up)
    smooth = _pair_smooth(smooth, smooth_up)
    packed = cpu.pack_int8_gated(qg, qu)
    scale = to_device(cpu.interleave_int8_scales(sg, su))
    return Int8Packed(jax.device_put(packed), scale, _unsmooth(smooth))


def _vnni_gated(x, w: Int8Packed | Int8, layer, rows=None, activation: str = "silu"):
    if isinstance(w, Int8Packed):
        x = _smoothed(x, w, layer)
        return cpu.gated_int8(x, w.data, w.scale, layer, rows=rows, activation=activation)
    return _int8_gated(x, w, layer, rows, activation)


INT8 = Dense(
    "int8",
    _vnni_prepare,
    _vnni_matmul,
    _vnni_prepare_gated,
    _vnni_gated,
    _vnni_prepare,
    _vnni_activated,
    _vnni_prepare_qkv,
    _vnni_qkv,
    _vnni_prepare,
    _vnni_residual,
    _cpu_prepare_head,
    _cpu_head,
)

STRATEGIES = {d.name: d for d in (XLA, CPU, ONEDNN, INT8, INT8_XLA)}
# the strategy that multiplies each prepared form (the rest are XLA's)
FORMS = {
    Packed: CPU,
    PackedQkv: CPU,
    OneDnnPacked: ONEDNN,
    Int8Packed: INT8,
    Int8PackedQkv: INT8,
    Int8: INT8_XLA,
}


def chosen(pick: Callable[[str, int, int], str]) -> Dense:
    """A strategy that prepares each matrix as the strategy `pick(kind, K, N)` names ("matmul"
    for a [.., K, N] stack, "gated" for gate and up [.., K, N], "activated" for a [.., K, N]
    stack multiplied by `activated`, "qkv" for a q/k/v stack, "residual" for a [.., K, N] stack
    multiplied by `residual`, "head" for [N, K]) and multiplies
    each prepared form as its own strategy does (`FORMS`). The int8 mode picks "int8" or
    "int8-xla" for the layer matrices and a bf16 strategy for the head.
    """

    def prepare(w, dtype):
        return STRATEGIES[pick("matmul", *w.shape[-2:])].prepare(w, dtype)

    def prepare_gated(gate, up, dtype):
        return STRATEGIES[pick("gated", *gate.shape[-2:])].prepare_gated(gate, up, dtype)

    def prepare_activated(w, dtype):
        return STRATEGIES[pick("activated", *w.shape[-2:])].prepare_activated(w, dtype)

    def prepare_qkv(w, dtype, heads, kv_heads):
        strategy = STRATEGIES[pick("qkv", *w.shape[-2:])]
        return strategy.prepare_qkv(w, dtype, heads, kv_heads)

    def prepare_residual(w, dtype):
        return STRATEGIES[pick("residual", *w.shape[-2:])].prepare_residual(w, dtype)

    def prepare_head(w, dtype):
        return STRATEGIES[pick("head", *w.shape[::-1])].prepare_head(w, dtype)

    def matmul(x, w, layer, rows=None):
        return _owner(w).matmul(x, w, layer, rows)

    def gated(x, w, layer, rows=None, activation="silu"):
        return _owner(w).gated(x, w, layer, rows, activation)

    def activated(x, w, layer, bias, activation, rows=None):
        return _owner(w).activated(x, w, layer, bias, activation, rows)

    def qkv(x, w, layer, bias, heads, kv_heads, rows=None, rope=None):
        return _owner(w).qkv(x, w, layer, bias, heads, kv_heads, rows, rope)

    def residual(x, w, layer, residual, bias=None, rows=None):
        return _owner(w).residual(x, w, layer, residual, bias, rows)

    def head(h, w):
        return _owner(w).head(h, w)

    return Dense(
        "measured",
        prepare,
        matmul,
        prepare_gated,
        gated,
        prepare_activated,
        activated,
        prepare_qkv,
        qkv,
        prepare_residual,
        residual,
        prepare_head,
        head,
        pick,
    )


ROLES = ("qkv", "o", "up", "down")  # a layer's matrices, as `Roles` names them


class Roles(NamedTuple):
    """Which strategy prepares each of a layer's matrices (`ROLES`: the fused q/k/v, the
    attention output, the MLP's first product (a gated MLP's gate and up pair) and its down
    product): `kept` those named in `names`, `rest` the others and every matrix outside the
    layers (heads, projections). The forward multiplies with `rest`, which must multiply each
    prepared form as its own strategy does (a `chosen` one). The int8 mode keeps its most
    sensitive matrices in bf16 with it."""

    rest: Dense
    kept: Dense
    names: frozenset


def for_role(dense: "Dense | Roles", role: str | None) -> Dense:
    """The strategy that prepares a matrix of `role` (one of `ROLES`; None: outside the
    layers)."""
    if not isinstance(dense, Roles):
        return dense
    return dense.kept if role in dense.names else dense.rest


def _owner(w) -> Dense:
    return FORMS.get(type(w), XLA)
