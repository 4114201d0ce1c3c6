"""The KV pool's page allocator and radix prefix cache, compiled and pure Python alike."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _native

PAGE = 4


@pytest.fixture(params=sorted(_native.IMPLEMENTATIONS))
def impl(request):
    return _native.IMPLEMENTATIONS[request.param]


def cached(cache, tokens):
    """Insert `tokens` (whole pages) with freshly allocated pages; returns (node, pages)."""
    pages = cache.allocate(len(tokens) // cache.page_size)
    return cache.insert(tokens, pages), pages.tolist()


def test_match_returns_the_inserted_pages_in_whole_pages(impl):
    cache = impl.PrefixCache(16, PAGE)
    node, pages = cached(cache, list(range(12)))
    found = cache.match(list(range(14)))
    assert (found[0], found[1], found[2].tolist()) == (node, 12, pages)
    short = cache.match(list(range(3)))  # less than a page
    assert (short[0], short[1], short[2].tolist()) == (0, 0, [])
    assert cache.cached_pages == 3 and cache.free_pages == 13


def test_match_inside_an_edge_splits_it_and_keeps_pins(impl):
    cache = impl.PrefixCache(16, PAGE)
    leaf, pages = cached(cache, list(range(12)))
    cache.pin(leaf)
    node, length, got = cache.match(list(range(8)) + [50, 51, 52, 53])
    assert length == 8 and got.tolist() == pages[:2] and node not in (0, leaf)
    assert cache.evictable_pages == 0  # the new middle node carries the leaf's pin
    cache.unpin(leaf)
    assert cache.evictable_pages == 3


def test_insert_over_a_held_prefix_frees_the_duplicates(impl):
    cache = impl.PrefixCache(16, PAGE)
    _, first = cached(cache, list(range(8)))
    fresh = cache.allocate(3).tolist()
    node = cache.insert(list(range(8)) + [7, 7, 7, 7], [first[0], fresh[1], fresh[2]])
    # page 0 is the tree's own; fresh[1] duplicates its second page and goes back; fresh[0]
    # was never given, so it stays handed out
    assert cache.match(list(range(8)) + [7] * 4)[2].tolist() == [*first, fresh[2]]
    assert cache.match(list(range(8)) + [7] * 4)[0] == node
    assert cache.free_pages == 16 - 3 - 1
    cache.release([fresh[0]])
    assert cache.free_pages == 16 - 3


def test_allocate_evicts_least_recently_used_leaves_and_spares_pins(impl):
    cache = impl.PrefixCache(4, PAGE)
    cached(cache, [1] * 4)
    b, _ = cached(cache, [2] * 4)
    cached(cache, [3] * 4)
    cache.pin(b)
    cache.match([1] * 4)  # a is now more recent than c
    got = cache.allocate(2)
    assert len(got) == 2 and cache.evicted == 1
    assert cache.match([3] * 4)[1] == 0  # c went first
    assert cache.match([1] * 4)[1] == 4 and cache.match([2] * 4)[1] == 4
    assert cache.allocate(2) is None  # a is evictable, b is pinned: only 1 page could be had
    assert cache.match([1] * 4)[1] == 4  # and nothing was evicted trying


def test_pins_errors_and_release_checks(impl):
    cache = impl.PrefixCache(4, PAGE)
    node, pages = cached(cache, [1] * 8)
    with pytest.raises(ValueError, match="not pinned"):
        cache.unpin(node)
    with pytest.raises(KeyError):
        cache.pin(12345)
    with pytest.raises(ValueError, match="cached"):
        cache.release(pages[:1])
    out = cache.allocate(1)
    cache.release(out)
    with pytest.raises(ValueError, match="free"):
        cache.release(out)
    with pytest.raises(ValueError, match="do not fill"):
        cache.insert([1] * 5, out)
    with pytest.raises(ValueError, match="num_pages"):
        impl.PrefixCache(0, PAGE)
    with pytest.raises(ValueError, match="page_size"):
        impl.PrefixCache(4, 0)


def test_clear_frees_everything(impl):
    cache = impl.PrefixCache(4, PAGE)
    node, _ = cached(cache, [1] * 8)
    cache.pin(node)
    cache.allocate(1)
    cache.clear()
    assert cache.free_pages == 4 and cache.cached_pages == 0
    with pytest.raises(KeyError):
        cache.unpin(node)


# --- properties: random operations against the invariants and between the twins

ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "match_pin", "unpin", "evict", "allocate_release"]),
        st.lists(st.integers(0, 2), min_size=0, max_size=5),  # a sequence of pages of tokens
        st.integers(0, 6),
    ),
    max_size=40,
)


def run_ops(impl, operations, pages=12):
    """Apply `operations`; check the invariants after each; return the observable trace."""
    cache = impl.PrefixCache(pages, 2)
    pinned, trace, expected = [], [], {}
    for op, shape, n in operations:
        tokens = [t for p in shape for t in (p, p + 1)]  # pages drawn from 3 kinds: shared prefixes
        if op == "insert":
            got = cache.allocate(len(shape))
            if got is not None:
                cache.insert(tokens, got)
            trace.append(None if got is None else got.tolist())
        elif op == "match_pin":
            node, length, found = cache.match(tokens)
            cache.pin(node)
            pinned.append((node, tokens[:length], found.tolist()))
            trace.append((length, found.tolist()))
        elif op == "unpin" and pinned:
            cache.unpin(pinned.pop(n % len(pinned))[0])
        elif op == "evict":
            trace.append(cache.evict(n))
        elif op == "allocate_release":
            got = cache.allocate(n)
            trace.append(None if got is None else got.tolist())
            if got is not None:
                cache.release(got)
        check_invariants(cache, pinned, expected)
    return trace


def check_invariants(cache, pinned, expected):
    assert cache.free_pages + cache.cached_pages == cache.num_pages  # nothing handed out here
    assert 0 <= cache.evictable_pages <= cache.cached_pages
    for _, tokens, pages in pinned:  # a pinned prefix stays, on the same pages
        _, length, found = cache.match(tokens)
        assert length == len(tokens) and found.tolist() == pages


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_hold_and_twins_agree(operations):
    traces = [run_ops(impl, operations) for impl in _native.IMPLEMENTATIONS.values()]
    assert all(t == traces[0] for t in traces)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), max_size=12))
def test_matched_pages_are_the_pages_inserted_for_those_tokens(seqs):
    cache = _native.PrefixCache(64, 2)
    owner = {}  # page -> the token prefix it was inserted to hold
    for shape in seqs:
        tokens = [t for p in shape for t in (p, p + 1)]
        pages = cache.allocate(len(shape))
        _, length, held = cache.match(tokens)
        cache.insert(tokens, pages)
        for i, page in enumerate(pages.tolist()[length // 2 :], start=length // 2):
            owner[page] = tuple(tokens[: 2 * (i + 1)])
        _, length, found = cache.match(tokens)
        assert length == len(tokens)
        assert [owner[p] for p in found.tolist()] == [
            tuple(tokens[: 2 * (i + 1)]) for i in range(len(shape))
        ]
        assert np.array_equal(found[: len(held)], held)
