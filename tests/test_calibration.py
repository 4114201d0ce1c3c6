"""Calibrated int8: the Hessians and channel maxima the recording strategy collects
(`score_kernels.calibration`) against numpy's of the bf16 inputs, GPTQ and SmoothQuant's
smoothing of each stack, `quant.Rounded` stacks multiplied as the rounding (and smoothing) they
carry, and the engine's calibration pass (`engine.calibration`, `EngineConfig.int8_rounding`
and `int8_smoothing`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import InvalidInput, load_model
from engine.calibration import sequences
from score_kernels import cpu, gptq, quant
from score_kernels.calibration import Hessians, digest, recording
from score_kernels.dense import INT8, INT8_XLA, XLA

STRATEGIES = [INT8_XLA] + ([INT8] if cpu.INT8_AVAILABLE else [])


def bf16(x: np.ndarray) -> np.ndarray:  # f64[M, K]: x as the int8 kernels take it
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def rotated_bf16(x: np.ndarray) -> np.ndarray:  # f64[M, K]: as the int8 kernels rotate x
    blocks = bf16(x).reshape(len(x), -1, quant.ACT_BLOCK)
    return (blocks @ quant.sylvester(quant.ACT_BLOCK)).reshape(x.shape)


def test_recorded_hessians_are_the_real_rows():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 256, 48)).astype(np.float32)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    hessians = Hessians()
    strategy = recording(hessians)
    prepared = strategy.prepare(w, jnp.float32)
    product = jax.jit(strategy.matmul)
    y = product(x, prepared, jnp.int32(1), jnp.int32(10))
    product(x[:4], prepared, jnp.int32(2), None)  # no count: every row
    np.testing.assert_allclose(y, XLA.matmul(x, XLA.prepare(w, jnp.float32), 1), rtol=1e-6)
    sums = hessians.sums[digest(w)]
    assert sorted(sums) == [1, 2] and hessians.rows[digest(w)] == 14
    ten = bf16(x[:10])
    np.testing.assert_allclose(sums[1], ten.T @ ten, rtol=1e-12, atol=1e-9)
    four = bf16(x[:4])
    np.testing.assert_allclose(sums[2], four.T @ four, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(hessians.maxima[digest(w)][2], np.abs(four).max(0))
    turned = rotated_bf16(x[:10])  # the sums of the rows the int8 kernels multiply
    np.testing.assert_allclose(quant.rotate_hessian(sums[1]), turned.T @ turned, atol=1e-8)
    assert hessians.of(w) is None  # layer 0 never ran: no rounding by half the layers


def test_a_gated_pair_records_under_both_its_matrices():
    rng = np.random.default_rng(1)
    gate, up = (rng.standard_normal((1, 128, 32)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((8, 128)).astype(np.float32)
    hessians = Hessians()
    strategy = recording(hessians)
    y = strategy.gated(x, strategy.prepare_gated(gate, up, jnp.float32), jnp.int32(0))
    want = XLA.gated(x, XLA.prepare_gated(gate, up, jnp.float32), 0)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    [h] = hessians.of(gate)
    [same] = hessians.of(up)
    np.testing.assert_array_equal(h, same)
    np.testing.assert_allclose(h, bf16(x).T @ bf16(x), rtol=1e-12, atol=1e-9)


def test_rounded_stacks_are_gptq_of_each_layer():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2, 256, 32)).astype(np.float32)
    hessians = Hessians()
    strategy = recording(hessians)
    prepared = strategy.prepare(w, jnp.float32)
    for layer in range(2):
        x = rng.standard_normal((300, 256)).astype(np.float32) * (1 + layer)
        strategy.matmul(x, prepared, jnp.int32(layer))
    jax.effects_barrier()  # every recording landed (an io_callback runs asynchronously)
    rounded = hessians.rounded(w)
    assert isinstance(rounded, quant.Rounded) and rounded.shape == w.shape
    assert rounded.smooth is None
    for layer, h in enumerate(hessians.of(w)):
        q, scale = gptq.round_columns(quant.rotate_weights(w[layer]), quant.rotate_hessian(h))
        np.testing.assert_array_equal(rounded.q[layer], q)
        np.testing.assert_array_equal(rounded.scale[layer], scale)
    nearest = quant.quantize_columns(w)
    assert (rounded.q != nearest[0]).mean() > 0.05  # GPTQ moved many weights off the nearest


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_a_rounded_stack_multiplies_as_its_rounding(strategy):
    rng = np.random.default_rng(3)
    w, gate, up = (rng.standard_normal((2, 256, 64)).astype(np.float32) for _ in range(3))
    x = jnp.asarray(rng.standard_normal((24, 256)), jnp.float32)
    layer = jnp.int32(1)
    carried = strategy.prepare(quant.Rounded(*quant.quantize_columns(w)), jnp.bfloat16)
    own = strategy.prepare(w, jnp.bfloat16)
    np.testing.assert_array_equal(
        strategy.matmul(x, carried, layer), strategy.matmul(x, own, layer)
    )
    pair = [quant.Rounded(*quant.quantize_columns(m)) for m in (gate, up)]
    carried = strategy.prepare_gated(*pair, jnp.bfloat16)
    own = strategy.prepare_gated(gate, up, jnp.bfloat16)
    np.testing.assert_array_equal(strategy.gated(x, carried, layer), strategy.gated(x, own, layer))


def recorded(hessians: Hessians, *stacks, rows: int = 200, seed: int = 5):
    """Each layer of the [L, 256, N] `stacks` (a pair: a gated one) multiplied by rows whose
    channel 7 is an outlier, recorded into `hessians`."""
    rng = np.random.default_rng(seed)
    strategy = recording(hessians)
    if len(stacks) == 2:
        prepared, product = strategy.prepare_gated(*stacks, jnp.float32), strategy.gated
    else:
        prepared, product = strategy.prepare(stacks[0], jnp.float32), strategy.matmul
    for layer in range(stacks[0].shape[0]):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        x[:, 7] *= 50
        product(x, prepared, jnp.int32(layer))
    jax.effects_barrier()  # every recording landed


@pytest.mark.parametrize("by_gptq", [False, True], ids=["nearest", "gptq"])
def test_smoothed_stacks_are_smoothquants_then_rounded(by_gptq):
    """s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), the weights' rows multiplied by it and the
    inputs' sums divided by it, then rotated and rounded (by GPTQ, or to nearest)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((2, 256, 32)).astype(np.float32)
    hessians = Hessians(gptq=by_gptq, alpha=0.5)
    recorded(hessians, w)
    rounded = hessians.rounded(w)
    maxima = hessians.maxima[digest(w)]
    assert rounded.smooth.shape == (2, 256) and rounded.smooth.dtype == np.float32
    for layer, h in enumerate(hessians.of(w)):
        s = rounded.smooth[layer]
        weights = np.abs(w[layer]).max(1).astype(np.float64)
        np.testing.assert_allclose(s, np.sqrt(maxima[layer] / weights), rtol=1e-6)
        assert s[7] > 5 * np.median(s)  # the outlier channel divided most
        smoothed = quant.rotate_weights(w[layer] * s[:, None])
        if by_gptq:
            h = quant.rotate_hessian(h / np.outer(s, s))
            q, scale = gptq.round_columns(smoothed, h)
        else:
            q, scale = quant.round_columns(smoothed)
        np.testing.assert_array_equal(rounded.q[layer], q)
        np.testing.assert_array_equal(rounded.scale[layer], scale)


