"""The native pre-packed f32 dense kernel (_native/dense_f32.cc) against float64 and XLA's dot,
and models multiplying by it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import load_model
from score_kernels import cpu, select_dense
from score_kernels.dense import Packed

pytestmark = [
    pytest.mark.skipif(not cpu.F32_AVAILABLE, reason="needs the native f32 kernel"),
    pytest.mark.usefixtures("on_the_cpu"),
]

ISAS = cpu.f32_isas() if cpu.F32_AVAILABLE else ()


@pytest.fixture(params=ISAS)
def isa(request):
    """Each build this CPU runs (AVX2 everywhere; AVX-512 where the CPU has it)."""
    cpu.set_f32_isa(request.param)
    yield request.param
    cpu.set_f32_isa(None)


@jax.jit
def native(x, w, layer):
    return cpu.dense_cpu(x, w, layer)


def normal(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def packed(w) -> jax.Array:
    return jnp.asarray(cpu.pack_dense(w, np.float32))


def within_bound(out, x, w) -> float:
    """The worst error against float64 over the bound of any f32 sum of K f32 products,
    `K * 2^-23 * (|x| @ |w|)`: at most 1 is within it."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    bound = x.shape[1] * 2.0**-23 * (np.abs(x) @ np.abs(w)) + 1e-30
    return float(np.max(np.abs(np.asarray(out, np.float64) - x @ w) / bound))


