"""The native CPU attention kernel against the dense oracle, in every instruction-set build."""

from concurrent.futures import ThreadPoolExecutor

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from score_kernels import (
    ATTENTION,
    attention_reference,
    attention_xla,
    cpu,
    make_meta,
    select_attention,
)
from tests.test_attention import (
    HIDDEN_TAILS,
    SCENARIOS,
    TOLERANCE,
    hidden_tail_meta,
    layout_meta,
    layout_spans,
    random_qkv,
    scenario_meta,
)

pytestmark = [
    pytest.mark.skipif(not cpu.AVAILABLE, reason="native CPU attention not built"),
    pytest.mark.usefixtures("on_the_cpu"),
]

ISAS = cpu.available_isas() if cpu.AVAILABLE else ()


@pytest.fixture(params=ISAS)
def isa(request):
    cpu.set_isa(request.param)
    yield request.param
    cpu.set_isa(None)


@jax.jit
def run_cpu(q, k, v, meta):
    return cpu.attention_cpu(q, k, v, meta, scale=q.shape[-1] ** -0.5)


@jax.jit
def run_reference(q, k, v, meta):
    return attention_reference(q, k, v, meta, scale=q.shape[-1] ** -0.5)


def assert_matches_reference(q, k, v, meta) -> np.ndarray:
    got = run_cpu(q, k, v, meta)
    assert got.shape == q.shape
    assert got.dtype == q.dtype
    want = run_reference(q, k, v, meta)
    tol = TOLERANCE[q.dtype.type]
    got = np.asarray(got, np.float32)
    np.testing.assert_allclose(got, np.asarray(want, np.float32), atol=tol, rtol=tol)
    return got


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_reference(isa: str, scenario: str, dtype) -> None:
    meta, shape = scenario_meta(scenario)
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, dtype)
    assert_matches_reference(q, k, v, meta)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim",
    [(14, 2, 64), (16, 8, 128), (4, 4, 64), (32, 1, 128), (12, 12, 32), (6, 2, 32), (10, 2, 64)],
    ids=["gqa7", "qwen3", "mha", "mqa32", "minilm", "gqa3-d32", "gqa5"],
)
def test_head_layouts_and_ragged_token_count(
    isa: str, heads: int, kv_heads: int, head_dim: int
) -> None:
    # Every build: their vector widths split head dims 32, 64 and 128 into different passes,
    # their key tiles are 64 or 128 keys, and AMX takes rows 16 at a time (gqa5's query tile
    # is 12 tokens of 5 heads: 60 rows, a multiple of 4 but not of 16). 220 tokens: a multiple
    # of neither key tile nor of the query tile (64 // group tokens); a 140-token prefix
    # crosses both tiles' edges, and items cross every tile grid.
    meta = layout_meta([(140, [9, 30, 1, 17]), (0, [23])], 1)
    assert meta.prefix_start.shape[0] == 220
    for dtype in (jnp.float32, jnp.bfloat16):
        q, k, v = random_qkv(220, heads, kv_heads, head_dim, dtype, seed=heads)
        assert_matches_reference(q, k, v, meta)


