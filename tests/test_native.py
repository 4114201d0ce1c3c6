"""Each compiled hot path and its pure-Python twin give the same answers."""

import re
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _native


@pytest.fixture(params=sorted(_native.IMPLEMENTATIONS))
def impl(request):
    return _native.IMPLEMENTATIONS[request.param]


def test_compiled_module_is_built():
    assert _native.COMPILED, "run `pip install -e .` to build the Cython extensions"


def outcome(fn, *args):
    """What `fn(*args)` returns, or its ValueError's or TypeError's name and message: comparable
    across twins."""
    try:
        return fn(*args)
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"


# --- pick_bucket


def test_pick_bucket_chooses_the_smallest_that_fits(impl):
    assert [impl.pick_bucket((8, 16, 32), n) for n in (0, 1, 8, 9, 16, 17, 32)] == [
        8,
        8,
        8,
        16,
        16,
        32,
        32,
    ]


def test_pick_bucket_never_clips(impl):
    with pytest.raises(ValueError, match="size 33 exceeds the largest bucket 32"):
        impl.pick_bucket((8, 16, 32), 33)
    with pytest.raises(ValueError, match="size 1 exceeds the largest bucket None"):
        impl.pick_bucket((), 1)


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=20, unique=True), st.integers(0, 10**6))
def test_twins_agree(buckets, n):
    buckets = sorted(buckets)
    outcomes = [outcome(i.pick_bucket, buckets, n) for i in _native.IMPLEMENTATIONS.values()]
    assert len(set(outcomes)) == 1


# --- group_by_prefix


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def sorted_lcp_groups(seqs):
    """The grouping oracle on sorted order: a range stays one group (saving (n-1) * its smallest
    adjacent LCP) or splits at those smallest LCPs, whichever saves more, whole on ties; every
    LCP is capped so that each member keeps a suffix token."""
    order = sorted(range(len(seqs)), key=lambda i: tuple(seqs[i]))
    lcp = [
        min(common_prefix(seqs[a], seqs[b]), len(seqs[a]) - 1, len(seqs[b]) - 1)
        for a, b in pairwise(order)
    ]

    def best(lo, hi):  # (saved, [(prefix, members)]) for sorted positions [lo, hi)
        if hi - lo == 1:
            return 0, [(0, (order[lo],))]
        low = min(lcp[lo : hi - 1])
        cuts = [lo] + [j + 1 for j in range(lo, hi - 1) if lcp[j] == low] + [hi]
        parts = [best(a, b) for a, b in pairwise(cuts)]
        split = sum(saved for saved, _ in parts)
        if low > 0 and (hi - lo - 1) * low >= split:
            return (hi - lo - 1) * low, [(low, tuple(sorted(order[lo:hi])))]
        return split, [g for _, groups in parts for g in groups]

    return sorted(best(0, len(seqs))[1], key=lambda g: g[1][0]) if seqs else []


def test_groups_share_the_longest_prefixes(impl):
    q1, q2 = [1, 2, 3, 4, 5], [1, 2, 9, 9, 9]
    seqs = [q1 + [7], q2 + [8], q1 + [6, 6], [4], q2 + [1]]
    assert impl.group_by_prefix(seqs) == [(5, (0, 2)), (5, (1, 4)), (0, (3,))]


@pytest.mark.parametrize(
    ("seqs", "expected"),
    [
        ([], []),
        ([[5]], [(0, (0,))]),
        ([[], [], [1]], [(0, (0,)), (0, (1,)), (0, (2,))]),
        ([[1, 2, 3], [1, 2, 3], [1, 2, 3, 4]], [(2, (0, 1, 2))]),  # each keeps a suffix token
        ([[1, 2], [1, 2, 3], [1, 2, 3, 4]], [(1, (0, 1, 2))]),
        ([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2]], [(4, (0, 1)), (0, (2,))]),  # 4 beats 2 * 1
        ([[7, 1, 2], [7, 1, 3], [7, 5, 6], [7, 5, 8]], [(2, (0, 1)), (2, (2, 3))]),  # 4 beats 3
        ([[1, 2, 3, 4], [1, 2, 8, 5], [1, 2, 3, 5], [1, 2, 8, 4]], [(2, (0, 1, 2, 3))]),  # 6 = 6
        (
            [[1, 2, 3, 4, 4], [1, 2, 8, 5], [1, 2, 3, 4, 5], [1, 2, 8, 4]],
            [(4, (0, 2)), (3, (1, 3))],
        ),
        ([[7, 1, 2, 2], [7, 1, 2, 3], [7, 5, 6], [7, 5, 8]], [(3, (0, 1)), (2, (2, 3))]),
    ],
)
def test_group_by_prefix_exact(impl, seqs, expected):
    assert impl.group_by_prefix(seqs) == expected
    assert impl.group_by_prefix([np.array(s, np.int32) for s in seqs]) == expected


