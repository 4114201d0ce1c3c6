"""Packed two-span attention: the XLA kernel against the dense oracle, the oracle against numpy."""

from collections.abc import Sequence
from functools import partial

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from score_kernels import (
    ATTENTION,
    AttentionMeta,
    attention_reference,
    attention_xla,
    local_spans,
    make_meta,
    select_attention,
    window_spans,
)

Layout = Sequence[tuple[int, Sequence[int]]]  # groups of (prefix_len, [item suffix lens])

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def layout_spans(
    groups: Layout, block_size: int, extra_pad: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefix_start, prefix_end, own_start), i32[T] each, for groups laid out back to back.

    Padding fills up to a multiple of `block_size` after `extra_pad` more tokens.
    """
    prefix_start, prefix_end, own_start, _ = _layout(groups, block_size, extra_pad)
    return prefix_start, prefix_end, own_start


def bidirectional_spans(
    lengths: Sequence[int], block_size: int, extra_pad: int = 0
) -> tuple[np.ndarray, ...]:
    """(prefix_start, prefix_end, own_start, own_end) i32[T] of encoder sequences back to back:
    each token sees its whole sequence; padding only itself."""
    return _layout([(0, lengths)], block_size, extra_pad)


def _layout(groups: Layout, block_size: int, extra_pad: int) -> tuple[np.ndarray, ...]:
    prefix_start, prefix_end, own_start, own_end = [], [], [], []  # own_end: bidirectional
    for prefix_len, items in groups:
        group_start = len(own_start)
        for _ in range(prefix_len):
            prefix_start.append(group_start)
            prefix_end.append(group_start)
            own_start.append(group_start)
            own_end.append(group_start + prefix_len)
        for item_len in items:
            item_start = len(own_start)
            for _ in range(item_len):
                prefix_start.append(group_start)
                prefix_end.append(group_start + prefix_len)
                own_start.append(item_start)
                own_end.append(item_start + item_len)
    used = len(own_start)
    total = -(-(used + extra_pad) // block_size) * block_size
    for t in range(used, total):
        prefix_start.append(t)
        prefix_end.append(t)
        own_start.append(t)
        own_end.append(t + 1)
    spans = (prefix_start, prefix_end, own_start, own_end)
    return tuple(np.asarray(a, dtype=np.int32) for a in spans)


def layout_meta(
    groups: Layout,
    block_size: int,
    extra_pad: int = 0,
    width_buckets: Sequence[int] = (),
    window: int = 0,
    bidirectional: bool = False,
) -> AttentionMeta:
    """Metadata of `groups`; `bidirectional`: encoder sequences (groups without prefixes),
    each token seeing its whole sequence."""
    *spans, own_end = _layout(groups, block_size, extra_pad)
    n = spans[0].shape[0] // block_size
    buckets = width_buckets or range(1, n + 1)
    own_end = own_end if bidirectional else None
    return make_meta(
        *spans, block_size=block_size, width_buckets=buckets, window=window, own_end=own_end
    )


def random_qkv(
    t: int, heads: int, kv_heads: int, head_dim: int, dtype, seed: int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, heads, head_dim))  # f64[T, H, D]
    k = rng.standard_normal((t, kv_heads, head_dim))  # f64[T, Hkv, D]
    v = rng.standard_normal((t, kv_heads, head_dim))  # f64[T, Hkv, D]
    return tuple(jnp.asarray(x, dtype=dtype) for x in (q, k, v))


@partial(jax.jit, static_argnames=("name", "scale", "softcap", "per_step"))
def run_jitted(
    q, k, v, meta, *, name: str, scale: float, softcap: float = 0.0, per_step: int | None = None
):
    if name == "xla":
        return attention_xla(
            q, k, v, meta, scale=scale, softcap=softcap, query_blocks_per_step=per_step
        )
    return ATTENTION[name](q, k, v, meta, scale=scale, softcap=softcap)


def assert_matches_reference(
    q, k, v, meta, *, per_step: int | None = None, softcap: float = 0.0
) -> jax.Array:
    scale = q.shape[-1] ** -0.5
    got = run_jitted(q, k, v, meta, name="xla", scale=scale, softcap=softcap, per_step=per_step)
    want = run_jitted(q, k, v, meta, name="reference", scale=scale, softcap=softcap)
    assert got.shape == q.shape
    assert got.dtype == q.dtype
    tol = TOLERANCE[q.dtype.type]
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
    )
    return got


MIXED = [(13, [5, 9]), (0, [21]), (7, [1, 2, 30]), (0, [3])]
SCENARIOS = {
    # name: (groups, extra_pad, block_size, heads, kv_heads, head_dim, sliding window or 0)
    "plain": ([(0, [5]), (0, [17]), (9, []), (0, [30])], 0, 16, 4, 4, 64, 0),
    "shared_prefix": ([(40, [7] * 10)], 0, 16, 6, 2, 64, 0),
    "one_token_items": ([(20, [1] * 30)], 0, 16, 8, 1, 128, 0),
    "long_sequence": ([(0, [150])], 0, 16, 6, 2, 64, 0),
    "padding_rows": ([(10, [3, 4])], 40, 32, 6, 2, 64, 0),
    "mixed_groups": (MIXED, 0, 32, 6, 2, 128, 0),
    "mixed_gqa8": ([(33, [4, 11, 2]), (0, [40]), (5, [6] * 5)], 0, 32, 8, 1, 64, 0),
    # sliding windows: within one sequence, cutting into a shared prefix, past a prefix whole
    "window_long_sequence": ([(0, [150])], 0, 16, 6, 2, 64, 32),
    "window_in_prefix": ([(40, [7] * 10)], 0, 16, 6, 2, 64, 12),
    "window_mixed_groups": (MIXED, 8, 32, 6, 2, 128, 10),
    "window_past_prefix": ([(5, [30, 2]), (0, [64])], 0, 16, 8, 1, 64, 16),
    # encoder sequences: each token sees its whole sequence (own spans past the diagonal), and
    # bidirectional local windows (ModernBERT: keys within window // 2 on either side)
    "bidirectional_pairs": ([(0, [5, 17, 30, 1, 40])], 0, 16, 4, 4, 64, 0),
    "bidirectional_long_gqa": ([(0, [150, 3, 70])], 10, 32, 6, 2, 128, 0),
    "bidirectional_window": ([(0, [150, 20, 90])], 0, 16, 6, 2, 64, 32),
    "bidirectional_window_gqa8": ([(0, [200, 7, 33])], 5, 32, 8, 1, 128, 40),
    "bidirectional_minilm": ([(0, [150, 3, 70])], 0, 16, 12, 12, 32, 0),  # head_dim 32
}


def scenario_meta(name: str, **meta_kwargs) -> tuple[AttentionMeta, tuple[int, int, int]]:
    """The scenario's metadata, and its (heads, kv_heads, head_dim)."""
    groups, extra_pad, block, heads, kv_heads, head_dim, window = SCENARIOS[name]
    bidirectional = name.startswith("bidirectional")
    meta = layout_meta(
        groups, block, extra_pad, window=window, bidirectional=bidirectional, **meta_kwargs
    )
    return meta, (heads, kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_xla_matches_reference(scenario: str, dtype) -> None:
    meta, shape = scenario_meta(scenario)
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, dtype)
    assert_matches_reference(q, k, v, meta)


