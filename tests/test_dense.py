"""Dense strategies (score_kernels/dense.py): what each prepares and how it multiplies.

The CPU strategy's wiring (packing layouts, the layer index, the gated pair, the q/k/v split and
RoPE, the transposed head, per-matrix fallback) is checked on any machine by standing an exact
emulation of the native kernels in for them: the packed weights are unpacked and multiplied as
XLA would.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import engine.device.program
from engine import load_model
from score_kernels import cpu, dense
from score_kernels.rope import rotate


def unpack(data: jnp.ndarray) -> jnp.ndarray:
    """bf16[L, N/16, K/2, 32] from `cpu.pack_dense` back to [L, K, N]."""
    lead, groups, pairs, _ = data.shape
    w = data.reshape(lead, groups, pairs, 16, 2).transpose(0, 2, 4, 1, 3)
    return w.reshape(lead, pairs * 2, groups * 16)


def emulated_dense(x, data, layer, rows=None):
    w = unpack(data)[layer]
    return padding_zeroed(
        jnp.matmul(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32), rows
    )


def padding_zeroed(out, rows):
    """out with its rows past `rows` zero, as the native kernels answer them."""
    return out if rows is None else jnp.where(jnp.arange(out.shape[0])[:, None] < rows, out, 0)


def emulated_gated(x, data, layer, rows=None, activation="silu"):
    assert activation == "silu"  # the models these tests load
    w = unpack(data)[layer]  # [K, 2I]: 16-column groups of gate and up interleaved
    k, both = w.shape
    w = w.reshape(k, both // 32, 2, 16)
    gate, up = w[:, :, 0].reshape(k, -1), w[:, :, 1].reshape(k, -1)
    xb = x.astype(jnp.bfloat16)
    g = jnp.matmul(xb, gate, preferred_element_type=jnp.float32)
    u = jnp.matmul(xb, up, preferred_element_type=jnp.float32)
    return padding_zeroed((jax_silu(g) * u).astype(jnp.bfloat16), rows)


def emulated_add(x, data, layer, residual, bias=None, rows=None):
    out = residual + emulated_dense(x, data, layer)
    return padding_zeroed(out if bias is None else out + bias, rows)


def emulated_qkv(x, data, layer, bias, heads, kv_heads, rows=None, rope=None):
    w = unpack(data)[layer]  # [K, N]: q and k columns in `qkv_order`
    order = cpu.qkv_order(heads, kv_heads, w.shape[1] // (heads + 2 * kv_heads))
    w = w[:, np.argsort(order)]  # columns by kv head again
    y = jnp.matmul(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32) + bias
    q, k, v = dense.split_qkv(padding_zeroed(y, rows), heads, kv_heads)
    if rope is not None:
        q, k = rotate(q, *rope), rotate(k, *rope)
    return tuple(t.astype(jnp.bfloat16) for t in (q, k, v))


def jax_silu(x):
    return x * (1 / (1 + jnp.exp(-x)))


@pytest.fixture
def emulated_kernel(monkeypatch):
    supports = lambda k, n, dtype=jnp.bfloat16: dtype == jnp.bfloat16 and k % 2 == 0 and n % 16 == 0
    monkeypatch.setattr(cpu, "dense_supports", supports)
    monkeypatch.setattr(cpu, "dense_cpu", emulated_dense)
    monkeypatch.setattr(cpu, "gated_cpu", emulated_gated)
    monkeypatch.setattr(cpu, "qkv_cpu", emulated_qkv)
    monkeypatch.setattr(cpu, "dense_add_cpu", emulated_add)


def test_unpack_inverts_the_packing():
    w = np.random.default_rng(0).standard_normal((3, 64, 48)).astype(np.float32)
    back = np.asarray(unpack(jnp.asarray(cpu.pack_dense(w))), np.float32)
    np.testing.assert_array_equal(back, np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32))


def test_cpu_strategy_multiplies_like_xla(emulated_kernel):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 64, 48)).astype(np.float32)
    gate, up = (rng.standard_normal((3, 64, 32)).astype(np.float32) for _ in range(2))
    head = rng.standard_normal((80, 64)).astype(np.float32)  # [V, E]
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    bf16 = jnp.bfloat16
    packed = dense.CPU.prepare(w, bf16), dense.CPU.prepare_gated(gate, up, bf16)
    assert all(isinstance(p, dense.Packed) for p in packed)
    for layer in range(3):
        i = jnp.int32(layer)
        want = dense.XLA.matmul(x, dense.XLA.prepare(w, bf16), i)
        np.testing.assert_array_equal(dense.CPU.matmul(x, packed[0], i), want)
        want = dense.XLA.gated(x, dense.XLA.prepare_gated(gate, up, bf16), i).astype(bf16)
        np.testing.assert_array_equal(dense.CPU.gated(x, packed[1], i), want)
    want = dense.XLA.head(x, dense.XLA.prepare_head(head, bf16))
    np.testing.assert_allclose(
        dense.CPU.head(x, dense.CPU.prepare_head(head, bf16)), want, rtol=1e-6, atol=1e-6
    )


def test_cpu_strategy_keeps_what_the_kernel_cannot_take_in_xla_form(emulated_kernel):
    odd = np.ones((2, 63, 48), np.float32)  # odd K
    narrow = np.ones((2, 64, 40), np.float32)  # N not a multiple of 16
    for w in (odd, narrow):
        assert not isinstance(dense.CPU.prepare(w, jnp.bfloat16), dense.Packed)
    assert not isinstance(dense.CPU.prepare(narrow[0].T.copy(), jnp.float32), dense.Packed)
    assert not isinstance(dense.CPU.prepare_head(np.ones((40, 64)), jnp.bfloat16), dense.Packed)


@pytest.mark.parametrize("family", ["llama-tied", "qwen2", "qwen3"])
def test_a_model_on_the_cpu_strategy_scores_like_xla(
    tiny_checkpoints, family, emulated_kernel, monkeypatch
):
    plain = load_model(tiny_checkpoints[family], dtype="bfloat16", dense="xla", progress=False)
    monkeypatch.setattr(engine.device.program, "select_dense", lambda *a, **k: dense.CPU)
    packed = load_model(tiny_checkpoints[family], dtype="bfloat16", progress=False)
    matrices = packed.program.params["matrices"]
    assert all(isinstance(matrices[n], dense.Packed) for n in ("o", "gate_up", "down"))
    fused = family != "qwen3"  # Qwen3's q/k norms come between the product and RoPE
    assert isinstance(matrices["qkv"], dense.PackedQkv if fused else dense.Packed)
    assert isinstance(packed.program.params["head"], dense.Packed)  # vocab 384 = 24 * 16
    rng = np.random.default_rng(7)
    query = [int(t) for t in rng.integers(0, 384, 30)]
    items = [[int(t) for t in rng.integers(0, 384, n)] for n in (1, 9, 40, 70)]
    np.testing.assert_allclose(
        packed.score(query, items, [1, 2, 3]), plain.score(query, items, [1, 2, 3]), rtol=1e-5
    )


@pytest.mark.skipif(not cpu.DENSE_AVAILABLE, reason="needs the native dense kernels (AVX2)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_batch_padding_moves_no_output(tiny_checkpoints, dtype):
    """The forward hands the native kernels its real token count: the padding after them is
    not multiplied, and the outputs equal those of the batch computed whole, bitwise (a row's
    products do not depend on its batch)."""
    from engine.host import packing, planning
    from engine.host.buckets import make_buckets

    model = load_model(tiny_checkpoints["qwen2"], dtype=dtype, dense="cpu", progress=False)
    assert isinstance(model.program.params["matrices"]["gate_up"], dense.Packed)
    seqs = [[5] * 30 + [i + 3] * (i + 1) for i in range(6)]
    buckets = make_buckets(512, token_budget=256)
    (chunks,) = planning.plan(seqs, token_budget=256, buckets=buckets)
    inputs = packing.pack(seqs, [[1, 2]] * len(seqs), chunks, buckets).inputs
    tokens = len(inputs.tokens)
    assert int(inputs.token_count) == 30 + sum(range(1, 7)) < tokens
    skipped = np.asarray(model.program.run(inputs))
    whole = np.asarray(model.program.run(inputs._replace(token_count=np.array(tokens, np.int32))))
    np.testing.assert_array_equal(skipped[: len(seqs)], whole[: len(seqs)])
    assert np.isfinite(skipped).all()
