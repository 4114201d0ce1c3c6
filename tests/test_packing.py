"""Host packing: prefix grouping, batch planning, flat arrays; packed scores equal one-by-one."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import load_model
from engine.host import packing, planning
from engine.host.buckets import Buckets, default_buckets
from engine.host.planning import Chunk
from engine.kinds import Layout

BUCKETS = Buckets(block_size=4, tokens=(8, 16, 32), row_divisors=(4,), label_widths=(2, 4))


def test_groups_share_the_longest_prefixes():
    q1, q2 = [1, 2, 3, 4, 5], [1, 2, 9, 9, 9]
    seqs = [q1 + [7], q2 + [8], q1 + [6, 6], [4], q2 + [1]]
    assert planning.group_by_prefix(seqs) == [Chunk(5, (0, 2)), Chunk(5, (1, 4)), Chunk(0, (3,))]


def test_one_group_when_the_common_prefix_saves_more():
    head = [1, 2, 3, 4, 5, 6, 7]
    seqs = [[*head, 8, 10 + i] for i in range(3)] + [[*head, 50, 51]]
    assert planning.group_by_prefix(seqs) == [Chunk(7, (0, 1, 2, 3))]  # 3 * 7 beats 2 * 8
    seqs = [[1, 2, 3, 4, 10 + i] for i in range(6)] + [[1, 2, 3, 9, 9]]
    # 5 * 4 beats 6 * 3
    assert planning.group_by_prefix(seqs) == [Chunk(4, tuple(range(6))), Chunk(0, (6,))]


def test_every_member_keeps_a_suffix_token():
    seqs = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4]]
    assert planning.group_by_prefix(seqs) == [Chunk(2, (0, 1, 2))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=30))
def test_grouping_is_a_valid_partition(seqs):
    groups = planning.group_by_prefix(seqs)
    members = sorted(m for g in groups for m in g.members)
    assert members == list(range(len(seqs)))
    for g in groups:
        first = seqs[g.members[0]][: g.prefix_len]
        assert all(
            seqs[m][: g.prefix_len] == first and len(seqs[m]) > g.prefix_len for m in g.members
        )
        assert g.prefix_len > 0 or len(g.members) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=40),
    st.integers(8, 40),
    st.integers(1, 9),
)
def test_plans_respect_budget_and_rows(seqs, budget, max_rows):
    lengths = [len(s) for s in seqs]
    plans = planning.plan_batches(
        planning.group_by_prefix(seqs), lengths, token_budget=budget, max_rows=max_rows
    )
    seen = sorted(m for plan in plans for c in plan for m in c.members)
    assert seen == list(range(len(seqs)))
    for plan in plans:
        tokens = sum(c.prefix_len + sum(lengths[m] - c.prefix_len for m in c.members) for c in plan)
        rows = sum(len(c.members) for c in plan)
        assert rows <= max_rows
        assert tokens <= budget or rows == 1


def test_pack_lays_out_prefix_then_suffixes_then_padding():
    seqs = [[5, 6, 7, 1], [5, 6, 7, 2, 3], [9, 9, 9]]
    batch, order, *_ = packing.pack(
        seqs, [[0], [1], [2, 3]], [Chunk(3, (0, 1)), Chunk(0, (2,))], BUCKETS
    )
    pad = list(range(9, 16))
    assert order == [0, 1, 2]
    np.testing.assert_array_equal(batch.tokens, [5, 6, 7, 1, 2, 3, 9, 9, 9] + [0] * 7)
    np.testing.assert_array_equal(batch.positions, [0, 1, 2, 3, 3, 4, 0, 1, 2] + [0] * 7)
    np.testing.assert_array_equal(batch.meta.prefix_start, [0] * 6 + [6, 6, 6] + pad)
    np.testing.assert_array_equal(batch.meta.prefix_end, [0, 0, 0, 3, 3, 3, 6, 6, 6] + pad)
    np.testing.assert_array_equal(batch.meta.own_start, [0, 0, 0, 3, 4, 4, 6, 6, 6] + pad)
    np.testing.assert_array_equal(batch.score_rows, [3, 5, 8, 0])
    np.testing.assert_array_equal(batch.label_ids, [[0, 0], [1, 0], [2, 3], [0, 0]])


def test_whole_sequences_see_their_visible_tokens():
    """An encoder's sequences see all of themselves, or their first `visible` tokens: a
    ColBERT query's expansion (the last two of sequence 1) is seen by no token."""
    seqs, labels = [[5, 6, 7], [2, 8, 9, 4, 4]], [[], []]
    chunks = [Chunk(0, (0,)), Chunk(0, (1,))]
    whole = dict(layout=Layout.WHOLE)
    batch, order, *_ = packing.pack(seqs, labels, chunks, BUCKETS, visible=[3, 3], **whole)
    assert order == [0, 1]
    np.testing.assert_array_equal(batch.meta.own_start, [0, 0, 0, 3, 3, 3, 3, 3])
    np.testing.assert_array_equal(batch.meta.own_end, [3, 3, 3, 6, 6, 6, 6, 6])
    np.testing.assert_array_equal(batch.score_rows[:2], [0, 3])
    seen = packing.pack(seqs, labels, chunks, BUCKETS, **whole).inputs.meta.own_end
    np.testing.assert_array_equal(seen[:8], [3, 3, 3, 8, 8, 8, 8, 8])
    with pytest.raises(ValueError, match="laid out whole"):
        packing.pack(seqs, labels, chunks, BUCKETS, visible=[3, 3])


