"""Tokenizer actor: batching, caching, validation that fails only the offending request."""

import math

import numpy as np
import pytest
import trio

from engine import tokenizer_actor
from engine.errors import RejectKind
from engine.host.inputs import as_lists
from engine.messages import Cancel, Rejected, ScoreRequest, Tokenized
from engine.text import native_tokenizer
from engine.text.native_tokenizer import NativeTokenizer, ReferenceTokenizer
from engine.tokenizer_actor import TokenCache, TokenizerState, run
from tests.conftest import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def state(tok, **kw):
    return TokenizerState(
        tok,
        vocab_size=kw.get("vocab", 384),
        max_len=kw.get("max_len", 64),
        max_items=4,
        max_labels=3,
        cache_size=kw.get("cache", 8),
    )


def test_texts_are_encoded_natively_with_the_references_ids(tok):
    requests = [req(0, "Is it?", [" yes", " no 42 \n\n"]), req(1, "¿Sí?", ["  ünï 😀"])]
    native, reference = (
        state(tok),
        TokenizerState(
            tok, vocab_size=384, max_len=64, max_items=4, max_labels=3, cache_size=8, native=False
        ),
    )
    assert isinstance(native.encoder, NativeTokenizer) == (native_tokenizer._byte_bpe is not None)
    assert isinstance(reference.encoder, ReferenceTokenizer)
    ours, theirs = native.process(requests), reference.process(requests)
    assert [as_lists(m.sequences) for m in ours] == [m.sequences for m in theirs]
    assert theirs[1].sequences == [tok.encode("¿Sí?  ünï 😀").ids]


def test_a_pair_models_texts_are_wrapped_natively_once(tok):
    from engine.host.pairs import PairEncoder

    pairs = PairEncoder(tok, vocab_size=384, type_vocab_size=1)
    pair_state = TokenizerState(
        tok, vocab_size=384, max_len=64, max_items=4, max_labels=3, cache_size=8, pairs=pairs
    )
    assert isinstance(pair_state.encoder, ReferenceTokenizer)  # joined texts: none to encode
    assert isinstance(pairs.texts, NativeTokenizer) == (native_tokenizer._byte_bpe is not None)


def req(i, query, items, labels=(1,), item_first=False):
    return ScoreRequest(
        id=i,
        query=query,
        items=items,
        label_token_ids=list(labels),
        item_first=item_first,
        arrived=0.0,
    )


def test_text_and_ids_follow_score_semantics(tok):
    out = state(tok).process(
        [
            req(0, "Is it?", [" yes", " no"]),
            req(1, [5, 6], [[7], [8, 9]], item_first=True),
        ]
    )
    assert [type(m) for m in out] == [Tokenized, Tokenized]
    assert as_lists(out[0].sequences) == [tok.encode("Is it? yes").ids, tok.encode("Is it? no").ids]
    assert [s.tolist() for s in out[1].sequences] == [[7, 5, 6], [8, 9, 5, 6]]
    assert all(s.dtype == np.int32 for s in out[1].sequences)  # ids run as arrays, not lists
    assert out[0].labels == [1] and out[0].tokenize_s > 0


@pytest.mark.parametrize(
    "query, items, field",
    [
        ([5, 384], [[7]], "query"),
        ([5], [[7], [8, -1], [384]], "items[1]"),
        ([5], [[7], [9], [2**70]], "items[2]"),
        ([2**64], [[7]], "query"),
    ],
)
def test_ids_outside_the_vocabulary_name_their_field(tok, query, items, field):
    (out,) = state(tok).process([req(0, query, items)])
    assert isinstance(out, Rejected) and (out.kind, out.field) == (RejectKind.INVALID, field)
    assert out.message == "token id outside the vocabulary [0, 384)"


def test_texts_are_checked_against_a_model_vocabulary_smaller_than_the_tokenizers(tok):
    assert state(tok).text_ids_fit and not state(tok, vocab=200).text_ids_fit
    high = next(t for t in ("zebra", "quixotic", "xylophone") if max(tok.encode(t).ids) >= 200)
    (out,) = state(tok, vocab=200).process([req(0, "a", ["b", high])])
    assert isinstance(out, Rejected) and out.field == "items[1]"
    assert out.message == "token id outside the vocabulary [0, 200)"