def scoring_qk(scores: np.ndarray, head_dim: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """q [T, 6, D] and k [T, 2, D] such that every query scores key j at scores[j] (q . k
    times D^-0.5): all of them along one random direction."""
    direction = rng.standard_normal(head_dim)
    direction *= head_dim**0.25 / np.linalg.norm(direction)
    q = np.broadcast_to(direction, (len(scores), 6, head_dim))
    k = np.broadcast_to(scores[:, None, None] * direction, (len(scores), 2, head_dim))
    return q, k


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("span", [1000, 400, 160], ids=["creeping", "steady", "leaping"])
def test_a_rising_max_matches_reference(isa: str, span: int, head_dim: int, dtype) -> None:
    # Scores rise evenly from -15 to 15 over the first `span` keys, then stay at 15, over a
    # 600-token prefix and its 20 items: per 128-key tile by 5.5, 14 and 35 log2 units (per
    # 64-key tile half that), so a row's running max passes its old value by less than the
    # kernel's slack (8) on some tiles and by more on others. The scores stay small enough for
    # f32 rounding of them to stay inside the bound.
    meta = layout_meta([(600, [5] * 20)], 1)
    t = meta.prefix_start.shape[0]
    rng = np.random.default_rng(head_dim)
    q, k = scoring_qk(np.minimum(np.arange(t) / span, 1.0) * 30.0 - 15.0, head_dim, rng)
    v = rng.standard_normal((t, 2, head_dim))
    assert_matches_reference(*(jnp.asarray(x, dtype) for x in (q, k, v)), meta)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_scores_far_past_an_earlier_max_stay_finite(isa: str, dtype) -> None:
    # Scores rise from -200 to 200 over the keys: probabilities taken against an earlier tile's
    # max would overflow f32 (2^577). Every value row is the same, so every output row is it.
    meta = layout_meta([(600, [5] * 20)], 1)
    t = meta.prefix_start.shape[0]
    rng = np.random.default_rng(3)
    q, k = scoring_qk(400.0 * np.arange(t) / t - 200.0, 64, rng)
    v = np.broadcast_to(rng.standard_normal(64), (t, 2, 64))
    out = np.asarray(run_cpu(*(jnp.asarray(x, dtype) for x in (q, k, v)), meta), np.float32)
    want = np.asarray(jnp.asarray(v[:, :1], dtype), np.float32)  # every head reads the same row
    tol = TOLERANCE[jnp.dtype(dtype).type]
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), atol=tol, rtol=tol)


def test_long_prefix_bf16_matches_f32_kernel() -> None:
    # A 700-token prefix shared by 40 items: the online softmax runs over 12 key tiles.
    meta = layout_meta([(700, [8] * 40)], 64)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 9, 3, 64, jnp.float32, seed=5)
    f32 = assert_matches_reference(q, k, v, meta)
    bf16 = np.asarray(run_cpu(*(x.astype(jnp.bfloat16) for x in (q, k, v)), meta), np.float32)
    np.testing.assert_allclose(bf16, f32, atol=3e-2)


def test_padding_rows_attend_only_to_themselves() -> None:
    meta = layout_meta([(10, [3, 4])], 16, extra_pad=40)
    t = meta.prefix_start.shape[0]
    q, k, v = random_qkv(t, 6, 2, 64, jnp.float32, seed=2)
    out = np.asarray(run_cpu(q, k, v, meta))
    padding = np.arange(17, t)
    expected = np.repeat(np.asarray(v)[padding], 3, axis=1)  # query head h reads kv head h // 3
    np.testing.assert_allclose(out[padding], expected, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.integers(0, 90), st.lists(st.integers(1, 40), min_size=0, max_size=5)),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_random_packings(groups, seed: int) -> None:
    # Fixed T keeps one compiled shape; groups that do not fit are dropped.
    t, kept, used = 256, [], 0
    for prefix_len, items in groups:
        size = prefix_len + sum(items)
        if 0 < size < t - used:  # leaves room for the one padding token below
            kept.append((prefix_len, items))
            used += size
    spans = layout_spans(kept or [(0, [1])], t, extra_pad=1)
    meta = make_meta(*spans, block_size=64, width_buckets=(t // 64,))
    q, k, v = random_qkv(t, 6, 2, 64, jnp.float32, seed=seed)
    assert_matches_reference(q, k, v, meta)


# The build stays set for every example: the fixture is per test, as hypothesis warns of.
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=12),
    layout=st.sampled_from([(12, 12, 32), (6, 2, 64), (8, 1, 128)]),
    seed=st.integers(0, 2**16),
)
def test_random_encoder_packings(isa: str, lengths, layout, seed: int) -> None:
    # Texts that see all of themselves, packed back to back: blocks of 4 query rows straddle
    # texts and tiles, and each computes only the key vectors its rows see.
    t, kept = 256, []
    for n in lengths:
        if sum(kept) + n < t:  # leaves room for one padding token
            kept.append(n)
    meta = layout_meta([(0, kept)], t, extra_pad=1, bidirectional=True)
    q, k, v = random_qkv(t, *layout, jnp.float32, seed=seed)
    assert_matches_reference(q, k, v, meta)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_hidden_tails_match_reference(isa: str, dtype) -> None:
    # a ColBERT query's expansion: tokens whose own span ends before them
    meta = hidden_tail_meta(*HIDDEN_TAILS, 16)
    assert_matches_reference(*random_qkv(meta.own_start.shape[0], 6, 2, 64, dtype, seed=8), meta)