def test_too_long_for_every_bucket_is_an_error():
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        packing.pack([list(range(40))], [[0]], [Chunk(0, (0,))], BUCKETS)


SHAPES = Buckets(block_size=4, tokens=(8, 16, 32, 64), row_divisors=(8, 2), label_widths=(2, 4))


def test_rows_are_tied_to_tokens():
    assert SHAPES.rows_for(8) == (1, 4)
    assert SHAPES.rows_for(64) == (8, 32)
    assert SHAPES.max_rows == 32
    assert default_buckets(8192).rows_for(1024) == (512,)  # one row bucket by default


@pytest.mark.parametrize(
    ("real", "rows", "labels", "expected"),
    [
        (1, 1, 1, (8, 1, 2)),
        (8, 2, 2, (8, 4, 2)),
        (9, 1, 3, (16, 2, 4)),
        (16, 8, 4, (16, 8, 4)),
        (10, 9, 0, (32, 16, 2)),  # 9 rows do not fit T=16 (8 rows at most): bump T
        (5, 20, 1, (64, 32, 2)),
        (64, 32, 4, (64, 32, 4)),
    ],
)
def test_shape_is_the_smallest_that_holds_the_batch(real, rows, labels, expected):
    assert SHAPES.shape(real, rows, labels) == expected


def test_shapes_beyond_the_largest_bucket_are_errors():
    with pytest.raises(ValueError, match="size 65 exceeds the largest bucket 64"):
        SHAPES.shape(65, 1, 1)
    with pytest.raises(ValueError, match="score rows 33 exceeds the largest bucket 32"):
        SHAPES.shape(40, 33, 1)
    with pytest.raises(ValueError, match="5 labels per sequence exceed the largest label width 4"):
        SHAPES.shape(8, 1, 5)


def test_grid_lists_the_programs_to_precompile():
    assert SHAPES.grid(16) == [(8, 1, 2), (8, 4, 2), (16, 2, 2), (16, 8, 2)]
    for max_tokens in (8192, 32768, 40960):
        grid = default_buckets(max_tokens).grid(max_tokens)
        assert len(grid) <= 4 + 4 * 6  # one program a token bucket: <= 1024, then 4 per octave
        assert len(grid) == len(default_buckets(max_tokens).tokens)
        assert len(set(grid)) == len(grid)
        assert all(t % 64 == 0 and t <= max(max_tokens, 128) for t, _, _ in grid)


def test_default_buckets_pad_large_batches_by_at_most_a_fifth():
    tokens = default_buckets(40960).tokens
    assert tokens[:5] == (128, 256, 512, 1024, 1280)
    assert tokens[-1] == 40960 and 8192 in tokens and 12288 in tokens
    for small, large in itertools.pairwise(tokens):
        assert large % 64 == 0
        assert large <= small * 2 if small < 1024 else (large - small) * 5 <= large


def test_plan_splits_a_badly_padded_last_batch():
    # One group: a 40-token prefix and 60 items of 160 more = 9,640 tokens, which one batch
    # would pad to 10,240 (6%): 6,144 + 3,584 (the prefix twice) cost less even with the
    # second batch's overhead; 8,192 + 1,792 would not.
    seqs = [[1] * 40 + [2 + i] * 160 for i in range(60)]
    buckets = default_buckets(16384)
    batches = planning.plan(seqs, token_budget=16384, buckets=buckets)
    padded = [buckets.shape(planning.real_tokens(b, seqs), 1, 1)[0] for b in batches]
    assert padded == [6144, 3584]
    assert sorted(m for b in batches for c in b for m in c.members) == list(range(60))
    # 63 items = 10,120 tokens pad to 10,240 (1.2%): one batch.
    seqs = [[1] * 40 + [2 + i] * 160 for i in range(63)]
    assert len(planning.plan(seqs, token_budget=16384, buckets=buckets)) == 1


