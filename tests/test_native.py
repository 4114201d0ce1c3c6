"""Each compiled hot path and its pure-Python twin give the same answers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import _native


@pytest.fixture(params=sorted(_native.IMPLEMENTATIONS))
def impl(request):
    return _native.IMPLEMENTATIONS[request.param]


def test_compiled_module_is_built():
    assert _native.COMPILED, "run `pip install -e .` to build the Cython extensions"


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
    outcomes = []
    for impl in _native.IMPLEMENTATIONS.values():
        try:
            outcomes.append(impl.pick_bucket(buckets, n))
        except ValueError as e:
            outcomes.append(str(e))
    assert len(set(outcomes)) == 1