@pytest.mark.parametrize("scenario", ["mixed_groups", "window_in_prefix"])
def test_soft_capped_scores_match_reference(scenario: str) -> None:
    meta, shape = scenario_meta(scenario)
    q, k, v = random_qkv(meta.prefix_start.shape[0], *shape, jnp.float32, seed=4)
    capped = assert_matches_reference(q * 4, k, v, meta, softcap=3.0)
    plain = run_jitted(q * 4, k, v, meta, name="reference", scale=q.shape[-1] ** -0.5)
    assert np.abs(np.asarray(capped) - np.asarray(plain)).max() > 0.1  # the cap bites


@pytest.mark.parametrize("per_step", [1, 4, 64])
def test_query_blocks_per_step_agree(per_step: int) -> None:
    # 6 query blocks: 4 leaves a remainder chunk, 64 processes all blocks in one vmapped loop.
    meta = layout_meta([(13, [5, 9]), (0, [21]), (7, [1, 2, 30])], 16, width_buckets=(8,))
    assert meta.block_kv.shape[0] == 6
    q, k, v = random_qkv(meta.prefix_start.shape[0], 6, 2, 64, jnp.float32, seed=1)
    assert_matches_reference(q, k, v, meta, per_step=per_step)


def test_padding_rows_attend_only_to_themselves() -> None:
    meta = layout_meta([(10, [3, 4])], 16, extra_pad=40)
    t = meta.prefix_start.shape[0]
    q, k, v = random_qkv(t, 6, 2, 64, jnp.float32, seed=2)
    out = run_jitted(q, k, v, meta, name="xla", scale=0.125)
    assert np.all(np.isfinite(np.asarray(out)))
    padding = np.arange(17, t)
    expected = np.repeat(np.asarray(v)[padding], 3, axis=1)  # query head h reads kv head h // 3
    np.testing.assert_allclose(np.asarray(out)[padding], expected, atol=1e-6)


