"""Host-side block schedule: exact small cases, errors, and coverage properties."""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from score_kernels import AttentionMeta, make_meta
from score_kernels.schedule import IMPLEMENTATIONS


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def build_block_schedule(request):
    """Each form of the schedule builder: numpy, and the compiled twin where built."""
    return IMPLEMENTATIONS[request.param]


def spans(*columns: list[int]) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(c, dtype=np.int32) for c in columns)


# One group: prefix tokens 0-2, items at 3-4 and 5-7 (B = 2).
SHARED_PREFIX = spans(
    [0, 0, 0, 0, 0, 0, 0, 0],  # prefix_start
    [0, 0, 0, 3, 3, 3, 3, 3],  # prefix_end
    [0, 0, 0, 3, 3, 5, 5, 5],  # own_start
)
# Group A: prefix 0-3, item 4-5. Group B: prefix 6-9, item 10-11. Plain 12-13, padding 14-15.
TWO_PREFIXES = spans(
    [0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6, 12, 12, 14, 15],
    [0, 0, 0, 0, 4, 4, 6, 6, 6, 6, 10, 10, 12, 12, 14, 15],
    [0, 0, 0, 0, 4, 4, 6, 6, 6, 6, 10, 10, 12, 12, 14, 15],
)
# Prefix 0-1, items 2-5 and 6-9 (B = 2): the last item skips the first item's blocks.
GAP = spans(
    [0] * 10,
    [0, 0] + [2] * 8,
    [0, 0, 2, 2, 2, 2, 6, 6, 6, 6],
)


