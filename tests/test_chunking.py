"""Chunked prefill: sequences and shared prefixes far longer than the token budget are computed
over successive batches and score as one pass over the whole sequence does (tiny model, f32,
a 64-token budget, 1,000+ token sequences)."""

import pytest

from engine import EngineConfig, load_model
from engine.host.chunking import piece_bounds
from tests.conftest import write_tiny_checkpoint
from tests.test_api_support import assert_scores
from tests.test_engine_properties import Request, run_in_engine, submit
from tests.test_kv_cache import settled

CONTEXT = 2048
BUDGET = 64


def test_piece_bounds_cover_whole_pages_within_the_budget():
    assert piece_bounds(0, 100, 64, 16, 1024) == [(0, 48), (48, 96)]  # 48 + the unread last token
    assert piece_bounds(32, 100, 64, 16, 1024) == [(32, 80), (80, 96)]
    assert piece_bounds(96, 100, 64, 16, 1024) == []  # the rest is under a page: nothing to chunk
    assert piece_bounds(0, 100, 16, 16, 1024) == []  # a budget of one page leaves no room
    assert piece_bounds(0, 100, 64, 16, 64) == [(0, 48), (48, 64)]  # no further than the pool


@pytest.fixture(scope="module")
def long_path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("long")
    return str(write_tiny_checkpoint(root, "qwen3", max_position_embeddings=CONTEXT))


@pytest.fixture(scope="module")
def one_pass(long_path):
    """The offline scorer with a budget that holds every sequence whole: one pass each."""
    return load_model(long_path, dtype="float32", token_budget=CONTEXT, progress=False)


def run_chunked(path, reference, property_fn, **overrides):
    config = EngineConfig(
        model=path,
        dtype="float32",
        token_budget=BUDGET,
        block_size=16,
        kv_page_size=16,
        compile_cache_dir=None,
        progress=False,
        precompile=False,
        **overrides,
    )
    run_in_engine(property_fn, path, config=config, reference=reference, check=settled)


LONG_IDS = [(i * 7 + 3) % 290 for i in range(1100)]
LONG_TEXT = " ".join(f"word{i % 97} and more" for i in range(110))  # about 1,200 tokens


@pytest.mark.parametrize("item_first", [False, True])
def test_long_sequences_score_as_one_pass(long_path, one_pass, item_first):
    requests = [
        Request(LONG_IDS, [[5, 6], [7], [8, 9, 10]], [1, 2], False, item_first),  # long prefix
        Request([11, 12], [LONG_IDS[:1030]], [3], False, item_first),  # one long item
        Request(LONG_TEXT, [" yes", " no"], [4, 5], True, item_first),  # text
    ]
    batches = {}

    def run(engine, reference):
        for r in requests:  # one at a time: each is chunked on its own
            seqs = reference.sequences(r.query, r.items, item_first=r.item_first)
            assert max(map(len, seqs)) > 1000
            before = engine.stats().batches
            result = submit(engine, [r])[0].unwrap()
            batches[len(batches)] = engine.stats().batches - before
            assert_scores(result.scores, r.reference(reference))
            assert result.cached_tokens == 0  # its own pieces are not cache hits

    run_chunked(long_path, one_pass, run)
    assert all(n >= 1000 // BUDGET for n in batches.values())  # chunked, not one big batch


def test_sliding_windows_chunked_score_as_one_pass(tmp_path_factory):
    """Gemma 3's 16-key windows over chunked pieces: a window reaching back into the pages of
    earlier pieces reads what one pass over the whole sequence does."""
    root = tmp_path_factory.mktemp("windowed")
    path = str(write_tiny_checkpoint(root, "gemma3", max_position_embeddings=CONTEXT))
    reference = load_model(path, dtype="float32", token_budget=CONTEXT, progress=False)
    assert reference.model_config.window == 16
    requests = [
        Request(LONG_IDS[:700], [[5, 6], [7], [8, 9, 10]], [1, 2]),
        Request([11, 12], [LONG_IDS[:500]], [3]),
    ]

    def run(engine, reference):
        for r in requests:
            before = engine.stats().batches
            result = submit(engine, [r])[0].unwrap()
            assert engine.stats().batches - before >= 500 // BUDGET
            assert_scores(result.scores, r.reference(reference))

    run_chunked(path, reference, run)


def test_chunked_requests_mixed_with_others(long_path, one_pass):
    requests = [
        Request(LONG_IDS, [[5], [6]], [1, 2]),
        Request([1, 2, 3], [[4], [5, 6]], [7]),
        Request(LONG_IDS[:700], [[9]], [1]),
        Request([8] * 40, [[1]] * 5, [2, 3]),
    ]

    def run(engine, reference):
        for r, got in zip(requests, submit(engine, requests), strict=True):
            assert_scores(got.unwrap().scores, r.reference(reference))
        # the long prompt again: now read from the cache
        again = submit(engine, requests[:1])[0].unwrap()
        assert again.cached_tokens == 2 * (len(LONG_IDS) // 16 * 16)
        assert_scores(again.scores, requests[0].reference(reference))

    run_chunked(long_path, one_pass, run)


def test_a_pool_smaller_than_the_sequence_chunks_what_it_holds(long_path, one_pass):
    """Pieces stop at what the pool holds; the rest is computed reading what they wrote."""
    pool_tokens = 256
    kv_bytes = one_pass.model_config.kv_bytes_per_token(4) * pool_tokens
    lone = Request([11, 12], [LONG_IDS[:1030]], [3])  # one 1,032-token sequence
    group = Request(LONG_IDS, [[5, 6], [7]], [1, 2])  # a 1,100-token prefix, two members
    laid_out = []

    def run(engine, reference):
        assert engine.program.kv.tokens == pool_tokens
        for r in (lone, group):
            engine.flush_cache()
            before = engine.stats()
            result = submit(engine, [r])[0].unwrap()
            after = engine.stats()
            batches, tokens = after.batches - before.batches, after.real_tokens - before.real_tokens
            laid_out.append((batches, tokens))
            assert_scores(result.scores, r.reference(reference))

    run_chunked(long_path, one_pass, run, kv_cache_bytes=kv_bytes)
    pieces = (6, 5 * 49 + 17)  # 256 tokens in pieces of 48 + 1 laid out, the last 16 + 1
    # the lone sequence: its last 776 tokens in one batch reading the 256 the pieces wrote
    assert laid_out[0] == (pieces[0] + 1, pieces[1] + 1032 - 256)
    # the group cannot share its uncached rest (no room to write it): each member reads the
    # 256 cached tokens and computes its rest, in a batch of its own as without a cache
    assert laid_out[1] == (pieces[0] + 2, pieces[1] + 1102 - 256 + 1101 - 256)
