"""oneDNN's matmul on weights it packed (score_kernels/onednn.py, _native/dense_onednn.cc) against
float64, through whichever instructions oneDNN dispatches to on this CPU (AMX, AVX512-BF16,
AVX-512; on AVX2 it has no bf16 matmul). Its scores in a model against the f32 model, and the path
refused where it does not run: tests/test_dense_choice.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import load_model
from score_kernels import dense, onednn, select_dense

pytestmark = [
    pytest.mark.skipif(
        not onednn.AVAILABLE,
        reason=f"needs oneDNN's bf16 matmul (built: {onednn.BUILT}, on {onednn.isa()})",
    ),
    pytest.mark.usefixtures("on_the_cpu"),
]


def bf16(rng, *shape) -> np.ndarray:
    return np.asarray(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16), np.float32)


def check(x, w, out) -> None:
    """out within the bound of any f32 accumulation of x @ w (x, w exactly bf16)."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    bound = x.shape[1] * 2.0**-23 * (np.abs(x64) @ np.abs(w64))
    assert out.shape == (x.shape[0], w.shape[1]) and out.dtype == np.float32
    assert np.all(np.abs(np.asarray(out, np.float64) - x64 @ w64) <= bound + 1e-30)


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(1, 2, 16), (3, 64, 90), (8, 96, 64), (23, 576, 192), (257, 1536, 576), (1031, 576, 1536)],
)
def test_equals_float64(m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, w = bf16(rng, m, k), bf16(rng, 2, k, n)
    packed = jnp.asarray(onednn.pack(w))
    f = jax.jit(lambda x, w, layer: onednn.dense(x, w, layer, n))
    for layer in range(2):
        check(x, w[layer], np.asarray(f(jnp.asarray(x, jnp.bfloat16), packed, layer)))


def test_f32_weights_are_rounded_to_bf16_as_numpy_rounds_them():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1, 64, 48)).astype(np.float32)
    x = bf16(rng, 5, 64)
    out = onednn.dense(jnp.asarray(x), jnp.asarray(onednn.pack(w)), 0, 48)
    check(x, np.asarray(w[0].astype(jnp.bfloat16), np.float32), np.asarray(out))


def test_bad_shapes_and_layers_are_refused():
    rng = np.random.default_rng(2)
    packed = jnp.asarray(onednn.pack(bf16(rng, 2, 64, 32)))
    x = jnp.asarray(bf16(rng, 8, 64))
    with pytest.raises(Exception, match="layer 2 outside the stack of 2"):
        onednn.dense(x, packed, 2, 32).block_until_ready()
    with pytest.raises(Exception, match="not the packing of"):
        onednn.dense(x, packed, 0, 512).block_until_ready()
    with pytest.raises(Exception, match="not the packing of"):
        onednn.dense(jnp.asarray(bf16(rng, 8, 66)), packed, 0, 32).block_until_ready()


def test_the_strategy_keeps_what_it_cannot_take_in_xla_form(monkeypatch):
    assert select_dense("onednn", "cpu", dtype=jnp.bfloat16) is dense.ONEDNN
    with pytest.raises(ValueError, match="bfloat16 weights"):
        select_dense("onednn", "cpu", dtype=jnp.float32)
    packed = dense.ONEDNN.prepare(np.ones((2, 64, 48), np.float32), jnp.bfloat16)
    assert isinstance(packed, dense.OneDnnPacked) and packed.n == 48
    f32 = dense.ONEDNN.prepare(np.ones((2, 64, 48)), jnp.float32)
    assert not isinstance(f32, dense.OneDnnPacked)
    monkeypatch.setattr(onednn, "supports", lambda k, n: False)
    plain = dense.ONEDNN.prepare_head(np.ones((40, 64), np.float32), jnp.bfloat16)
    assert not isinstance(plain, dense.OneDnnPacked) and plain.shape == (40, 64)


def test_a_model_on_onednn_packs_every_matrix(tiny_checkpoints):
    model = load_model(tiny_checkpoints["qwen3"], dtype="bfloat16", dense="onednn", progress=False)
    assert model.program.dense.name == "onednn"
    matrices = model.program.params["matrices"]
    assert all(isinstance(matrices[n], dense.OneDnnPacked) for n in ("qkv", "o", "gate_up", "down"))
    assert isinstance(model.program.params["head"], dense.OneDnnPacked)