def test_group_by_prefix_of_a_shared_prompt(impl):
    prompt = list(range(1000, 3000))
    seqs = [prompt + [i, i + 1] for i in range(50)] + [[5, 6, 7]]
    assert impl.group_by_prefix(seqs) == [(2000, tuple(range(50))), (0, (50,))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=9), max_size=30))
def test_group_by_prefix_equals_the_sorted_lcp_oracle(seqs):
    expected = sorted_lcp_groups(seqs)
    for impl in _native.IMPLEMENTATIONS.values():
        assert impl.group_by_prefix(seqs) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=12),
    st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=12),
    st.booleans(),
)
def test_a_prompt_every_sequence_shares_groups_like_the_oracle(prompt, tails, fresh):
    """The prompt all sequences share is found first (token objects compared: the same objects
    when joined from one query, equal ones otherwise) and the rest grouped below it."""
    prompt = [1000 + t for t in prompt]  # beyond the interpreter's cached small ints
    copy = lambda: [int(str(t)) for t in prompt] if fresh else prompt
    seqs = [copy() + [1000 + t for t in tail] for tail in tails]
    expected = sorted_lcp_groups(seqs)
    for impl in _native.IMPLEMENTATIONS.values():
        assert impl.group_by_prefix(seqs) == expected
        assert impl.group_by_prefix([np.array(s, np.int32) for s in seqs]) == expected


PROMPT = [(7 * i) % 5 for i in range(300)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 300), st.lists(st.integers(0, 4), max_size=4)), max_size=12)
)
def test_long_shared_prefixes_group_like_the_oracle(cuts):
    seqs = [PROMPT[:k] + tail for k, tail in cuts]  # prefixes longer than one compared slice
    expected = sorted_lcp_groups(seqs)
    for impl in _native.IMPLEMENTATIONS.values():
        assert impl.group_by_prefix(seqs) == expected


def as_kinds(seqs):
    """The same sequences as each kind of input the compiled form reads: in place (int32
    vectors, views into one buffer as `engine.host.inputs.join_ids` gives them, read-only ones) or
    converted (lists, tuples, int64, big-endian int32, strided views)."""
    buffer = np.zeros(2 * sum(map(len, seqs)) + 1, np.int32)
    joined, at = [], 0
    for seq in seqs:
        joined.append(buffer[at : at + len(seq)])
        joined[-1][:] = seq
        at += len(seq)
    frozen = [np.array(seq, np.int32) for seq in seqs]
    for arr in frozen:
        arr.flags.writeable = False
    strided = [np.repeat(np.array(seq, np.int32), 2)[::2] for seq in seqs]
    return {
        "lists": [list(seq) for seq in seqs],
        "tuples": [tuple(seq) for seq in seqs],
        "int32": [np.array(seq, np.int32) for seq in seqs],
        "int64": [np.array(seq, np.int64) for seq in seqs],
        "big-endian": [np.array(seq, ">i4") for seq in seqs],
        "joined": joined,
        "read-only": frozen,
        "strided": strided,
        "mixed": [list(seq) if i % 2 else np.array(seq, np.int32) for i, seq in enumerate(seqs)],
    }


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.lists(st.integers(0, 3), max_size=9), max_size=20),
)
def test_every_kind_of_input_groups_like_the_oracle(prompt, tails):
    seqs = [prompt + tail for tail in tails]
    expected = sorted_lcp_groups(seqs)
    for impl in _native.IMPLEMENTATIONS.values():
        for kind, inputs in as_kinds(seqs).items():
            assert impl.group_by_prefix(inputs) == expected, kind
            assert impl.group_by_prefix(tuple(inputs)) == expected, kind


def test_group_by_prefix_leaves_its_inputs_as_they_were(impl):
    seqs = as_kinds([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], [1, 9]])
    before = {kind: [list(map(int, s)) for s in inputs] for kind, inputs in seqs.items()}
    for inputs in seqs.values():
        assert impl.group_by_prefix(inputs) == [(5, (0, 1)), (0, (2,))]
    assert {kind: [list(map(int, s)) for s in inputs] for kind, inputs in seqs.items()} == before


# --- join_ids


def test_join_ids_lays_out_query_then_item_or_item_first(impl):
    seqs = impl.join_ids([7, 8], [[1], [], (2, 3)], False, 10)
    assert [s.tolist() for s in seqs] == [[7, 8, 1], [7, 8], [7, 8, 2, 3]]
    assert all(s.dtype == np.int32 and s.base is seqs[0].base for s in seqs)  # one buffer
    seqs = impl.join_ids([7, 8], [[1], [2, 3]], True, 10)
    assert [s.tolist() for s in seqs] == [[1, 7, 8], [2, 3, 7, 8]]
    assert [s.tolist() for s in impl.join_ids([], [[4], [5, 6]], False, 10)] == [[4], [5, 6]]
    assert impl.join_ids([1, 2], [], False, 10) == []