def test_a_gated_pair_is_smoothed_as_one_input():
    rng = np.random.default_rng(7)
    gate, up = (rng.standard_normal((1, 256, 32)).astype(np.float32) for _ in range(2))
    up[0, 3] *= 10  # row 3's largest weight is up's: both matrices' rows are weighed
    hessians = Hessians(gptq=False, alpha=0.5)
    recorded(hessians, gate, up)
    smooth = hessians.rounded(gate).smooth
    np.testing.assert_array_equal(smooth, hessians.rounded(up).smooth)
    weights = np.maximum(np.abs(gate), np.abs(up)).max(-1).astype(np.float64)
    want = np.sqrt(hessians.maxima[digest(gate)][0] / weights[0])
    np.testing.assert_allclose(smooth[0], want, rtol=1e-6)
    assert Hessians(gptq=False).rounded(gate) is gate  # nothing recorded there


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_a_smoothed_stack_divides_its_inputs(strategy):
    """The activations' channels times the stack's divisors' reciprocals (rounded to bf16), then the
    int8 arithmetic (`quant.int8_matmul`) on the smoothed weights' grid; the gated form too."""
    rng = np.random.default_rng(8)
    w, gate, up = (rng.standard_normal((2, 256, 64)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((24, 256)).astype(np.float32)
    x[:, 3] *= 40
    hessians = Hessians(gptq=False, alpha=0.5)
    recorded(hessians, w)
    recorded(hessians, gate, up, seed=9)
    layer = jnp.int32(1)
    rounded = hessians.rounded(w)
    inputs = x * (1 / rounded.smooth[1]).astype(np.float32)  # as the strategies multiply
    twin = quant.int8_matmul(jnp.asarray(inputs), rounded.q[1], rounded.scale[1])
    got = strategy.matmul(x, strategy.prepare(rounded, jnp.bfloat16), layer)
    np.testing.assert_allclose(got, twin, rtol=1e-5, atol=1e-5 * float(np.abs(twin).max()))
    exact = x @ w[1]
    assert np.abs(got - exact).max() < 0.05 * np.abs(exact).max()
    pair = [hessians.rounded(m) for m in (gate, up)]
    got = strategy.gated(x, strategy.prepare_gated(*pair, jnp.bfloat16), layer)
    want = XLA.gated(x, XLA.prepare_gated(gate, up, jnp.float32), 1)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    with pytest.raises(ValueError, match="smoothed differently"):
        strategy.prepare_gated(pair[0], quant.Rounded(pair[1].q, pair[1].scale), jnp.bfloat16)


def test_the_calibration_texts_include_relevance_prompts():
    texts = sequences()
    assert len(texts) == len(set(texts)) >= 40
    assert sum("Answer yes or no" in t for t in texts) >= 20


def test_calibrated_rounding_in_the_engine(tiny_checkpoints):
    path = tiny_checkpoints["llama-untied"]
    rng = np.random.default_rng(4)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (5, 20, 60)]
    scores = {
        name: load_model(path, progress=False, **options).score(query, items, [1, 2, 3])
        for name, options in {
            "f32": dict(dtype="float32"),
            "nearest": dict(dtype="int8"),
            "gptq": dict(dtype="int8", int8_rounding="gptq"),
            "smoothed": dict(dtype="int8", int8_smoothing=0.5),
            "both": dict(dtype="int8", int8_rounding="gptq", int8_smoothing=0.5),
        }.items()
    }
    moved = {k: np.abs(np.log(scores[k]) - np.log(scores["f32"])).mean() for k in scores}
    assert scores["gptq"] != scores["nearest"]
    assert 0 < moved["gptq"] < moved["nearest"]
    assert len({str(scores[k]) for k in ("nearest", "gptq", "smoothed", "both")}) == 4
    # random weights have no outlier channels to move (docs/int8.md measures real ones): the
    # smoothed roundings stay in int8's class
    assert 0 < moved["smoothed"] < 3 * moved["nearest"] and 0 < moved["both"] < 3 * moved["nearest"]
    with pytest.raises(InvalidInput, match="int8_rounding: must be one of nearest, gptq"):
        load_model(path, dtype="int8", int8_rounding="best", progress=False)
    with pytest.raises(InvalidInput, match="int8_smoothing: must be within 0"):
        load_model(path, dtype="int8", int8_smoothing=1.5, progress=False)
