"""GPTQ in the int8 mode: the Hessians the recording strategy collects
(`score_kernels.calibration`) against numpy's X^T X of the rotated bf16 inputs, `quant.Rounded`
stacks multiplied as the rounding they carry, and the engine's calibration pass
(`engine.calibration`, `EngineConfig.int8_rounding`)."""

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


def rotated_bf16(x: np.ndarray) -> np.ndarray:  # f64[M, K]: as the int8 kernels see x
    x = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    blocks = x.reshape(len(x), -1, quant.ACT_BLOCK)
    return (blocks @ quant.sylvester(quant.ACT_BLOCK)).reshape(x.shape)


def test_recorded_hessians_are_the_real_rows_rotated():
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
    ten = rotated_bf16(x[:10])
    np.testing.assert_allclose(sums[1], ten.T @ ten, rtol=1e-12, atol=1e-9)
    four = rotated_bf16(x[:4])
    np.testing.assert_allclose(sums[2], four.T @ four, rtol=1e-12, atol=1e-9)
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
    np.testing.assert_allclose(h, rotated_bf16(x).T @ rotated_bf16(x), rtol=1e-12, atol=1e-9)


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
    for layer, h in enumerate(hessians.of(w)):
        q, scale = gptq.round_columns(quant.rotate_weights(w[layer]), h)
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


def test_the_calibration_texts_include_relevance_prompts():
    texts = sequences()
    assert len(texts) == len(set(texts)) >= 40
    assert sum("Answer yes or no" in t for t in texts) >= 20


def test_gptq_rounding_in_the_engine(tiny_checkpoints):
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
        }.items()
    }
    moved = {k: np.abs(np.log(scores[k]) - np.log(scores["f32"])).mean() for k in scores}
    assert scores["gptq"] != scores["nearest"]
    assert 0 < moved["gptq"] < moved["nearest"]
    with pytest.raises(InvalidInput, match="int8_rounding: must be one of nearest, gptq"):
        load_model(path, dtype="int8", int8_rounding="best", progress=False)