@pytest.mark.parametrize(
    ("query", "items", "field"),
    [
        ([1, 10], [[1]], "query"),
        ([1, -1], [[1]], "query"),
        ([1], [[1], [2, 10]], "items[1]"),
        ([1], [[1], [-5], [10]], "items[1]"),
        ([2**64], [[10]], "query"),
        ([1], [[3], [2**63]], "items[1]"),
        ([10], [[10]], "query"),  # the query first, then the items in order
    ],
)
def test_join_ids_names_the_field_with_an_id_outside_the_vocabulary(impl, query, items, field):
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}$"):
        impl.join_ids(query, items, False, 10)


@pytest.mark.parametrize(
    ("query", "items", "error", "field"),
    [
        ([1, True], [[1]], TypeError, "query"),  # a bool is an int to Python, but no token id
        ([1], [[1], [2, 3.0]], TypeError, "items[1]"),
        ([1], [(1,), ("2",)], TypeError, "items[1]"),
        ([1], [[None]], TypeError, "items[0]"),
        ([1], [[np.int64(2)]], TypeError, "items[0]"),  # exactly int, as JSON decodes them
        ([1], [[10, "x"], [1.5]], ValueError, "items[0]"),  # the first wrong id decides
        ([1], [[1, "x", 10]], TypeError, "items[0]"),
    ],
)
def test_join_ids_names_the_field_with_something_other_than_an_int(
    impl, query, items, error, field
):
    with pytest.raises(error, match=rf"^{re.escape(field)}$"):
        impl.join_ids(query, items, False, 10)


ID_OR_NOT = st.one_of(
    st.integers(-2, 12), st.sampled_from([True, False, 1.0, "1", None, 2**70, np.int32(3)])
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-2, 12), max_size=8),
    st.lists(st.lists(st.integers(-2, 12), max_size=6), max_size=8),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 6), ID_OR_NOT), max_size=2),
)
def test_join_ids_twins_agree(query, items, item_first, wrong):
    for i, j, x in wrong:  # item i (or the query, past the items), position j
        ids = items[i] if i < len(items) else query
        ids.insert(min(j, len(ids)), x)
    outcomes = []
    for impl in _native.IMPLEMENTATIONS.values():
        joined = outcome(impl.join_ids, query, items, item_first, 11)
        outcomes.append(joined if isinstance(joined, str) else [s.tolist() for s in joined])
    assert outcomes[0] == outcomes[-1]
    if not isinstance(outcomes[0], str):
        assert outcomes[0] == [it + query if item_first else query + it for it in items]


# --- pack_chunks


def test_pack_chunks_lays_out_prefix_then_suffixes(impl):
    seqs = [[5, 6, 7, 1], [5, 6, 7, 2, 3], [9, 9, 9]]
    arrays = impl.pack_chunks(seqs, [(3, (0, 1)), (0, (2,))])
    expected = [
        [5, 6, 7, 1, 2, 3, 9, 9, 9],  # tokens
        [0, 1, 2, 3, 3, 4, 0, 1, 2],  # positions
        [0, 0, 0, 0, 0, 0, 6, 6, 6],  # prefix_start
        [0, 0, 0, 3, 3, 3, 6, 6, 6],  # prefix_end
        [0, 0, 0, 3, 4, 4, 6, 6, 6],  # own_start
        [3, 5, 8],  # score_rows
        [0, 1, 2],  # order
    ]
    assert len(arrays) == len(expected)
    for got, want in zip(arrays, expected, strict=True):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_pack_chunks_reads_arrays_and_tuples(impl):
    seqs = [np.array([4, 4, 1], np.int32), (4, 4, 2, 2), np.array([3], np.int64)]
    tokens, *_, rows, order = impl.pack_chunks(seqs, [(0, (2,)), (2, (1, 0))])
    np.testing.assert_array_equal(tokens, [3, 4, 4, 2, 2, 1])
    np.testing.assert_array_equal(rows, [0, 4, 5])
    np.testing.assert_array_equal(order, [2, 1, 0])


def test_pack_chunks_rejects_members_without_a_suffix(impl):
    with pytest.raises(ValueError, match="sequence 1 has 2 tokens; its chunk's prefix 2"):
        impl.pack_chunks([[1, 2, 3], [1, 2]], [(2, (0, 1))])
    with pytest.raises(ValueError, match="no members"):
        impl.pack_chunks([[1]], [(0, ())])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=20))
def test_pack_chunks_twins_agree_and_lay_out_every_sequence(seqs):
    """Both forms, and the compiled one on every kind of input, lay out the same arrays."""
    chunks = _native.IMPLEMENTATIONS["python"].group_by_prefix(seqs)
    results = [i.pack_chunks(seqs, chunks) for i in _native.IMPLEMENTATIONS.values()]
    results += [_native.pack_chunks(kind, chunks) for kind in as_kinds(seqs).values()]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    tokens, positions, pstart, pend, ostart, rows, order = results[0]
    assert sorted(order.tolist()) == list(range(len(seqs)))
    for row, m in zip(rows, order, strict=True):
        own = tokens[ostart[row] : row + 1]
        prefix = tokens[pstart[row] : pend[row]]
        assert np.concatenate([prefix, own]).tolist() == seqs[m]
        assert positions[row] == len(seqs[m]) - 1