def _split_by_trying_each_budget(batch, seqs, buckets, cached):
    """The last batch's split as `plan` defines it, by planning it at every candidate budget."""

    def cost(batches):
        padded = sum(buckets.shape(planning.real_tokens(b, seqs, cached), 1, 1)[0] for b in batches)
        return padded + planning.BATCH_OVERHEAD_TOKENS * len(batches)

    real = planning.real_tokens(batch, seqs, cached)
    lengths = [len(s) for s in seqs]
    best, best_cost = [batch], cost([batch])
    for budget in (t for t in buckets.tokens if real // 2 <= t < real):
        limits = dict(token_budget=budget, max_rows=buckets.max_rows, cached=cached)
        split = planning.plan_batches(batch, lengths, **limits)
        if len(split) == 2 and cost(split) < best_cost:
            best, best_cost = split, cost(split)
    return best


def _random_batch(rng, most_tokens):
    """Chunks of random prefixes and suffixes, and cached prefix tokens of some first members,
    laying out at most `most_tokens`."""
    while True:
        seqs, chunks = [], []
        for _ in range(rng.integers(1, 6)):
            prefix, members = int(rng.integers(0, 2000)), []
            for _ in range(rng.integers(1, 12)):
                members.append(len(seqs))
                seqs.append([1] * (prefix + int(rng.integers(1, 1500))))
            chunks.append(Chunk(prefix, tuple(members)))
        cached = {c.members[0]: int(rng.integers(0, c.prefix_len + 1)) for c in chunks[::2]}
        if planning.real_tokens(chunks, seqs, cached) <= most_tokens:
            return chunks, seqs, cached


def test_the_last_batch_splits_as_planning_it_at_each_budget_would():
    rng = np.random.default_rng(0)
    tokens = default_buckets(16384).tokens
    ways = set()
    for row_divisor in (64, 1024):  # 256 rows at most, or 16: then rows cut batches too
        buckets = Buckets(block_size=64, tokens=tokens, row_divisors=(row_divisor,))
        for _ in range(200):
            chunks, seqs, cached = _random_batch(rng, tokens[-1])
            expected = _split_by_trying_each_budget(chunks, seqs, buckets, cached)
            assert planning._split_last(chunks, seqs, buckets, cached) == expected
            ways.add((row_divisor, len(expected)))
    assert ways == {(64, 1), (64, 2), (1024, 1), (1024, 2)}  # both kept whole and split, each way


def test_pack_pads_to_the_bucket_shape_with_a_full_width_schedule():
    seqs = [[1] * 6 + [i] for i in range(10)]  # prefix 6 once, then 10 one-token suffixes
    batch, order, *_ = packing.pack(seqs, [[7]] * 10, [Chunk(6, tuple(range(10)))], SHAPES)
    assert order == list(range(10))
    assert batch.tokens.shape == (32,) and batch.label_ids.shape == (16, 2)
    assert batch.meta.block_kv.shape == (8, 8)
    np.testing.assert_array_equal(batch.score_rows[:10], np.arange(6, 16))
    np.testing.assert_array_equal(batch.label_ids[:, 0], [7] * 10 + [0] * 6)


def test_pack_rejects_too_many_labels():
    with pytest.raises(ValueError, match="5 labels"):
        packing.pack([[1, 2]], [[1, 2, 3, 4, 5]], [Chunk(0, (0,))], SHAPES)


WORDS = "alpha beta gamma delta river stone light paper green quick slow house".split()


def _texts(rng, n, lo, hi):
    return [" ".join(rng.choice(WORDS, rng.integers(lo, hi))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints):
    return load_model(tiny_checkpoints["llama-untied"], dtype="float32")


@pytest.mark.parametrize("item_first", [False, True])
def test_packed_equals_one_by_one(tiny_llama, item_first):
    rng = np.random.default_rng(1)
    query = "Query: is the river near the stone house? Items follow."
    items = _texts(rng, 64, 1, 30)
    labels = [3, 40, 200]
    packed = tiny_llama.score(query, items, labels, item_first=item_first)
    single = [tiny_llama.score(query, [it], labels, item_first=item_first)[0] for it in items]
    seqs = tiny_llama.sequences(query, items, item_first=item_first)
    lp_packed = tiny_llama.row_outputs(seqs, [labels] * len(seqs))
    lp_single = np.concatenate([tiny_llama.row_outputs([s], [labels]) for s in seqs])
    np.testing.assert_allclose(lp_packed, lp_single, atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed, single, rtol=1e-4, atol=0)


def test_several_groups_and_split_batches_equal_one_by_one(tiny_checkpoints):
    model = load_model(tiny_checkpoints["qwen3"], dtype="float32", token_budget=256)
    rng = np.random.default_rng(2)
    queries = [list(rng.integers(0, 384, n)) for n in (40, 3, 90)]
    seqs = [
        [int(t) for t in q] + list(map(int, rng.integers(0, 384, rng.integers(1, 25))))
        for q in queries
        for _ in range(12)
    ]
    seqs += [list(map(int, rng.integers(0, 384, n))) for n in (1, 2, 200)]
    order = rng.permutation(len(seqs))
    seqs = [seqs[i] for i in order]
    labels = [[int(x) for x in rng.integers(0, 384, rng.integers(1, 4))] for _ in seqs]
    assert (
        len(
            planning.plan_batches(
                planning.group_by_prefix(seqs),
                [len(s) for s in seqs],
                token_budget=256,
                max_rows=10**6,
            )
        )
        > 2
    )
    packed = model.row_outputs(seqs, labels)
    for i, (s, lab) in enumerate(zip(seqs, labels, strict=True)):
        single = model.row_outputs([s], [lab])[0]
        np.testing.assert_allclose(packed[i, : len(lab)], single, atol=1e-5, rtol=0)
