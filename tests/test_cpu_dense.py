"""The native pre-packed bf16 dense kernel against XLA's dot and float64, and the model using it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine import load_model
from score_kernels import activations, cpu, select_dense
from score_kernels.dense import Packed, split_qkv
from score_kernels.rope import rotate

pytestmark = [
    pytest.mark.skipif(not cpu.DENSE_AVAILABLE, reason="needs the native bf16 kernel"),
    pytest.mark.usefixtures("on_the_cpu"),
]

ISAS = cpu.dense_isas() if cpu.DENSE_AVAILABLE else ()


@pytest.fixture(params=ISAS)
def isa(request):
    """Each build this CPU runs (AVX2 everywhere; AVX512-BF16 where the CPU has it)."""
    cpu.set_dense_isa(request.param)
    yield request.param
    cpu.set_dense_isa(None)


@jax.jit
def native(x, w, layer):
    return cpu.dense_cpu(x, w, layer)


@jax.jit
def xla(x, w):
    return jnp.matmul(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)


def bf16(rng, *shape) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)


def exact(x, w) -> np.ndarray:
    """x @ w in float64 from the bf16 values (products of bf16 are exact in f32)."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


# rows cover every register-tile height (1..8 and beyond); columns every panel width (1..3
# groups of 16) and several panels; K from one pair (and ending in part of a chunk of 8, as the
# AVX2 build copies the activations) up to a model's hidden size
SHAPES = [
    (1, 2, 16),
    (2, 10, 16),
    (6, 22, 32),
    (3, 64, 32),
    (7, 64, 48),
    (8, 96, 64),
    (9, 128, 80),
    (23, 576, 192),
    (100, 576, 576),
    (257, 1536, 576),
    (1031, 576, 1536),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_equals_xla_and_float64(isa, m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, w = bf16(rng, m, k), bf16(rng, k, n)
    out = native(x, jnp.asarray(cpu.pack_dense(w[None])), 0)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    truth = exact(x, w)
    np.testing.assert_allclose(out, truth, rtol=0, atol=2e-6 * np.abs(truth).max() + 1e-30)
    np.testing.assert_allclose(out, xla(x, w), rtol=0, atol=2e-6 * np.abs(truth).max())


@pytest.mark.parametrize(
    ("m", "k", "i"),
    [
        (1, 2, 16),
        (4, 10, 16),
        (5, 64, 16),
        (7, 64, 48),
        (11, 70, 48),
        (13, 128, 80),
        (300, 576, 1536),
    ],
)
def test_gated_equals_the_activation_of_gate_times_up(isa, m, k, i):
    """bf16(act(x @ gate) * (x @ up)) for every activation (SwiGLU, GeGLU, ...)."""
    rng = np.random.default_rng(m + k + i)
    x, gate, up = bf16(rng, m, k), bf16(rng, 2, k, i) * 0.3, bf16(rng, 2, k, i)
    packed = jnp.asarray(cpu.pack_gated(gate, up))
    g, u = exact(x, gate[1]), exact(x, up[1])
    run = jax.jit(cpu.gated_cpu, static_argnames="activation")
    for activation in activations.CODES:
        out = run(x, packed, 1, activation=activation)
        assert out.shape == (m, i) and out.dtype == jnp.bfloat16
        truth = activation_truth(activation, g) * u
        # one bf16 rounding (half an ulp) of an f32 result (whose sums of K products carry an
        # absolute error of a few f32 ulps of the largest values)
        atol = 1e-5 * np.abs(truth).max()
        np.testing.assert_allclose(np.asarray(out, np.float64), truth, rtol=2**-8, atol=atol)


def activation_truth(name: str, y: np.ndarray) -> np.ndarray:
    """The activation in float64 (erfc for GELU's negative side, as precise as its values)."""
    from scipy.special import erfc

    if name == "identity":
        return y
    if name == "gelu":
        return 0.5 * y * erfc(-y / np.sqrt(2))
    if name == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    return np.maximum(y, 0) if name == "relu" else y / (1 + np.exp(-y))


@pytest.mark.parametrize("activation", list(activations.CODES))
@pytest.mark.parametrize(("m", "k", "n"), [(1, 2, 16), (7, 64, 48), (13, 70, 80), (300, 384, 1536)])
def test_activated_equals_the_activation_of_product_plus_bias(isa, activation, m, k, n):
    """bf16(act(x @ W + bias)): within one bf16 rounding of float64, and equal to XLA's own
    f32 chain rounded to bf16 but for values at a rounding boundary (an ulp apart there). XLA's
    CPU tanh is a fast form (3e-4 relative), so with it a quarter of the values round apart:
    there the float64 bound alone holds."""
    rng = np.random.default_rng(m + k + n)
    x, w = bf16(rng, m, k), bf16(rng, 2, k, n) * 0.3
    bias = jnp.asarray(rng.standard_normal(n) * 2, jnp.float32)
    run = jax.jit(cpu.activated_cpu, static_argnames="activation")
    out = run(x, jnp.asarray(cpu.pack_dense(w)), 1, bias, activation=activation)
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    truth = activation_truth(activation, exact(x, w[1]) + np.asarray(bias, np.float64))
    atol = 1e-5 * np.abs(truth).max()
    np.testing.assert_allclose(np.asarray(out, np.float64), truth, rtol=2**-8, atol=atol)
    chain = activations.apply(activation, xla(x, w[1]) + bias).astype(jnp.bfloat16)
    apart = np.asarray(out, np.float64) != np.asarray(chain, np.float64)
    assert activation == "gelu_tanh" or apart.mean() < 0.01
    np.testing.assert_allclose(
        np.asarray(out, np.float64), np.asarray(chain, np.float64), rtol=2**-7, atol=atol
    )


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 2, 16), (7, 64, 48), (45, 96, 80), (300, 384, 576)])
def test_residual_adds_the_product_as_xla_adds_it(isa, m, k, n, biased):
    """(residual + x @ W) + bias: bitwise the plain product's sums added in XLA in that order."""
    rng = np.random.default_rng(m + k + n)
    x, w = bf16(rng, m, k), jnp.asarray(cpu.pack_dense(bf16(rng, 2, k, n)))
    residual = jnp.asarray(rng.standard_normal((m, n)) * 4, jnp.float32)
    bias = jnp.asarray(rng.standard_normal(n), jnp.float32) if biased else None
    out = jax.jit(cpu.dense_add_cpu)(x, w, 1, residual, bias)
    want = residual + native(x, w, 1)
    want = want if bias is None else want + bias
    assert out.shape == (m, n) and out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_residual_is_written_over_where_it_is_given_up(isa):
    """A residual the program gives up (donated here; a dead residual stream in the forward)
    takes the output: the compiled program writes the sums over it, no copy into a fresh
    buffer. One still live is left as it was."""
    rng = np.random.default_rng(3)
    x, w = bf16(rng, 40, 64), jnp.asarray(cpu.pack_dense(bf16(rng, 1, 64, 32)))
    values = rng.standard_normal((40, 32)).astype(np.float32)
    want = np.asarray(jnp.asarray(values) + native(x, w, 0))
    residual = jnp.asarray(values)
    kept = jax.jit(cpu.dense_add_cpu)(x, w, 0, residual)
    np.testing.assert_array_equal(np.asarray(residual), values)
    np.testing.assert_array_equal(np.asarray(kept), want)
    given_up = jax.jit(cpu.dense_add_cpu, donate_argnums=3)
    program = given_up.lower(x, w, 0, residual).compile().as_text()
    assert "output_to_operand_aliasing={{}: (4, {})}" in program
    assert " copy(" not in program
    np.testing.assert_array_equal(np.asarray(given_up(x, w, 0, residual)), want)