def test_bad_requests_fail_alone_with_their_kind(tok):
    out = state(tok).process(
        [
            req(0, "q", [[1]]),
            req(1, "q", ["fine"]),
            req(2, "q", ["a"] * 5),
            req(3, [1] * 60, [[2] * 10]),
            req(4, "q", ["x"], labels=[384]),
            req(5, "", [""]),  # no token at all: the query and item are both empty
            req(6, "q", ["x"], labels=[1, 2, 3, 4]),
        ]
    )
    kinds = [(m.id, m.kind, m.field) if isinstance(m, Rejected) else (m.id, "ok") for m in out]
    invalid, too_large = RejectKind.INVALID, RejectKind.TOO_LARGE
    assert kinds == [
        (0, invalid, "query/items"),
        (1, "ok"),
        (2, too_large, "items"),
        (3, too_large, "items[0]"),
        (4, invalid, "label_token_ids"),
        (5, invalid, "items[0]"),
        (6, too_large, "label_token_ids"),
    ]
    assert out[6].message == "4 labels exceed the limit of 3"
    assert out[3].message == (
        "sequence of 70 tokens exceeds the model context of 64. "
        "Please reduce the length of the input."
    )
    assert out[2].message == "5 items exceed the limit of 4"


def test_cache_counts_hits_and_stays_bounded(tok):
    s = state(tok, cache=3)
    s.process([req(0, "q", ["a", "b"])])
    assert (s.cache.hits, s.cache.misses) == (0, 2)
    s.process([req(1, "q", ["a", "c", "d"])])
    assert (s.cache.hits, s.cache.misses) == (1, 4)
    assert list(s.cache.entries) == ["qa", "qc", "qd"]


def test_lru_evicts_the_least_recent():
    cache = TokenCache(2)
    cache.put("a", [1])
    cache.put("b", [2])
    assert cache.get("a") == [1]
    cache.put("c", [3])
    assert cache.get("b") is None and cache.get("a") == [1] and cache.get("c") == [3]


def test_a_cached_array_is_a_copy_not_a_view_of_its_batch():
    batch = np.arange(10_000, dtype=np.int32)
    cache = TokenCache(2)
    cache.put("a", batch[3:6])
    kept = cache.get("a")
    assert kept.tolist() == [3, 4, 5] and kept.base is None  # the 40 kB buffer is not kept
    batch[3] = -1
    assert cache.get("a").tolist() == [3, 4, 5]
    none = TokenCache(0)
    none.put("a", [1])
    assert none.get("a") is None and not none.entries


def test_run_loop_forwards_one_message_per_request(tok):
    async def main():
        to_actor, inbox = trio.open_memory_channel(math.inf)
        out_send, out = trio.open_memory_channel(math.inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(run, state(tok), inbox, out_send)
            for i in range(10):
                to_actor.send_nowait(req(i, "q", [f"item {i}"] if i % 4 else [[1]]))
            got = [await out.receive() for _ in range(10)]
            nursery.cancel_scope.cancel()
        assert [m.id for m in got] == list(range(10))
        assert [isinstance(m, Rejected) for m in got] == [i % 4 == 0 for i in range(10)]

    trio.run(main)


@pytest.mark.parametrize(
    ("query", "items", "threads"),
    [
        ("q", ["a small item"], 0),  # on the loop: a thread's round trip costs more
        ("q" * 1000, ["a", "b", "c"], 1),  # the query counts once per item: 3,004 characters
        ("q", ["x" * 3000], 1),
        ([1] * 1500, [[3], [4]], 1),
        ("q", 5, 1),  # malformed, of no size: rejected by the thread, not raised sizing it
        (None, [7, None, {"a": 1}], 0),  # malformed and sized as nothing: on the loop
    ],
)
def test_only_a_large_batch_is_tokenised_in_a_worker_thread(
    tok, monkeypatch, query, items, threads
):
    calls = []
    real = trio.to_thread.run_sync

    async def counted(fn, *args, **kw):
        calls.append(fn)
        return await real(fn, *args, **kw)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)

    async def main():
        to_actor, inbox = trio.open_memory_channel(math.inf)
        out_send, out = trio.open_memory_channel(math.inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(run, state(tok, max_len=4096), inbox, out_send)
            to_actor.send_nowait(req(0, query, items))
            got = await out.receive()
            nursery.cancel_scope.cancel()
        return got

    got = trio.run(main)
    assert len(calls) == threads
    malformed = not isinstance(items, list) or None in items
    assert type(got) is (Rejected if malformed else Tokenized) and got.id == 0


def test_the_inline_limit_counts_every_request_drained_together():
    small = ScoreRequest(id=0, query="q" * 9, items=["x" * 90], label_token_ids=[1], arrived=0.0)
    n = tokenizer_actor.INLINE_WORK // 99
    assert tokenizer_actor._small([small] * n + [Cancel(id=0)])
    assert not tokenizer_actor._small([small] * (n + 1))


def test_a_cancel_follows_its_request(tok):
    out = state(tok).process([req(0, "q", ["a"]), Cancel(id=0), req(1, "q", ["b"]), Cancel(id=7)])
    assert [(type(m), m.id) for m in out] == [
        (Tokenized, 0),
        (Cancel, 0),
        (Tokenized, 1),
        (Cancel, 7),
    ]
