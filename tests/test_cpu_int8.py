"""The native int8 dense kernel (every instruction-set build this CPU runs) against a float64
model of the same quantised arithmetic and XLA's twin, and the int8 compute mode's models."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import trio

from api.app import create_app
from api.settings import settings_from_env
from engine import EngineConfig, load_model, open_engine
from engine.device.program import WITH_INT8
from engine.errors import InvalidInput
from score_kernels import activations, cpu, dense, quant, select_dense
from score_kernels.dense import ROLES, Int8, Int8Packed, Int8PackedQkv
from tests.test_api_support import serving, tiny_env
from tests.test_cpu_dense import activation_truth
from tests.test_quant import f32_quantize_rows, f64_int8_matmul

pytestmark = [
    pytest.mark.skipif(not cpu.INT8_AVAILABLE, reason="needs the native int8 kernel"),
    pytest.mark.usefixtures("on_the_cpu"),
]

ISAS = cpu.int8_isas() if cpu.INT8_AVAILABLE else ()


@pytest.fixture(params=ISAS)
def isa(request):
    cpu.set_int8_isa(request.param)
    yield request.param
    cpu.set_int8_isa(None)


@jax.jit
def native(x, w, scale, layer):
    return cpu.dense_int8(x, w, scale, layer)


def operands(rng, m, k, n, layers=1):
    x = jnp.asarray(rng.standard_normal((m, k)) * 2, jnp.bfloat16)
    q, scale = quant.quantize_columns(rng.standard_normal((layers, k, n)))
    return x, q, scale


# rows cover every register-tile height of both widths (1..4 at 512 bits, 1..2 at 256) and
# several tiles and row blocks; columns every panel width (1..3 groups of 16 at 512 bits) and
# several panels; K from one quad, through K that ends inside a vector (100, 132) and inside an
# activation block (576), to a model's intermediate size
SHAPES = [
    (1, 4, 16),
    (2, 64, 32),
    (3, 100, 48),
    (4, 128, 64),
    (5, 132, 80),
    (6, 256, 96),
    (7, 8, 16),
    (8, 64, 48),
    (9, 256, 96),
    (23, 576, 192),
    (130, 576, 576),
    (1031, 1536, 576),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_equals_a_float64_model_and_xla(isa, m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, q, scale = operands(rng, m, k, n)
    out = native(x, jnp.asarray(cpu.pack_int8(q)), jnp.asarray(scale), 0)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    truth = f64_int8_matmul(np.asarray(x, np.float32), q[0], scale[0], quant.ACT_BLOCK)
    # int32 sums are exact: what is left is a few f32 roundings of each block's weighted sum
    atol = 1e-6 * np.abs(truth).max()
    np.testing.assert_allclose(out, truth, rtol=0, atol=atol)
    twin = jax.jit(quant.int8_matmul)(x, jnp.asarray(q[0]), jnp.asarray(scale[0]))
    np.testing.assert_allclose(out, twin, rtol=0, atol=atol)


@pytest.mark.parametrize("block", [32, 64, 96, 256])
def test_other_block_widths_equal_the_float64_model(isa, block):
    """Blocks of any multiple of 4: the AMX build multiplies multiples of its 64-value tile step
    on the tiles, the others through the VNNI tiles."""
    rng = np.random.default_rng(block)
    x, q, scale = operands(rng, 37, 576, 64)
    run = jax.jit(lambda x, w, s: cpu.dense_int8(x, w, s, 0, block=block))
    out = run(x, jnp.asarray(cpu.pack_int8(q)), jnp.asarray(scale))
    truth = f64_int8_matmul(np.asarray(x, np.float32), q[0], scale[0], block)
    np.testing.assert_allclose(out, truth, rtol=0, atol=1e-6 * np.abs(truth).max())


@pytest.mark.parametrize(("m", "k", "i"), [(1, 4, 16), (4, 64, 48), (7, 100, 16), (300, 576, 1536)])
def test_gated_equals_the_activation_of_gate_times_up(isa, m, k, i):
    """bf16(act(x @ gate) * (x @ up)) in int8 for every activation (SwiGLU, GeGLU, ...)."""
    rng = np.random.default_rng(m + k + i)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    (qg, sg), (qu, su) = (quant.quantize_columns(rng.standard_normal((2, k, i))) for _ in "gu")
    scale = cpu.interleave_int8_scales(sg, su)
    packed = jnp.asarray(cpu.pack_int8_gated(qg, qu))
    xf = np.asarray(x, np.float32)
    g = f64_int8_matmul(xf, qg[1], sg[1], quant.ACT_BLOCK)
    u = f64_int8_matmul(xf, qu[1], su[1], quant.ACT_BLOCK)
    run = jax.jit(cpu.gated_int8, static_argnames=("block", "activation"))
    for activation in activations.CODES:
        out = run(x, packed, scale, 1, activation=activation)
        assert out.shape == (m, i) and out.dtype == jnp.bfloat16
        truth = activation_truth(activation, g) * u
        # one bf16 rounding of an f32 result
        atol = 1e-5 * np.abs(truth).max()
        np.testing.assert_allclose(np.asarray(out, np.float64), truth, rtol=2**-8, atol=atol)


def test_activated_equals_the_activation_of_the_product_plus_bias(isa):
    """bf16(act(x @ W + bias)): the f64 model's product, its bias and each activation, rounded to
    bf16 once (an encoder MLP's up projection in int8)."""
    rng = np.random.default_rng(3)
    m, k, n = 23, 576, 192
    x, q, scale = operands(rng, m, k, n, layers=2)
    bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
    sums = f64_int8_matmul(np.asarray(x, np.float32), q[1], scale[1], quant.ACT_BLOCK)
    sums = sums + np.asarray(bias, np.float64)
    run = jax.jit(cpu.activated_int8, static_argnames=("activation", "block"))
    packed = jnp.asarray(cpu.pack_int8(q))
    for activation in activations.CODES:
        out = run(x, packed, scale, 1, bias, activation=activation)
        assert out.shape == (m, n) and out.dtype == jnp.bfloat16
        truth = activation_truth(activation, sums)
        atol = 1e-5 * np.abs(truth).max()
        np.testing.assert_allclose(np.asarray(out, np.float64), truth, rtol=2**-8, atol=atol)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "rows"), [(9, 3, 64, 37), (4, 4, 32, 5), (2, 1, 128, 40)]
)
def test_qkv_equals_the_product_split_and_rotated(isa, heads, kv_heads, d, rows):
    """The fused q/k/v form is the plain product plus its bias, split into heads and rotated by
    RoPE, rounded to bf16 once: bitwise without RoPE, within a bf16 rounding of the rotation's
    f32 order with it. Rows past `rows` are zeros."""
    rng = np.random.default_rng(heads + d)
    m, k, n = 40, 576, (heads + 2 * kv_heads) * d
    w = rng.standard_normal((2, k, n)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
    angles = rng.uniform(0, 6, (m, d // 2)).astype(np.float32)
    fused = dense.INT8.prepare_qkv(w, jnp.bfloat16, heads, kv_heads)
    plain = dense.INT8.prepare(w, jnp.bfloat16)
    assert isinstance(fused, Int8PackedQkv) and isinstance(plain, Int8Packed)
    unfused = dense._then_split(dense._then_activate(dense.INT8.matmul))
    for rope in (None, (jnp.asarray(np.cos(angles)), jnp.asarray(np.sin(angles)))):
        run = jax.jit(
            lambda x, count, rope=rope: dense.INT8.qkv(
                x, fused, 1, bias, heads, kv_heads, count, rope
            )
        )
        got = run(x, jnp.int32(rows))
        want = unfused(x, plain, 1, bias, heads, kv_heads, None, rope)
        for part, truth in zip(got, want, strict=True):
            assert part.dtype == jnp.bfloat16 and part.shape == truth.shape
            part, truth = (
                np.asarray(part, np.float32),
                np.asarray(truth.astype(jnp.bfloat16), np.float32),
            )
            assert not part[rows:].any()
            if rope is None:
                np.testing.assert_array_equal(part[:rows], truth[:rows])
            else:
                np.testing.assert_allclose(part[:rows], truth[:rows], rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_residual_form_adds_the_product_as_xla_does(isa, with_bias):
    """residual + product (+ bias), added as the product is written, bitwise as XLA adds the
    plain product; rows past `rows` are zeros."""
    rng = np.random.default_rng(int(with_bias))
    m, k, n, rows = 45, 1536, 576, 41
    w = rng.standard_normal((2, k, n)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    residual = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(n), jnp.float32) if with_bias else None
    packed = dense.INT8.prepare_residual(w, jnp.bfloat16)
    run = jax.jit(lambda x, r, count: dense.INT8.residual(x, packed, 0, r, bias, count))
    got = np.asarray(run(x, residual, jnp.int32(rows)))
    want = residual + dense.INT8.matmul(x, packed, 0)
    want = np.asarray(want if bias is None else want + bias)
    np.testing.assert_array_equal(got[:rows], want[:rows])
    assert not got[rows:].any()


def test_the_fused_forms_refuse_what_does_not_fit():
    w = jnp.asarray(cpu.pack_int8(np.zeros((1, 64, 48), np.int8)))
    scale = jnp.ones((1, 48), jnp.float32)
    x = jnp.ones((4, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="residual"):
        cpu.dense_add_int8(x, w, scale, 0, jnp.zeros((4, 32), jnp.float32))
    with pytest.raises(ValueError, match="do not split weights"):
        cpu.qkv_int8(x, w, scale, 0, jnp.zeros(48, jnp.float32), 2, 2)


@pytest.mark.parametrize("count", [0, 1, 3, 23, 40, 45])
def test_rows_past_the_count_are_zeros_and_the_rest_unchanged(isa, count):
    """A batch's padding (rows past `rows`, a traced operand) is neither quantised nor
    multiplied: plain and gated products answer zeros there, and every real row bitwise as the
    whole product has it."""
    rng = np.random.default_rng(count)
    m, k, n = 40, 256, 32
    x, q, scale = operands(rng, m, k, n)
    (qg, sg), (qu, su) = (quant.quantize_columns(rng.standard_normal((1, k, n))) for _ in "gu")
    plain = jax.jit(lambda x, w, s, rows: cpu.dense_int8(x, w, s, 0, rows=rows))
    gated = jax.jit(lambda x, w, s, rows: cpu.gated_int8(x, w, s, 0, rows=rows))
    real = min(count, m)
    for run, w, s in (
        (plain, cpu.pack_int8(q), scale),
        (gated, cpu.pack_int8_gated(qg, qu), cpu.interleave_int8_scales(sg, su)),
    ):
        w = jnp.asarray(w)
        whole, out = (np.asarray(run(x, w, s, rows), np.float32) for rows in (m, count))
        np.testing.assert_array_equal(out[:real], whole[:real])
        assert not out[real:].any() and whole[real:].all()


def test_the_builds_agree_bit_for_bit():
    rng = np.random.default_rng(2)
    x, q, scale = operands(rng, 37, 576, 96)
    w, s = jnp.asarray(cpu.pack_int8(q)), jnp.asarray(scale)
    outs = {}
    try:
        for name in ISAS:
            cpu.set_int8_isa(name)
            outs[name] = np.asarray(
                jax.jit(lambda x, w, s: cpu.dense_int8(x, w, s, 0) + 0)(x, w, s)
            )
    finally:
        cpu.set_int8_isa(None)
    for out in outs.values():
        np.testing.assert_array_equal(out, outs[ISAS[-1]])


def test_extreme_activations_quantise_as_defined(isa):
    # a zero row, a row with one huge outlier, tiny values: q and scales as the definition says
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    x[0] = 0
    x[1, 7] = 3e4
    x[2] *= 1e-30
    q, scale = quant.quantize_columns(np.random.default_rng(4).standard_normal((1, 256, 32)))
    out = native(jnp.asarray(x, jnp.bfloat16), jnp.asarray(cpu.pack_int8(q)), scale, 0)
    truth = f64_int8_matmul(x, q[0], scale[0], quant.ACT_BLOCK)
    assert not np.asarray(out)[0].any()
    for row in range(1, 4):
        np.testing.assert_allclose(out[row], truth[row], atol=1e-6 * np.abs(truth[row]).max())
    assert f32_quantize_rows(x, quant.ACT_BLOCK)[1][1, 1] < 1  # the outlier's block alone


def test_the_layer_index_picks_the_matrix():
    rng = np.random.default_rng(5)
    x, q, scale = operands(rng, 33, 64, 48, layers=3)
    packed = jnp.asarray(cpu.pack_int8(q))
    assert packed.shape == (3, 3, 16, 64) and packed.dtype == jnp.uint8
    for layer in range(3):
        truth = f64_int8_matmul(np.asarray(x, np.float32), q[layer], scale[layer], 128)
        np.testing.assert_allclose(native(x, packed, scale, layer), truth, atol=1e-4)


def test_thread_count_does_not_change_results():
    rng = np.random.default_rng(6)
    x, q, scale = operands(rng, 300, 576, 96)
    w = jnp.asarray(cpu.pack_int8(q))
    every = np.asarray(native(x, w, scale, 0))  # computed now, on every thread (async dispatch)
    try:
        cpu.set_threads(1)
        one = np.asarray(jax.jit(lambda x, w, s: cpu.dense_int8(x, w, s, 0) + 0)(x, w, scale))
    finally:
        cpu.set_threads(0)
    np.testing.assert_array_equal(every, one)


def test_outputs_past_the_stream_size_are_the_same():
    # 8192 x 512 f32 is 16 MiB: written with streaming stores; each half as usual
    rng = np.random.default_rng(9)
    x, q, scale = operands(rng, 8192, 64, 512)
    assert 8192 * 512 * 4 >= cpu.STREAM_BYTES > 4096 * 512 * 4
    w = jnp.asarray(cpu.pack_int8(q))
    whole = np.asarray(native(x, w, scale, 0))
    halves = [np.asarray(native(x[:4096], w, scale, 0)), np.asarray(native(x[4096:], w, scale, 0))]
    np.testing.assert_array_equal(whole, np.concatenate(halves))
    truth = f64_int8_matmul(np.asarray(x, np.float32), q[0], scale[0], quant.ACT_BLOCK)
    np.testing.assert_allclose(whole, truth, rtol=0, atol=1e-6 * np.abs(truth).max())


def test_unsupported_shapes_and_layers_are_refused():
    rng = np.random.default_rng(7)
    x, q, scale = operands(rng, 8, 64, 32, layers=2)
    w = jnp.asarray(cpu.pack_int8(q))
    with pytest.raises(ValueError, match="do not take x"):
        cpu.dense_int8(jnp.ones((8, 66), jnp.bfloat16), w, scale, 0)
    with pytest.raises(Exception, match="layer 2 outside the stack of 2"):
        native(x, w, scale, 2).block_until_ready()
    with pytest.raises(Exception, match=r"scale has shape \[2, 16\]"):
        native(x, w, scale[:, :16], 0).block_until_ready()
    with pytest.raises(Exception, match="block 6 is not a positive multiple of 4"):
        jax.jit(lambda x: cpu.dense_int8(x, w, scale, 0, block=6))(x).block_until_ready()
    with pytest.raises(ValueError, match="do not take x"):
        cpu.gated_int8(x, w[:, :1], scale, 0)
    assert cpu.int8_supports(576, 1536)
    assert not cpu.int8_supports(574, 1536) and not cpu.int8_supports(576, 1530)
    with pytest.raises(ValueError, match="isa must be one of"):
        cpu.set_int8_isa("sse2")


def test_select_dense_in_the_int8_mode():
    assert select_dense(None, "cpu", dtype=jnp.bfloat16, int8=True).name == "measured"
    assert select_dense("int8", "cpu", dtype=jnp.bfloat16, int8=True).name == "int8"
    assert select_dense(None, "gpu", dtype=jnp.bfloat16, int8=True).name == "int8-xla"
    assert select_dense("int8-xla", "cpu", dtype=jnp.bfloat16, int8=True).name == "int8-xla"
    with pytest.raises(ValueError, match="dtype 'int8' computes with dense"):
        select_dense("cpu", "cpu", dtype=jnp.bfloat16, int8=True)
    with pytest.raises(ValueError, match="needs the CPU backend"):
        select_dense("int8", "gpu", dtype=jnp.bfloat16, int8=True)
    with pytest.raises(ValueError, match="use dtype 'int8'"):
        select_dense("int8", "cpu", dtype=jnp.bfloat16)
    with pytest.raises(InvalidInput, match="dense: dtype 'int8' computes"):
        load_model(None, dtype="int8", dense="xla", progress=False)


FAMILIES = ["llama-untied", "llama-tied", "qwen2", "qwen3", "gemma", "gemma2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_in_int8_scores_like_its_xla_twin(tiny_checkpoints, family):
    native_model = load_model(tiny_checkpoints[family], dtype="int8", dense="int8", progress=False)
    twin = load_model(tiny_checkpoints[family], dtype="int8", dense="int8-xla", progress=False)
    assert (native_model.program.dense.name, twin.program.dense.name) == ("int8", "int8-xla")
    matrices = native_model.program.params["matrices"]
    assert all(isinstance(m, Int8Packed | Int8PackedQkv) for m in matrices.values())
    assert all(isinstance(m, Int8) for m in twin.program.params["matrices"].values())
    rng = np.random.default_rng(7)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (1, 9, 40, 70)]
    got = native_model.score(query, items, [1, 2, 3])
    # the fused q/k/v projection rotates by RoPE in its own f32 order, so a q or k value's bf16
    # rounding may differ from XLA's (as in bf16 mode's fused projection)
    np.testing.assert_allclose(got, twin.score(query, items, [1, 2, 3]), rtol=1e-4)
    # and int8 is an approximation of the f32 model, not something else
    f32 = load_model(tiny_checkpoints[family], dtype="float32", progress=False)
    deviation = np.abs(np.log(got) - np.log(f32.score(query, items, [1, 2, 3]))).max()
    assert 0 < deviation < 0.5


def int8_matrices(model) -> set[str]:
    """The names of a model's layer matrices prepared in int8."""
    int8 = Int8 | Int8Packed | Int8PackedQkv
    return {n for n, m in model.program.params["matrices"].items() if isinstance(m, int8)}


def test_int8_with_every_layer_matrix_in_bf16_scores_as_bf16(tiny_checkpoints):
    path = tiny_checkpoints["qwen2"]  # with q/k/v biases
    kept = load_model(path, dtype="int8", int8_bf16=ROLES, progress=False)
    assert int8_matrices(kept) == set()
    rng = np.random.default_rng(9)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (2, 25, 50)]
    bf16 = load_model(path, dtype="bfloat16", progress=False).score(query, items, [1, 2, 3])
    # the layers multiplied as in bf16 mode; the head (bf16 in both modes) is each mode's own
    # measured choice, whose f32 sums may be added in another order
    np.testing.assert_allclose(kept.score(query, items, [1, 2, 3]), bf16, rtol=1e-5)


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_int8_keeps_the_named_matrices_in_bf16(tiny_checkpoints, rounding):
    path = tiny_checkpoints["llama-untied"]
    options = dict(dtype="int8", int8_rounding=rounding, progress=False)
    down = load_model(path, int8_bf16=["down"], **options)
    int8 = load_model(path, **options)
    assert int8_matrices(down) == {"qkv", "o", "gate_up"}
    assert int8_matrices(int8) == {"qkv", "o", "gate_up", "down"}
    rng = np.random.default_rng(10)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (3, 30, 60)]
    scores = {
        name: model.score(query, items, [1, 2, 3])
        for name, model in {
            "f32": load_model(path, dtype="float32", progress=False),
            "int8": int8,
            "down": down,
        }.items()
    }
    moved = {k: np.abs(np.log(scores[k]) - np.log(scores["f32"])).mean() for k in scores}
    assert scores["down"] != scores["int8"]
    assert 0 < moved["down"] < 0.5 and 0 < moved["int8"] < 0.5


def test_an_encoder_in_int8_with_every_layer_matrix_in_bf16_embeds_as_bf16(minilm):
    texts = ["a short text", "another text, a little longer than the first one", "x"]
    kept = load_model(minilm, dtype="int8", int8_bf16=ROLES, progress=False)
    assert int8_matrices(kept) == set()
    down = load_model(minilm, dtype="int8", int8_bf16=["down"], progress=False)
    assert int8_matrices(down) == {"qkv", "o", "up"}
    bf16 = load_model(minilm, dtype="bfloat16", progress=False).embed(texts)
    np.testing.assert_array_equal(kept.embed(texts), bf16)
    assert not np.array_equal(down.embed(texts), bf16)


def test_int8_bf16_names_matrices_of_the_int8_mode(tiny_checkpoints):
    path = tiny_checkpoints["llama-untied"]
    refusals = {
        "int8_bf16: ['gate'] are not among qkv, o, up, down": dict(int8_bf16=["gate"]),
        "int8_bf16: a list of matrix names": dict(int8_bf16="down"),
        f"int8_bf16: {WITH_INT8}": dict(int8_bf16=["down"], dense="int8"),
    }
    for message, options in refusals.items():
        with pytest.raises(InvalidInput, match=re.escape(message)):
            load_model(path, dtype="int8", progress=False, **options)
    with pytest.raises(InvalidInput, match="under dtype int8"):
        load_model(path, dtype="bfloat16", int8_bf16=["down"], progress=False)


def test_the_engine_in_int8_scores_like_the_offline_model(tiny_checkpoints):
    path = str(tiny_checkpoints["qwen3"])
    offline = load_model(path, dtype="int8", progress=False)
    rng = np.random.default_rng(8)
    query = [int(t) for t in rng.integers(0, 384, 40)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (3, 17, 60)]
    config = EngineConfig(
        model=path, dtype="int8", token_budget=512, compile_cache_dir=None, progress=False
    )

    async def twice():
        async with open_engine(config) as engine:
            assert engine.program.dense.name == "measured"  # as offline: one choice a process
            first = await engine.score(query, items, [1, 2])
            second = await engine.score(query, items, [1, 2])  # the query from the KV cache
            return first, second

    first, second = trio.run(twice)
    assert second.cached_tokens > 0
    want = offline.score(query, items, [1, 2])
    np.testing.assert_allclose(first.scores, want, rtol=1e-5)
    # K/V read from the bf16 pool round differently from the batch's (as in bf16 mode, where the
    # same request moves by 0.0075 here), and int8's rounding of activations magnifies that
    assert np.abs(np.log(second.scores) - np.log(want)).max() < 0.1


def test_the_service_in_int8(tiny_checkpoints):
    path = tiny_checkpoints["llama-untied"]
    body = {"query": [5, 6, 7, 8] * 5, "items": [[9, 10], [11] * 30], "label_token_ids": [1, 2]}
    want = load_model(path, dtype="int8", progress=False).score(
        body["query"], body["items"], body["label_token_ids"]
    )
    app = create_app(settings_from_env(tiny_env(path, SCORING_DTYPE="int8")))
    for client in serving(app, "asyncio"):
        assert client.get("/get_model_info").json()["dtype"] == "int8"
        r = client.post("/v1/score", json=body)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["scores"], want, rtol=1e-5)
        dense = client.get("/get_server_info").json()["dense"]  # what was measured, and chosen
        assert dense["mode"] == "int8" and dense["cores"] >= 1
        shapes = {(s["kind"], s["k"], s["n"]): s for s in dense["shapes"]}
        assert set(shapes) == {
            ("matmul", 64, 128),  # qkv: 4 query heads and 2 + 2 kv heads of 16
            ("matmul", 64, 64),  # o
            ("gated", 64, 128),
            ("matmul", 128, 64),  # down
            ("head", 64, 384),
        }
        for s in shapes.values():
            head = s["kind"] == "head"  # the int8 mode's head is bf16
            assert s["chosen"] in (("cpu", "onednn", "xla") if head else ("int8", "int8-xla"))
            assert all(t["gflops"] > 0 and t["eligible"] for t in s["candidates"].values())
        r = client.get("/get_server_info?roofline=1")
        assert r.status_code == 400 and "this is int8" in r.json()["error"]["message"]