# (rows, K, heads, kv heads, head dim): MiniLM's heads, grouped queries, one kv head, D 64
# and 128 (several groups a head), and rows over several register tiles and work items
QKV_SHAPES = [(1, 32, 2, 2, 16), (7, 64, 4, 2, 32), (45, 96, 6, 1, 64), (300, 384, 12, 12, 32)]
QKV_SHAPES += [(70, 128, 4, 2, 128)]


def rope_tables(rng, m: int, d: int) -> tuple[jax.Array, jax.Array]:
    angles = rng.uniform(0, 2 * np.pi, (m, d // 2))
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


@pytest.mark.parametrize("rotated", [False, True])
@pytest.mark.parametrize(("m", "k", "heads", "kv_heads", "d"), QKV_SHAPES)
def test_qkv_writes_the_biased_product_into_its_heads(isa, m, k, heads, kv_heads, d, rotated):
    """bf16(x @ W + bias), q and k rotated by RoPE where it is given, written into q, k and v:
    without RoPE bitwise the activated form's identity split in XLA (`split_qkv`); with it,
    within one bf16 rounding of float64 and equal to XLA's f32 rotation rounded to bf16 but
    for values at a rounding boundary."""
    rng = np.random.default_rng(m + heads + d)
    n = (heads + 2 * kv_heads) * d
    x, w = bf16(rng, m, k), bf16(rng, 2, k, n) * 0.3
    bias = jnp.asarray(rng.standard_normal(n) * 2, jnp.float32)
    rope = rope_tables(rng, m, d) if rotated else None
    run = jax.jit(cpu.qkv_cpu, static_argnames=("heads", "kv_heads"))
    packed = jnp.asarray(cpu.pack_qkv(w, heads, kv_heads))
    q, kk, v = got = run(x, packed, 1, bias, heads=heads, kv_heads=kv_heads, rope=rope)
    assert q.shape == (m, heads, d) and kk.shape == v.shape == (m, kv_heads, d)
    assert q.dtype == kk.dtype == v.dtype == jnp.bfloat16
    plain = cpu.activated_cpu(x, jnp.asarray(cpu.pack_dense(w)), 1, bias, "identity")
    want = split_qkv(xla(x, w[1]) + bias, heads, kv_heads)  # f32, as XLA rotates it
    truth = split_qkv(exact(x, w[1]) + np.asarray(bias, np.float64), heads, kv_heads)
    if rotated:
        cos, sin = (np.asarray(t, np.float64) for t in rope)
        truth = (*(rotate_f64(t, cos, sin) for t in truth[:2]), truth[2])
        want = (*(rotate(t, *rope) for t in want[:2]), want[2])
    else:
        for out, split in zip(got, split_qkv(plain, heads, kv_heads), strict=True):
            np.testing.assert_array_equal(
                np.asarray(out, np.float32), np.asarray(split, np.float32)
            )
    for out, chain, exact_out in zip(got, want, truth, strict=True):
        out, chain = np.asarray(out, np.float64), np.asarray(chain.astype(jnp.bfloat16), np.float64)
        atol = 1e-5 * np.abs(exact_out).max()
        np.testing.assert_allclose(out, exact_out, rtol=2**-8, atol=atol)
        assert (out != chain).mean() < 0.01
        np.testing.assert_allclose(out, chain, rtol=2**-7, atol=atol)


def rotate_f64(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE in float64 (`score_kernels.rope.rotate`)."""
    x1, x2 = np.split(x, 2, axis=-1)
    cos, sin = cos[:, None], sin[:, None]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_qkv_places_each_head_by_kv_head(isa):
    """Each column reaches its own head: W the identity, so q, k and v hold x's columns in the
    layout `split_qkv` defines (for kv head j, its G query heads, then k, then v), though
    `pack_qkv` pairs the q and k columns for RoPE."""
    heads, kv_heads, d, m = 4, 2, 32, 5
    n = (heads + 2 * kv_heads) * d
    x = jnp.asarray(np.arange(m * n).reshape(m, n) % 251, jnp.bfloat16)
    eye = jnp.asarray(cpu.pack_qkv(np.eye(n, dtype=np.float32)[None], heads, kv_heads))
    q, k, v = cpu.qkv_cpu(x, eye, 0, jnp.zeros(n), heads, kv_heads)
    by_head = np.asarray(x, np.float32).reshape(m, kv_heads, heads // kv_heads + 2, d)
    np.testing.assert_array_equal(np.asarray(q, np.float32), by_head[:, :, :2].reshape(m, 4, d))
    np.testing.assert_array_equal(np.asarray(k, np.float32), by_head[:, :, 2])
    np.testing.assert_array_equal(np.asarray(v, np.float32), by_head[:, :, 3])


def test_qkv_order_pairs_the_rope_halves():
    order = cpu.qkv_order(1, 1, 32)  # q, k, v of one kv head, D 32
    np.testing.assert_array_equal(order[:16], [*range(8), *range(16, 24)])
    np.testing.assert_array_equal(order[16:32], [*range(8, 16), *range(24, 32)])
    np.testing.assert_array_equal(order[64:], range(64, 96))  # v in order
    assert sorted(order) == list(range(96))


def test_gelu_keeps_relative_precision_on_its_negative_side(isa):
    """GELU's small negative values (x down to -9) to ~1e-5 relative before the bf16 rounding:
    x times one, x = 0.01 .. 9 either sign, checked against float64 at the bf16 bound."""
    values = np.concatenate([-np.geomspace(0.01, 9, 160), np.geomspace(0.01, 9, 160)])
    x = jnp.asarray(
        np.concatenate([values, np.zeros((320 - values.size) % 16)])[:, None], jnp.bfloat16
    )  # [M, 2]: K = 2, the second column zero
    x = jnp.concatenate([x, jnp.zeros_like(x)], axis=1)
    w = np.zeros((1, 2, 16), np.float32)
    w[0, 0] = 1.0
    out = cpu.activated_cpu(
        x,
        jnp.asarray(cpu.pack_dense(w.astype(jnp.bfloat16))),
        0,
        jnp.zeros(16, jnp.float32),
        "gelu",
    )
    xs = np.asarray(x[:, 0], np.float64)
    truth = activation_truth("gelu", xs)
    got = np.asarray(out[:, 0], np.float64)
    np.testing.assert_allclose(got, truth, rtol=2**-8, atol=1e-35)


# counts of real rows: none, inside the first register tile, a tile's edge, inside a later
# tile, all of them, and past them (clamped)
COUNTS = [0, 1, 5, 23, 40, 45]


@pytest.mark.parametrize("count", COUNTS)
def test_rows_past_the_count_are_zeros_and_the_rest_unchanged(isa, count):
    """A batch's padding (rows past `rows`, a traced operand) is not multiplied: plain and gated
    products and every fused form answer zeros there, and every real row bitwise as the whole
    product has it."""
    rng = np.random.default_rng(count)
    m, k, n = 40, 96, 64
    x, w, gate, up = bf16(rng, m, k), bf16(rng, 1, k, n), bf16(rng, 1, k, n), bf16(rng, 1, k, n)
    bias = jnp.full(n, 1e3, jnp.float32)  # above any product here: no relu is zero
    plain = jax.jit(lambda x, w, rows: cpu.dense_cpu(x, w, 0, rows))
    gated = jax.jit(lambda x, w, rows: cpu.gated_cpu(x, w, 0, rows))
    activated = jax.jit(lambda x, w, rows: cpu.activated_cpu(x, w, 0, bias, "relu", rows))
    residual = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    added = jax.jit(lambda x, w, rows: cpu.dense_add_cpu(x, w, 0, residual, bias, rows))
    qkv = jax.jit(lambda x, w, rows: jnp.concatenate(cpu.qkv_cpu(x, w, 0, bias, 2, 1, rows), 1))
    rotated = jax.jit(
        lambda x, w, rows: jnp.concatenate(cpu.qkv_cpu(x, w, 0, bias, 2, 1, rows, tables), 1)
    )
    tables = rope_tables(rng, m, 16)
    real = min(count, m)
    for run, weights in (
        (plain, cpu.pack_dense(w)),
        (gated, cpu.pack_gated(gate, up)),
        (activated, cpu.pack_dense(w)),
        (added, cpu.pack_dense(w)),
        (qkv, cpu.pack_qkv(w, 2, 1)),
        (rotated, cpu.pack_qkv(w, 2, 1)),
    ):
        weights = jnp.asarray(weights)
        whole, out = (np.asarray(run(x, weights, rows), np.float32) for rows in (m, count))
        np.testing.assert_array_equal(out[:real], whole[:real])
        assert not out[real:].any() and whole[real:].all()


def test_f32_inputs_are_rounded_to_bf16_first():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((40, 64)), jnp.float32)
    w = bf16(rng, 64, 32)
    out = native(x, jnp.asarray(cpu.pack_dense(w[None])), 0)
    np.testing.assert_allclose(out, exact(x.astype(jnp.bfloat16), w), atol=1e-4)


def test_the_layer_index_picks_the_matrix():
    rng = np.random.default_rng(4)
    x, stack = bf16(rng, 33, 64), bf16(rng, 3, 64, 48)
    packed = jnp.asarray(cpu.pack_dense(stack))
    assert packed.shape == (3, 3, 32, 32)
    for layer in range(3):
        np.testing.assert_allclose(native(x, packed, layer), exact(x, stack[layer]), atol=1e-4)


def test_thread_count_does_not_change_results(isa):
    rng = np.random.default_rng(5)
    x, w = bf16(rng, 300, 128), jnp.asarray(cpu.pack_dense(bf16(rng, 1, 128, 96)))
    every = np.asarray(native(x, w, 0))  # computed now, on every thread (dispatch is async)
    try:
        cpu.set_threads(1)
        one = np.asarray(jax.jit(lambda x, w: cpu.dense_cpu(x, w, 0) + 0)(x, w))
    finally:
        cpu.set_threads(0)
    np.testing.assert_array_equal(every, one)


def test_a_row_does_not_depend_on_its_batch(isa):
    # one thread: 1000 rows are several row blocks, each copied in its own work item (AVX2);
    # a few rows split the columns and are copied whole first
    rng = np.random.default_rng(9)
    x, w = bf16(rng, 1000, 576), jnp.asarray(cpu.pack_dense(bf16(rng, 1, 576, 96)))
    try:
        cpu.set_threads(1)
        whole = np.asarray(jax.jit(lambda x, w: cpu.dense_cpu(x, w, 0) + 0)(x, w))
    finally:
        cpu.set_threads(0)
    for start, stop in ((0, 1), (3, 10), (111, 118), (990, 1000)):
        np.testing.assert_array_equal(whole[start:stop], native(x[start:stop], w, 0))


def test_outputs_past_the_stream_size_are_the_same(isa):
    # 8192 x 512 f32 is 16 MiB: the kernel writes it with streaming stores; each half is
    # written as usual
    rng = np.random.default_rng(8)
    x, w = bf16(rng, 8192, 32), bf16(rng, 1, 32, 512)
    assert 8192 * 512 * 4 >= cpu.STREAM_BYTES > 4096 * 512 * 4
    packed = jnp.asarray(cpu.pack_dense(w))
    whole = np.asarray(native(x, packed, 0))
    halves = [np.asarray(native(x[:4096], packed, 0)), np.asarray(native(x[4096:], packed, 0))]
    np.testing.assert_array_equal(whole, np.concatenate(halves))
    np.testing.assert_allclose(whole, exact(x, w[0]), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_layers_are_refused():
    rng = np.random.default_rng(6)
    x, w = bf16(rng, 8, 64), jnp.asarray(cpu.pack_dense(bf16(rng, 2, 64, 32)))
    with pytest.raises(ValueError, match="do not take x"):
        cpu.dense_cpu(bf16(rng, 8, 66), w, 0)
    with pytest.raises(Exception, match="layer 2 outside the stack of 2"):
        native(x, w, 2).block_until_ready()
    with pytest.raises(ValueError, match="do not take x"):
        cpu.gated_cpu(x, w[:, :1], 0)
    with pytest.raises(ValueError, match="bias of shape"):
        cpu.activated_cpu(x, w, 0, jnp.zeros(16), "gelu")
    with pytest.raises(KeyError):
        cpu.activated_cpu(x, w, 0, jnp.zeros(32), "tanh")
    with pytest.raises(ValueError, match="residual"):
        cpu.dense_add_cpu(x, w, 0, jnp.zeros((8, 16)))
    with pytest.raises(ValueError, match="bias"):
        cpu.dense_add_cpu(x, w, 0, jnp.zeros((8, 32)), jnp.zeros(16))
    with pytest.raises(ValueError, match="do not split weights"):
        cpu.qkv_cpu(x, w, 0, jnp.zeros(32), 2, 2)  # heads of 8 columns
    with pytest.raises(ValueError, match="do not split weights"):
        cpu.qkv_cpu(x, w, 0, jnp.zeros(32), 3, 2)  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="RoPE tables"):
        w48 = jnp.asarray(cpu.pack_dense(bf16(rng, 1, 64, 48)))  # q, k, v of D 16
        cpu.qkv_cpu(x, w48, 0, jnp.zeros(48), 1, 1, rope=(jnp.zeros((8, 4)),) * 2)
    assert cpu.dense_supports(576, 1536)
    assert not cpu.dense_supports(575, 1536) and not cpu.dense_supports(576, 1530)
    with pytest.raises(ValueError, match="isa must be one of"):
        cpu.set_dense_isa("sse2")
    assert cpu.dense_isa() == ISAS[-1]  # the widest, by default


def test_select_dense():
    assert select_dense(None, "cpu", dtype=jnp.bfloat16).name == "measured"
    assert select_dense(None, "gpu", dtype=jnp.bfloat16).name == "xla"
    assert select_dense("xla", "cpu", dtype=jnp.bfloat16).name == "xla"
    assert select_dense("cpu", "cpu", dtype=jnp.bfloat16).name == "cpu"
    with pytest.raises(ValueError, match="unknown dense 'fast'"):
        select_dense("fast", "cpu", dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 or float32 weights"):
        select_dense("cpu", "cpu", dtype=jnp.float16)


def test_a_packed_model_packs_every_matrix(tiny_checkpoints):
    # its scores against the f32 model: tests/test_dense_choice.py
    packed = load_model(tiny_checkpoints["qwen3"], dtype="bfloat16", dense="cpu", progress=False)
    assert packed.program.dense.name == "cpu" and packed.program.dense_choice is None
    matrices = packed.program.params["matrices"]
    assert all(isinstance(matrices[n], Packed) for n in ("qkv", "o", "gate_up", "down"))
    assert isinstance(packed.program.params["head"], Packed)
