"""The int8 arithmetic in XLA (score_kernels/quant.py) against a float64 model of its definition."""

import jax.numpy as jnp
import numpy as np
import pytest

from score_kernels import quant


def f32_hadamard(part: np.ndarray) -> np.ndarray:
    """part [M, n] times the n x n Hadamard matrix, pair by pair in f32, where n is a power of
    two; unchanged otherwise."""
    part, n = part.copy(), part.shape[1]
    if n & (n - 1):
        return part
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            a, b = part[:, i : i + h].copy(), part[:, i + h : i + 2 * h].copy()
            part[:, i : i + h], part[:, i + h : i + 2 * h] = a + b, a - b
        h *= 2
    return part


def f32_rotate(x: np.ndarray, block: int) -> np.ndarray:
    """x [M, K] with each block of `block` columns rotated (`f32_hadamard`)."""
    return np.concatenate(
        [f32_hadamard(x[:, k0 : k0 + block]) for k0 in range(0, x.shape[1], block)], 1
    )


def f32_quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The definition, in numpy: q [M, K] and scales [M, B] from x rounded to bf16, each block
    rotated."""
    x = f32_rotate(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), block)
    m, k = x.shape
    q, scales = np.zeros((m, k), np.float32), []
    for k0 in range(0, k, block):
        part = x[:, k0 : k0 + block]
        amax = np.abs(part).max(axis=1)
        inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0)
        q[:, k0 : k0 + block] = np.rint(part * inverse.astype(np.float32)[:, None])
        scales.append(np.where(amax > 0, amax * np.float32(1 / 127), 1).astype(np.float32))
    return q, np.stack(scales, axis=1)


def f64_int8_matmul(x, q_w, scale_w, block: int) -> np.ndarray:
    """y = scale_w * sum_b s_b * (q_x,b @ q_w,b), in float64 from the quantised values."""
    q_x, s_x = f32_quantize_rows(x, block)
    y = np.zeros((x.shape[0], q_w.shape[1]))
    for b, k0 in enumerate(range(0, x.shape[1], block)):
        sums = q_x[:, k0 : k0 + block].astype(np.float64) @ q_w[k0 : k0 + block].astype(np.float64)
        y += s_x[:, [b]].astype(np.float64) * sums
    return y * scale_w.astype(np.float64)


@pytest.mark.parametrize("k", [576, 384, 140, 12])
def test_rotations_cancel_in_the_product(k):
    """(x H)(H w / n) = x w: blocks of 128, the tail rotated where a power of two (576 = 4 x 128
    + 64) and left as it is otherwise (140 = 128 + 12)."""
    rng = np.random.default_rng(k)
    x, w = rng.standard_normal((5, k)), rng.standard_normal((k, 7))
    xr = np.asarray(quant.rotate_rows(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(xr @ quant.rotate_weights(w), x @ w, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(xr, f32_rotate(x.astype(np.float32), quant.ACT_BLOCK))
    rotated = [w for w in quant.block_widths(k) if quant.rotated(w)]
    assert sum(rotated) == {576: 576, 384: 384, 140: 128, 12: 0}[k]


def test_an_outlier_channel_is_spread_over_its_block():
    """The rotation's point: one large channel no longer sets a block's scale alone."""
    x = np.random.default_rng(1).standard_normal((1, 128)).astype(np.float32)
    x[0, 7] = 300
    xr = np.asarray(quant.rotate_rows(jnp.asarray(x)))
    assert np.all(np.abs(np.abs(xr) - 300) < 60)  # every value carries it
    peak = lambda v: np.abs(v).max() / np.sqrt(np.mean(v.astype(np.float64) ** 2))
    assert peak(x) > 10 and peak(xr) < 1.2  # so the block's scale resolves the rest 9x finer


def test_weights_quantise_per_column_after_their_rotation():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 40, 24)).astype(np.float32)
    w[1, :, 5] = 0  # an all-zero column
    q, scale = quant.quantize_columns(w)
    w = quant.rotate_weights(w)  # 40 = 32 + 8: both rotated
    assert q.dtype == np.int8 and scale.shape == (2, 24) and scale.dtype == np.float32
    assert np.abs(q).max() == 127 and scale[1, 5] == 1 and not q[1, :, 5].any()
    np.testing.assert_allclose(scale, np.abs(w).max(axis=1) / 127 + (scale == 1), rtol=1e-7)
    assert np.all(np.abs(q * scale[:, None, :] - w) <= scale[:, None, :] / 2 * (1 + 1e-6))
    np.testing.assert_array_equal(np.abs(q).max(axis=1)[scale != 1], 127)  # each column's peak


@pytest.mark.parametrize(("m", "k", "block"), [(3, 128, 128), (5, 576, 128), (4, 100, 32)])
def test_rows_quantise_per_block(m, k, block):
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    x[0, :block] = 0  # a zero block
    x[1, 3] = 1e4  # an outlier takes only its own block's resolution
    q, scale = quant.quantize_rows(jnp.asarray(x), block)
    assert q.shape == (m, quant.act_blocks(k, block) * block) and q.dtype == jnp.int8
    want_q, want_scale = f32_quantize_rows(x, block)
    np.testing.assert_array_equal(np.asarray(q)[:, :k], want_q)
    assert not np.asarray(q)[:, k:].any()  # zero padding
    np.testing.assert_array_equal(scale, want_scale)
    assert want_scale[0, 0] == 1 and not want_q[0, :block].any()
    if k > block:
        assert want_scale[1, 1] < want_scale[1, 0] / 100


@pytest.mark.parametrize(
    ("m", "k", "n", "block"), [(7, 64, 48, 128), (9, 576, 32, 128), (3, 96, 16, 32)]
)
def test_int8_matmul_is_its_definition(m, k, n, block):
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    w = rng.standard_normal((k, n))
    q, scale = quant.quantize_columns(w, block)
    out = quant.int8_matmul(jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale), block)
    truth = f64_int8_matmul(x, q, scale, block)
    np.testing.assert_allclose(out, truth, rtol=0, atol=1e-6 * np.abs(truth).max())
    # and it approximates the float product to int8 resolution
    exact = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) @ w
    assert np.abs(out - exact).max() < 0.05 * np.abs(exact).max()
