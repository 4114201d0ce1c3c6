"""The int8 arithmetic of the "int8" dense strategy, in XLA: the definition the native VNNI
kernel (`_native/dense_int8.cc`) computes, and the path where that kernel does not run.

- Weights, once at load: per output column, symmetric. `scale[n] = max_k |w[k, n]| / 127`,
  `q[k, n] = round(w[k, n] / scale[n])` in [-127, 127] (an all-zero column has scale 1).
- Activations, per matmul: each row cut into blocks of `ACT_BLOCK` columns (the last may be
  shorter), each block symmetric on its own: with `a = max |x[m, block b]|`,
  `q = round(x * (127 / a))` and `s[m, b] = a * f32(1 / 127)` (q = 0 and s = 1 when a = 0),
  x first rounded to bf16 as the bf16 path does. (A multiplication, not `a / 127`: XLA turns a
  division by a constant into that multiplication, and the kernel does what XLA does.)
- The product: `y[m, n] = scale[n] * sum_b s[m, b] * (sum_{k in b} q_x[m, k] q_w[k, n])`, each
  block's sum exact in int32. Rounding is to nearest, ties to even, divisions in f32.

Blocks keep one large activation (LLMs have a few outlier channels) from flattening the
resolution of the whole row; a block of 128 costs the kernel one float fix-up per 32 int8 dot
products.
"""

import jax
import jax.numpy as jnp
import numpy as np

ACT_BLOCK = 128  # activation columns sharing one scale
QMAX = 127
INV_QMAX = np.float32(1 / QMAX)


def quantize_columns(w) -> tuple[np.ndarray, np.ndarray]:
    """int8 q [..., K, N] and f32 scale [..., N] of weights w [..., K, N], per column."""
    w = np.asarray(w, np.float32)
    amax = np.max(np.abs(w), axis=-2)
    scale = np.where(amax > 0, amax / np.float32(QMAX), np.float32(1)).astype(np.float32)
    q = np.rint(w / scale[..., None, :])
    return np.clip(q, -QMAX, QMAX).astype(np.int8), scale


def act_blocks(k: int, block: int = ACT_BLOCK) -> int:
    """How many activation blocks a row of k columns has."""
    return -(-k // block)


def quantize_rows(
    x: jax.Array,  # [M, K]
    block: int = ACT_BLOCK,
) -> tuple[jax.Array, jax.Array]:  # i8[M, B * block] (zero padded), f32[M, B]
    """x rounded to bf16, then quantised per row block (see the module docstring)."""
    m, k = x.shape
    nb = act_blocks(k, block)
    xf = x.astype(jnp.bfloat16).astype(jnp.float32)
    xf = jnp.pad(xf, ((0, 0), (0, nb * block - k))).reshape(m, nb, block)
    amax = jnp.max(jnp.abs(xf), axis=-1)  # f32[M, B]
    nonzero = amax > 0
    inverse = jnp.where(nonzero, jnp.float32(QMAX) / jnp.where(nonzero, amax, 1), 0)
    scale = jnp.where(nonzero, amax * INV_QMAX, jnp.float32(1))
    q = jnp.clip(jnp.round(xf * inverse[..., None]), -QMAX, QMAX).astype(jnp.int8)
    return q.reshape(m, nb * block), scale


def int8_matmul(
    x: jax.Array,  # [M, K]
    q: jax.Array,  # i8[K, N]
    scale: jax.Array,  # f32[N]
    block: int = ACT_BLOCK,
) -> jax.Array:  # f32[M, N]
    """x @ (q * scale) with x quantised per row block: int32 sums per block, then f32."""
    (m, k), n = x.shape, q.shape[1]
    qx, sx = quantize_rows(x, block)
    nb = sx.shape[1]
    qw = jnp.pad(q, ((0, nb * block - k), (0, 0))).reshape(nb, block, n)
    sums = jnp.einsum(
        "mbk,bkn->mbn", qx.reshape(m, nb, block), qw, preferred_element_type=jnp.int32
    )  # i32[M, B, N]
    return jnp.einsum("mbn,mb->mn", sums.astype(jnp.float32), sx) * scale