def test_concurrent_calls_match_their_own_results() -> None:
    # The kernel keeps its K/V tile buffers for reuse: concurrent calls of different sizes
    # each get their own.
    problems = []
    for i, groups in enumerate([[(0, [30, 200, 9])], [(70, [5] * 30)], [(0, [17] * 3)]]):
        meta = layout_meta(groups, 64, bidirectional=i != 1)
        qkv = random_qkv(meta.prefix_start.shape[0], 12, 12, 32, jnp.float32, seed=i)
        problems.append((qkv, meta, np.asarray(run_cpu(*qkv, meta))))

    def unchanged(qkv, meta, want) -> bool:
        return all(np.array_equal(np.asarray(run_cpu(*qkv, meta)), want) for _ in range(5))

    with ThreadPoolExecutor(len(problems) * 2) as pool:
        runs = [pool.submit(unchanged, *problem) for problem in problems * 2]
        assert [run.result() for run in runs] == [True] * len(runs)


def test_threads_do_not_change_results() -> None:
    meta = layout_meta([(40, [7] * 20), (0, [50])], 64)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 9, 3, 64, jnp.bfloat16, seed=4)
    many = np.asarray(run_cpu(q, k, v, meta), np.float32)
    cpu.set_threads(1)
    try:
        one = np.asarray(run_cpu(q, k, v, meta), np.float32)
    finally:
        cpu.set_threads(0)
    np.testing.assert_array_equal(one, many)


def test_isa_knobs() -> None:
    assert "portable" in ISAS
    cpu.set_isa("portable")
    try:
        assert cpu.isa() == "portable"
    finally:
        cpu.set_isa(None)
    assert cpu.isa() == ISAS[-1]
    with pytest.raises(ValueError, match="isa must be one of"):
        cpu.set_isa("sse9")
    with pytest.raises(ValueError, match="threads must be >= 0"):
        cpu.set_threads(-1)


def test_unsupported_inputs_are_refused() -> None:
    meta = layout_meta([(0, [64])], 64)
    q, k, v = random_qkv(64, 2, 1, 48, jnp.float32)
    with pytest.raises(ValueError, match="head_dim in \\(32, 64, 128\\)"):
        cpu.attention_cpu(q, k, v, meta, scale=1.0)
    assert not cpu.supports(48, jnp.float32)
    assert cpu.supports(32, jnp.float32)
    assert not cpu.supports(64, jnp.float16)
    assert cpu.supports(128, jnp.bfloat16)
    q, k, v = random_qkv(64, 2, 1, 64, jnp.float32)
    with pytest.raises(ValueError, match="no score soft-capping"):
        cpu.attention_cpu(q, k, v, meta, scale=1.0, softcap=5.0)


def test_selected_by_default_on_cpu_when_supported() -> None:
    assert ATTENTION["cpu"] is cpu.attention_cpu
    assert select_attention(None, "cpu", head_dim=64, dtype=jnp.bfloat16) is cpu.attention_cpu
    assert select_attention(None, "cpu", head_dim=80, dtype=jnp.bfloat16) is attention_xla
    assert select_attention(None, "gpu", head_dim=64, dtype=jnp.bfloat16) is ATTENTION["pallas"]
    assert select_attention("xla", "cpu", head_dim=64, dtype=jnp.float32) is attention_xla
    # soft-capped scores (Gemma 2) take the XLA kernel; naming the native one is refused
    capped = dict(head_dim=64, dtype=jnp.bfloat16, softcap=50.0)
    assert select_attention(None, "cpu", **capped) is attention_xla
    with pytest.raises(ValueError, match="no score soft-capping"):
        select_attention("cpu", "cpu", **capped)