@pytest.mark.parametrize(
    ("case", "block_size", "buckets", "expected_kv", "expected_count"),
    [
        (
            SHARED_PREFIX,
            2,
            (4, 8),
            [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
            [1, 2, 3, 4],
        ),
        (TWO_PREFIXES, 4, (1, 2, 4), [[0, 0], [0, 1], [1, 2], [3, 3]], [1, 2, 2, 1]),
        (GAP, 2, (8, 3), [[0, 0, 0], [0, 1, 1], [0, 1, 2], [0, 3, 3], [0, 3, 4]], [1, 2, 3, 2, 3]),
        (SHARED_PREFIX, 8, (1,), [[0]], [1]),
    ],
    ids=["shared_prefix", "two_prefixes", "gap", "single_block"],
)
def test_exact_schedules(
    build_block_schedule, case, block_size, buckets, expected_kv, expected_count
) -> None:
    block_kv, block_count = build_block_schedule(
        *case, block_size=block_size, width_buckets=buckets
    )
    assert block_kv.dtype == np.int32
    assert block_count.dtype == np.int32
    np.testing.assert_array_equal(block_kv, expected_kv)
    np.testing.assert_array_equal(block_count, expected_count)


def test_token_count_not_multiple_of_block(build_block_schedule) -> None:
    with pytest.raises(ValueError, match="8 is not a positive multiple of block size 3"):
        build_block_schedule(*SHARED_PREFIX, block_size=3, width_buckets=(8,))


def test_width_exceeds_buckets(build_block_schedule) -> None:
    with pytest.raises(ValueError, match="schedule width 4 exceeds the largest width bucket 3"):
        build_block_schedule(*SHARED_PREFIX, block_size=2, width_buckets=(1, 3))


def test_malformed_spans(build_block_schedule) -> None:
    ps, pe, own = SHARED_PREFIX
    with pytest.raises(ValueError, match="own_start"):
        build_block_schedule(ps, pe, own + 1, block_size=2, width_buckets=(8,))
    with pytest.raises(ValueError, match="prefix spans"):
        build_block_schedule(pe, ps, own, block_size=2, width_buckets=(8,))
    with pytest.raises(ValueError, match="equal length"):
        build_block_schedule(ps[:4], pe, own, block_size=2, width_buckets=(8,))


def test_own_spans_that_end_before_their_token(build_block_schedule) -> None:
    """A sequence's hidden tail (tokens 6-7, a ColBERT query's expansion) sees its first six
    tokens alone; an empty own span is refused."""
    ps = pe = own = np.zeros(8, np.int32)
    own_end = np.full(8, 6, np.int32)
    block_kv, block_count = build_block_schedule(
        ps, pe, own, block_size=2, width_buckets=(4,), own_end=own_end
    )
    np.testing.assert_array_equal(block_count, [3, 3, 3, 3])
    np.testing.assert_array_equal(block_kv[:, :3], [[0, 1, 2]] * 4)
    with pytest.raises(ValueError, match="own_start"):
        build_block_schedule(ps, pe, own, block_size=2, width_buckets=(4,), own_end=own_end * 0)


def test_make_meta_is_int32_numpy() -> None:
    meta = make_meta(*(c.astype(np.int64) for c in GAP), block_size=2, width_buckets=(3,))
    assert isinstance(meta, AttentionMeta)
    assert meta.block_size == 2
    for field in meta:
        assert isinstance(field, np.ndarray)
        assert field.dtype == np.int32
    np.testing.assert_array_equal(meta.own_start, GAP[2])


@st.composite
def valid_spans(draw) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Arbitrary spans obeying 0 <= own_start[t] <= t and 0 <= prefix_start <= prefix_end <= T."""
    block = draw(st.sampled_from([1, 2, 3, 4, 8]))
    t = block * draw(st.integers(1, 12))
    own = [draw(st.integers(0, i) | st.integers(max(0, i - block), i)) for i in range(t)]
    bounds = [sorted(draw(st.lists(st.integers(0, t), min_size=2, max_size=2))) for _ in range(t)]
    ps, pe = zip(*bounds, strict=True)
    return block, *spans(list(ps), list(pe), own)


def allowed_blocks(block: int, ps, pe, own) -> np.ndarray:  # bool[NQB, NKB]
    """Brute force: which (query block, key block) pairs hold at least one allowed pair."""
    t = ps.shape[0]
    query = np.arange(t)[:, None]
    key = np.arange(t)[None, :]
    in_prefix = (key >= ps[:, None]) & (key < pe[:, None])
    allowed = in_prefix | ((key >= own[:, None]) & (key <= query))
    n = t // block
    return allowed.reshape(n, block, n, block).any(axis=(1, 3))


@settings(max_examples=300, deadline=None)
@given(case=valid_spans(), buckets=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_schedule_covers_exactly_the_allowed_blocks(case, buckets) -> None:
    for build in IMPLEMENTATIONS.values():
        _covers_exactly_the_allowed_blocks(build, case, buckets)


def _covers_exactly_the_allowed_blocks(build_block_schedule, case, buckets) -> None:
    block, ps, pe, own = case
    expected = allowed_blocks(block, ps, pe, own)
    widest = int(expected.sum(axis=1).max())
    if max(buckets) < widest:
        with pytest.raises(ValueError, match=f"schedule width {widest} "):
            build_block_schedule(ps, pe, own, block_size=block, width_buckets=buckets)
        return
    block_kv, block_count = build_block_schedule(
        ps, pe, own, block_size=block, width_buckets=buckets
    )
    assert block_kv.shape == (expected.shape[0], min(w for w in buckets if w >= widest))
    for i, row in enumerate(block_kv):
        listed = row[: block_count[i]]
        np.testing.assert_array_equal(listed, np.flatnonzero(expected[i]))
        assert np.all(row[block_count[i] :] == listed[-1])


@st.composite
def spans_with_context(draw) -> tuple[dict, tuple[np.ndarray, ...]]:
    """Spans over C context keys then T batch keys, own spans ending anywhere after their token
    (bidirectional) or causal, a few of them malformed."""
    block = draw(st.sampled_from([1, 2, 4, 8]))
    t = block * draw(st.integers(1, 10))
    context = block * draw(st.integers(0, 6))
    end = context + t
    own, own_end, bounds = [], [], []
    for i in range(t):
        pos = context + i
        own.append(draw(st.integers(0, pos) | st.integers(-1, end + 1)))
        own_end.append(draw(st.integers(pos + 1, end)))
        bounds.append(sorted(draw(st.lists(st.integers(0, end), min_size=2, max_size=2))))
    ps, pe = zip(*bounds, strict=True)
    causal = draw(st.booleans())
    options = {"block_size": block, "context": context, "own_end": None if causal else own_end}
    return options, spans(list(ps), list(pe), own)


@settings(max_examples=300, deadline=None)
@given(case=spans_with_context(), buckets=st.lists(st.integers(1, 16), min_size=1, max_size=4))
def test_the_compiled_schedule_equals_numpys(case, buckets) -> None:
    if "native" not in IMPLEMENTATIONS:
        pytest.skip("the compiled schedule (_native._schedule) is not built")
    options, columns = case
    if options["own_end"] is not None:
        options = {**options, "own_end": np.asarray(options["own_end"], np.int32)}
    results = []
    for name in ("numpy", "native"):
        try:
            results.append(IMPLEMENTATIONS[name](*columns, width_buckets=buckets, **options))
        except ValueError as error:
            results.append(str(error))
    if isinstance(results[0], str):
        assert results[1] == results[0]
    else:
        for ours, theirs in zip(results[1], results[0], strict=True):
            assert ours.dtype == theirs.dtype == np.int32
            np.testing.assert_array_equal(ours, theirs)