# rows cover every register-tile height (1..8 and beyond) and tails of a row block; columns
# every panel width (1..3 groups of 16) and several panels; K from under one chunk of 8, ending
# in part of one, up to a model's intermediate size
SHAPES = [
    (1, 8, 16),
    (3, 5, 16),
    (4, 13, 32),
    (11, 390, 48),
    (2, 16, 32),
    (5, 24, 48),
    (6, 64, 64),
    (7, 72, 80),
    (9, 128, 96),
    (13, 384, 112),
    (100, 384, 384),
    (257, 1536, 384),
    (1031, 384, 1536),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_equals_float64_within_the_f32_bound_and_xla(isa, m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, w = normal(rng, m, k), normal(rng, k, n)
    out = native(x, packed(w[None]), 0)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    assert within_bound(out, x, w) <= 1
    xla = jnp.matmul(x, w, precision="highest")
    np.testing.assert_allclose(out, xla, rtol=0, atol=4e-6 * np.abs(xla).max())


def test_a_row_does_not_depend_on_its_batch(isa):
    # every output is one in-order sum over K whatever tile the row lands in
    rng = np.random.default_rng(1)
    x, w = normal(rng, 67, 384), packed(normal(rng, 1, 384, 80))
    whole = np.asarray(native(x, w, 0))
    for start, stop in ((0, 1), (5, 6), (3, 17), (60, 67), (7, 67)):
        np.testing.assert_array_equal(whole[start:stop], native(x[start:stop], w, 0))


def test_rows_copied_per_block_equal_rows_copied_whole(isa):
    # one thread: 1000 rows are several row blocks, each copied in its own work item; a few
    # rows split the columns and are copied whole first
    rng = np.random.default_rng(9)
    x, w = normal(rng, 1000, 390), packed(normal(rng, 1, 390, 96))
    try:
        cpu.set_threads(1)
        whole = np.asarray(jax.jit(lambda x, w: cpu.dense_cpu(x, w, 0) + 0)(x, w))
    finally:
        cpu.set_threads(0)
    for start, stop in ((0, 1), (3, 10), (160, 170), (990, 1000)):
        np.testing.assert_array_equal(whole[start:stop], native(x[start:stop], w, 0))


@pytest.mark.parametrize("count", [0, 1, 6, 23, 40, 45])
def test_rows_past_the_count_are_zeros_and_the_rest_unchanged(isa, count):
    """A batch's padding (rows past `rows`, a traced operand) is not multiplied: zeros there,
    and every real row bitwise as the whole product has it."""
    rng = np.random.default_rng(count)
    m, k, n = 40, 90, 48
    x, w = jnp.asarray(normal(rng, m, k)), packed(normal(rng, 1, k, n))
    run = jax.jit(lambda x, w, rows: cpu.dense_cpu(x, w, 0, rows))
    whole, out = (np.asarray(run(x, w, rows)) for rows in (m, count))
    real = min(count, m)
    np.testing.assert_array_equal(out[:real], whole[:real])
    assert not out[real:].any() and whole[real:].all()


def test_the_builds_agree(isa):
    rng = np.random.default_rng(2)
    x, w = normal(rng, 50, 256), packed(normal(rng, 1, 256, 48))
    here = np.asarray(native(x, w, 0))
    cpu.set_f32_isa("avx2")
    np.testing.assert_array_equal(here, native(x, w, 0))  # FMAs in the same order on each


def test_the_layer_index_picks_the_matrix():
    rng = np.random.default_rng(4)
    x, stack = normal(rng, 33, 64), normal(rng, 3, 64, 48)
    w = packed(stack)
    assert w.shape == (3, 3, 64, 16)
    for layer in range(3):
        assert within_bound(native(x, w, layer), x, stack[layer]) <= 1


def test_bf16_inputs_are_widened():
    rng = np.random.default_rng(3)
    x = jnp.asarray(normal(rng, 40, 64), jnp.bfloat16)
    w = normal(rng, 64, 32)
    out = native(x, packed(w[None]), 0)
    assert within_bound(out, np.asarray(x, np.float32), w) <= 1


def test_thread_count_does_not_change_results(isa):
    rng = np.random.default_rng(5)
    x, w = normal(rng, 300, 128), packed(normal(rng, 1, 128, 96))
    every = np.asarray(native(x, w, 0))  # computed now, on every thread (dispatch is async)
    try:
        cpu.set_threads(1)
        one = np.asarray(jax.jit(lambda x, w: cpu.dense_cpu(x, w, 0) + 0)(x, w))
    finally:
        cpu.set_threads(0)
    np.testing.assert_array_equal(every, one)


def test_outputs_past_the_stream_size_are_the_same(isa):
    # 8192 x 512 f32 is 16 MiB: the kernel writes it with streaming stores
    rng = np.random.default_rng(8)
    x, w = normal(rng, 8192, 32), normal(rng, 1, 32, 512)
    assert 8192 * 512 * 4 >= cpu.STREAM_BYTES > 4096 * 512 * 4
    wp = packed(w)
    whole = np.asarray(native(x, wp, 0))
    halves = [np.asarray(native(x[:4096], wp, 0)), np.asarray(native(x[4096:], wp, 0))]
    np.testing.assert_array_equal(whole, np.concatenate(halves))
    assert within_bound(whole, x, w[0]) <= 1


def test_bad_shapes_and_layers_are_refused():
    rng = np.random.default_rng(6)
    x, w = normal(rng, 8, 64), packed(normal(rng, 2, 64, 32))
    with pytest.raises(ValueError, match="do not take x"):
        cpu.dense_cpu(normal(rng, 8, 72), w, 0)
    with pytest.raises(Exception, match="layer 2 outside the stack of 2"):
        native(x, w, 2).block_until_ready()
    assert cpu.dense_supports(384, 1536, jnp.float32)
    assert cpu.dense_supports(388, 1536, jnp.float32)  # any K: the last chunk may be partial
    assert not cpu.dense_supports(384, 1544, jnp.float32)  # N: groups of 16
    assert not cpu.dense_supports(384, 1536, jnp.float16)
    with pytest.raises(ValueError, match="isa must be one of"):
        cpu.set_f32_isa("avx2_bf16")
    assert cpu.f32_isa() == ISAS[-1]  # the widest, by default


def test_select_dense():
    assert select_dense(None, "cpu", dtype=jnp.float32).name == "measured"
    assert select_dense("cpu", "cpu", dtype=jnp.float32).name == "cpu"
    assert select_dense(None, "gpu", dtype=jnp.float32).name == "xla"
    with pytest.raises(ValueError, match="needs the CPU backend, bfloat16 or float32 weights"):
        select_dense("cpu", "gpu", dtype=jnp.float32)
    with pytest.raises(ValueError, match="bfloat16 weights"):
        select_dense("onednn", "cpu", dtype=jnp.float32)


@pytest.mark.parametrize("family", ["llama-untied", "qwen3", "gemma2"])
def test_a_packed_f32_model_scores_as_xla(tiny_checkpoints, family):
    model = load_model(tiny_checkpoints[family], dtype="float32", dense="cpu", progress=False)
    xla = load_model(tiny_checkpoints[family], dtype="float32", dense="xla", progress=False)
    matrices = model.program.params["matrices"]
    assert all(isinstance(matrices[n], Packed) for n in ("qkv", "o", "gate_up", "down"))
    assert all(matrices[n].data.dtype == jnp.float32 for n in ("qkv", "o", "gate_up", "down"))
    rng = np.random.default_rng(7)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (1, 9, 40, 70)]
    got, want = (np.log(m.score(query, items, [1, 2, 3])) for m in (model, xla))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_a_packed_f32_encoder_embeds_as_xla(minilm):
    texts = ["a short text", "a somewhat longer text about the weather in spring", "x " * 40]
    model = load_model(minilm, dtype="float32", dense="cpu", progress=False)
    xla = load_model(minilm, dtype="float32", dense="xla", progress=False)
    assert isinstance(model.program.params["matrices"]["up"], Packed)
    got, want = model.embed(texts), xla.embed(texts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
