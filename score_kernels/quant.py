"""The int8 arithmetic of the "int8" dense strategy, in XLA: the definition the native VNNI
kernel (`_native/dense_int8.cc`) computes, and the path where that kernel does not run.

- The rotation: K is cut into blocks of `ACT_BLOCK` (the last may be shorter), and each block
  whose width n is a power of two is multiplied by the n x n Hadamard matrix H (+-1 entries,
  Sylvester's order; H H = n I): activations as `x H`, weights as `H w / n`, so the product is
  unchanged. The rotation spreads an outlier channel over its block before the block's scale is
  set: on SmolLM2 it cut the activations' share of int8's error by two thirds
  (`python -m bench int8-errors`).
- Weights, once at load: rotated, then per output column, symmetric:
  `scale[n] = max_k |w[k, n]| / 127`, `q[k, n] = round(w[k, n] / scale[n])` in [-127, 127] (an
  all-zero column has scale 1).
- Activations, per matmul: x first rounded to bf16 as the bf16 path does, then each row's blocks
  rotated (in f32 butterflies, `hadamard`), each block symmetric on its own: with
  `a = max |x[m, block b]|`, `q = round(x * (127 / a))` and `s[m, b] = a * f32(1 / 127)` (q = 0
  and s = 1 when a = 0). (A multiplication, not `a / 127`: XLA turns a division by a constant
  into that multiplication, and the kernel does what XLA does.)
- The product: `y[m, n] = scale[n] * sum_b s[m, b] * (sum_{k in b} q_x[m, k] q_w[k, n])`, each
  block's sum exact in int32. Rounding is to nearest, ties to even, divisions in f32.
- Smoothing, where a calibrated stack carries it (`smoothing`, `Rounded.smooth`): the weights'
  rows multiplied by their channel's divisor before the rotation, the activations' channels
  multiplied by its reciprocal (in f32, then rounded to bf16) before the rest.

Blocks keep one large activation (LLMs have a few outlier channels) from flattening the
resolution of the whole row; a block of 128 costs the kernel one float fix-up per 32 int8 dot
products, and its rotation 7 additions per value.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ACT_BLOCK = 128  # activation columns sharing one scale
QMAX = 127
INV_QMAX = np.float32(1 / QMAX)


def rotated(width: int) -> bool:
    """Whether a block of `width` columns is rotated: a power of two."""
    return width & (width - 1) == 0


def block_widths(k: int, block: int = ACT_BLOCK) -> list[int]:
    """The widths of a row's blocks: full blocks, then the remainder."""
    return [block] * (k // block) + ([k % block] if k % block else [])


def hadamard(x: jax.Array) -> jax.Array:  # [..., n] -> [..., n], n a power of two
    """x H: butterfly stages turning each pair (a, b) into (a + b, a - b), as the kernel does."""
    *lead, n = x.shape
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        h *= 2
    return x


def rotate_rows(x: jax.Array, block: int = ACT_BLOCK) -> jax.Array:  # f32[M, K] -> f32[M, K]
    """x with each of its row blocks whose width is a power of two times H."""
    m, k = x.shape
    full = k // block * block
    blocks = x[:, :full].reshape(m, k // block, block)
    parts = [(hadamard(blocks) if rotated(block) else blocks).reshape(m, full)]
    if k > full:
        tail = x[:, full:]
        parts.append(hadamard(tail) if rotated(k - full) else tail)
    return jnp.concatenate(parts, axis=1)


def rotate_weights(w, block: int = ACT_BLOCK) -> np.ndarray:  # [..., K, N] -> f32[..., K, N]
    """H w / n on each block of w's rows whose width n is a power of two (in float64)."""
    return _hadamard_rows(w, block, normalised=True).astype(np.float32)


def _hadamard_rows(a, block: int, normalised: bool) -> np.ndarray:  # [..., K, N] -> f64
    """H a (H a / n where `normalised`) on each block of a's rows whose width n is a power of
    two, in float64; the other blocks as they are."""
    a = np.asarray(a, np.float64)
    out, start = [], 0
    for width in block_widths(a.shape[-2], block):
        part = a[..., start : start + width, :]
        if rotated(width):
            part = sylvester(width) @ part / (width if normalised else 1)
        out.append(part)
        start += width
    return np.concatenate(out, axis=-2)


def sylvester(n: int) -> np.ndarray:  # f64[n, n]
    """The n x n Hadamard matrix in Sylvester's order (n a power of two), unnormalised."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


class Rounded(NamedTuple):
    """A stack of weights already on the int8 grid (by GPTQ or after smoothing:
    `score_kernels.calibration`), handed to an int8 strategy's `prepare` in place of the float
    weights it would round itself."""

    q: np.ndarray  # i8[L, K, N]: the rotated (smoothed) weights' grid points
    scale: np.ndarray  # f32[L, N]
    smooth: np.ndarray | None = None  # f32[L, K]: the divisors of the inputs' channels (None: 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape


def rounded(w) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """int8 q [..., K, N], f32 scale [..., N] and the smoothing divisors f32[..., K] (or None) of
    w: a `Rounded` stack's own, else `quantize_columns(w)` and no smoothing."""
    return tuple(w) if isinstance(w, Rounded) else (*quantize_columns(w), None)


def smoothing(maxima, weight_maxima, alpha: float) -> np.ndarray:  # f64[..., K] x2 -> f32[..., K]
    """SmoothQuant's divisors of a matrix's input channels: `maxima ** alpha /
    weight_maxima ** (1 - alpha)`, from each channel's largest magnitude over calibration inputs
    and the largest weight it meets (over every matrix multiplying those inputs); 1 for a channel
    never seen non-zero or meeting only zero weights. Dividing the inputs' channel j by s_j and
    multiplying the weights' row j by it leaves the product as it was, but moves part of the
    activations' outlier channels into the weights."""
    maxima, weight_maxima = np.asarray(maxima, np.float64), np.asarray(weight_maxima, np.float64)
    live = (maxima > 0) & (weight_maxima > 0)
    s = np.where(live, maxima, 1) ** alpha / np.where(live, weight_maxima, 1) ** (1 - alpha)
    return np.where(live, s, 1.0).astype(np.float32)


def rotate_hessian(h, block: int = ACT_BLOCK) -> np.ndarray:  # f64[K, K] -> f64[K, K]
    """X^T X of x's rows rotated (`rotate_rows`), from X^T X of the rows themselves: H^T A H on
    each pair of blocks (H symmetric)."""
    left = _hadamard_rows(h, block, normalised=False)
    return _hadamard_rows(left.T, block, normalised=False).T


def quantize_columns(w, block: int = ACT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """int8 q [..., K, N] and f32 scale [..., N] of weights w [..., K, N]: rotated as activations
    in blocks of `block` are, then rounded per column (`round_columns`)."""
    return round_columns(rotate_weights(w, block))


def column_scales(w) -> np.ndarray:  # [..., K, N] -> f32[..., N]
    """Each column's scale: its largest magnitude over 127 (1 for an all-zero column)."""
    amax = np.max(np.abs(np.asarray(w, np.float32)), axis=-2)
    return np.where(amax > 0, amax / np.float32(QMAX), np.float32(1)).astype(np.float32)


def round_columns(w) -> tuple[np.ndarray, np.ndarray]:
    """int8 q [..., K, N] and f32 scale [..., N]: w [..., K, N] rounded to nearest on the grid
    of `column_scales`."""
    w = np.asarray(w, np.float32)
    scale = column_scales(w)
    return to_grid(w, scale), scale


def to_grid(w, scale) -> np.ndarray:  # [..., K, N], f32[..., N] -> i8[..., K, N]
    return np.clip(np.rint(w / scale[..., None, :]), -QMAX, QMAX).astype(np.int8)


def act_blocks(k: int, block: int = ACT_BLOCK) -> int:
    """How many activation blocks a row of k columns has."""
    return -(-k // block)


def quantize_rows(
    x: jax.Array,  # [M, K]
    block: int = ACT_BLOCK,
) -> tuple[jax.Array, jax.Array]:  # i8[M, B * block] (zero padded), f32[M, B]
    """x rounded to bf16, rotated, then quantised per row block (see the module docstring)."""
    m, k = x.shape
    nb = act_blocks(k, block)
    xf = rotate_rows(x.astype(jnp.bfloat16).astype(jnp.float32), block)
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