def brute_force_attention(
    q, k, v, meta: AttentionMeta, scale: float, softcap: float = 0.0
) -> np.ndarray:
    """Token by token, head by head, in float64 straight from the span definition."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    t, heads, head_dim = q.shape
    group = heads // k.shape[1]
    out = np.zeros((t, heads, head_dim))
    for i in range(t):
        keys = [
            s
            for s in range(t)
            if meta.prefix_start[i] <= s < meta.prefix_end[i]
            or meta.own_start[i] <= s < meta.own_end[i]
        ]
        for h in range(heads):
            scores = np.array([q[i, h] @ k[s, h // group] for s in keys]) * scale
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            weights = np.exp(scores - scores.max())
            out[i, h] = (weights / weights.sum()) @ v[keys, h // group]
    return out


def test_reference_matches_brute_force() -> None:
    meta = layout_meta([(5, [2, 3]), (0, [4]), (3, [1, 1])], 8, extra_pad=3)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 6, 2, 16, jnp.float32, seed=3)
    got = attention_reference(q, k, v, meta, scale=0.3)
    want = brute_force_attention(q, k, v, meta, 0.3)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    got = attention_reference(q, k, v, meta, scale=0.3, softcap=0.5)
    want = brute_force_attention(q, k, v, meta, 0.3, softcap=0.5)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_bidirectional_reference_matches_brute_force() -> None:
    meta = layout_meta([(0, [6, 1, 9])], 8, extra_pad=3, bidirectional=True)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 6, 2, 16, jnp.float32, seed=4)
    want = brute_force_attention(q, k, v, meta, 0.3)
    np.testing.assert_allclose(
        np.asarray(attention_reference(q, k, v, meta, scale=0.3)), want, atol=1e-5
    )
    # the first token of a sequence sees the whole sequence, not only itself
    causal = layout_meta([(0, [6, 1, 9])], 8, extra_pad=3)
    first = np.asarray(attention_reference(q, k, v, causal, scale=0.3))[0]
    assert not np.allclose(want[0], first, atol=1e-3)


def hidden_tail_meta(
    lengths: Sequence[int], hidden: Sequence[int], block_size: int
) -> AttentionMeta:
    """Encoder sequences back to back whose last `hidden[i]` tokens no token sees (a ColBERT
    query's expansion): each token's own span ends after its sequence's visible tokens, so a
    hidden token's does not hold its own key."""
    prefix_start, prefix_end, own_start, own_end = bidirectional_spans(lengths, block_size)
    start = 0
    for n, h in zip(lengths, hidden, strict=True):
        own_end[start : start + n] = start + n - h
        start += n
    width = (len(own_start) // block_size,)
    return make_meta(
        prefix_start,
        prefix_end,
        own_start,
        block_size=block_size,
        width_buckets=width,
        own_end=own_end,
    )


HIDDEN_TAILS = ([7, 12, 1, 30], [5, 0, 0, 17])  # lengths, hidden tokens of each


def test_hidden_tails_are_seen_by_no_token() -> None:
    """The reference, the XLA kernel and brute force agree on sequences with hidden tails; the
    visible tokens' outputs are those of the sequences cut to them."""
    lengths, hidden = HIDDEN_TAILS
    meta = hidden_tail_meta(lengths, hidden, 16)
    q, k, v = random_qkv(meta.prefix_start.shape[0], 4, 2, 32, jnp.float32, seed=6)
    want = brute_force_attention(q, k, v, meta, 0.3)
    np.testing.assert_allclose(
        np.asarray(attention_reference(q, k, v, meta, scale=0.3)), want, atol=1e-5
    )
    assert_matches_reference(q, k, v, meta)
    visible = [n - h for n, h in zip(lengths, hidden, strict=True)]
    cut = bidirectional_spans(visible, 16)
    starts = np.cumsum([0, *lengths[:-1]])
    rows = np.concatenate([s + np.arange(n) for s, n in zip(starts, visible, strict=True)])
    cut_meta = make_meta(
        *cut[:3], block_size=16, width_buckets=(len(cut[0]) // 16,), own_end=cut[3]
    )
    qc, kc, vc = (np.zeros((len(cut[0]), *x.shape[1:]), np.float32) for x in (q, k, v))
    for x, xc in ((q, qc), (k, kc), (v, vc)):
        xc[: len(rows)] = np.asarray(x)[rows]
    alone = np.asarray(attention_reference(qc, kc, vc, cut_meta, scale=0.3))[: len(rows)]
    np.testing.assert_allclose(want[rows], alone, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=6),
    window=st.integers(2, 50),
    pad=st.integers(0, 20),
)
def test_local_spans_keep_the_keys_within_half_a_window(lengths, window: int, pad: int) -> None:
    _, _, own_start, own_end = bidirectional_spans(lengths, 16, pad)
    start, end = local_spans(own_start, own_end, window=window)
    for t in range(len(own_start)):
        keys = {s for s in range(own_start[t], own_end[t]) if abs(s - t) <= window // 2}
        assert set(range(start[t], end[t])) == keys


PROPERTY_T, PROPERTY_BLOCK = 128, 16


@st.composite
def packings(draw) -> list[tuple[int, list[int]]]:
    """Random groups that fit in PROPERTY_T tokens (the rest becomes padding)."""
    groups, used = [], 0
    for _ in range(draw(st.integers(1, 6))):
        prefix_len = draw(st.integers(0, 24))
        items = draw(st.lists(st.integers(1, 20), max_size=6))
        size = prefix_len + sum(items)
        if size == 0 or used + size > PROPERTY_T:
            break
        groups.append((prefix_len, items))
        used += size
    return groups or [(0, [1])]


@settings(max_examples=25, deadline=None)
@given(groups=packings(), seed=st.integers(0, 2**16))
def test_xla_matches_reference_on_random_packings(groups, seed: int) -> None:
    # Fixed T and width keep a single compiled shape across examples.
    spans = layout_spans(groups, PROPERTY_BLOCK, PROPERTY_T - sum(p + sum(i) for p, i in groups))
    n = PROPERTY_T // PROPERTY_BLOCK
    meta = make_meta(*spans, block_size=PROPERTY_BLOCK, width_buckets=(n,))
    q, k, v = random_qkv(PROPERTY_T, 6, 2, 64, jnp.float32, seed=seed)
    assert_matches_reference(q, k, v, meta)


def test_select_attention() -> None:
    assert select_attention(None, "cpu") is attention_xla  # no head dim: nothing native fits
    assert select_attention(None, "gpu") is ATTENTION["pallas"]
    assert select_attention(None, "tpu") is ATTENTION["pallas"]
    assert select_attention(None, "gpu", head_dim=80) is attention_xla  # Triton: powers of two
    assert select_attention(None, "other") is attention_xla
    assert select_attention("reference", "gpu") is attention_reference
    assert select_attention("xla", "tpu") is attention_xla
    assert {"reference", "xla", "pallas", "mosaic"} <= set(ATTENTION)
    assert set(ATTENTION) <= {"reference", "xla", "pallas", "mosaic", "cpu"}
    with pytest.raises(ValueError, match=r"unknown attention 'flash'; known: \[.*'xla'\]"):
        select_attention("flash", "cpu")


def layout_positions(groups: Layout) -> list[tuple[int, int]]:
    """(sequence, position) of every laid-out token: a group's prefix tokens belong to each of
    its items (sequence -1 - group marks them; an item is its group's prefix then itself)."""
    out = []
    for g, (prefix_len, items) in enumerate(groups):
        out += [(-1 - g, p) for p in range(prefix_len)]
        for i, n in enumerate(items):
            out += [((g, i), prefix_len + p) for p in range(n)]
    return out


def window_keys(groups: Layout, t: int, window: int) -> list[set[int]]:
    """From positions alone: the keys token t sees under a sliding window (its sequence's tokens
    at positions p' with p - window < p' <= p), padding seeing itself."""
    tokens = layout_positions(groups)
    rows = []
    for i in range(t):
        if i >= len(tokens):
            rows.append({i})
            continue
        seq, pos = tokens[i]
        prefix = seq if isinstance(seq, int) else -1 - seq[0]  # its group's prefix tokens
        seen = {seq, prefix}
        rows.append(
            {j for j, (s, p) in enumerate(tokens[: i + 1]) if s in seen and p > pos - window}
        )
    return rows


@settings(max_examples=40, deadline=None)
@given(groups=packings(), window=st.integers(1, 40), pad=st.integers(0, 20))
def test_window_spans_keep_the_last_positions(groups, window: int, pad: int) -> None:
    """`window_spans` agrees with a window computed from sequence positions alone."""
    spans = layout_spans(groups, 8, pad)
    ps, os_ = window_spans(*spans, window=window)
    pe = spans[1]
    got = [set(range(ps[i], pe[i])) | set(range(os_[i], i + 1)) for i in range(len(ps))]
    assert got == window_keys(groups, len(ps), window)
