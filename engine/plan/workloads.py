"""The bench's W1 and W2 requests as token-id sequences, laid out in batches by the engine's own
planner with its KV cache (so sequences longer than a batch are chunked as the engine chunks
them): what a plan estimates is what the engine would run."""

from typing import NamedTuple

import numpy as np

from engine.device.kv_pool import DEFAULT_PAGE_SIZE, DEFAULT_POOL_TOKENS
from engine.host import batching
from engine.host.buckets import Buckets
from engine.host.kv_cache import KVCache
from engine.host.packing import PackedBatch

LABELS = 2  # " yes" / " no"


class Workload(NamedTuple):
    description: str
    sequences: list[list[int]]  # one per scored item


def w1(vocab: int, seed: int = 0) -> Workload:
    """One 25-token query and 64 documents of 130-230 tokens, each followed by a 5-token
    suffix: `python -m bench w1`'s request."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(100, vocab, n).tolist()
    query, suffix = ids(25), ids(5)
    docs = [ids(int(n)) for n in rng.integers(130, 231, 64)]
    return Workload(
        "W1: 25-token query, 64 documents of 130-230 tokens", [query + d + suffix for d in docs]
    )


def w2(vocab: int, seed: int = 0) -> Workload:
    """A 2,000-token prompt and 500 items of 20 tokens: `python -m bench w2`'s request."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, vocab, 2000).tolist()
    items = rng.integers(100, vocab, (500, 20)).tolist()
    return Workload("W2: 2,000-token prompt, 500 items of 20 tokens", [prompt + i for i in items])


def batches(work: Workload, buckets: Buckets, token_budget: int) -> list[PackedBatch]:
    """The packed batches the engine's planner makes of the workload, sent as one request to an
    engine with an empty default-sized KV cache, each batch done before the next."""
    seqs = work.sequences
    labels = [[1, 2][:LABELS]] * len(seqs)
    pages = DEFAULT_POOL_TOKENS // DEFAULT_PAGE_SIZE
    cache = KVCache(pages, DEFAULT_PAGE_SIZE, max_context=buckets.max_context)
    planned = batching.batches(
        seqs, labels, token_budget=token_budget, buckets=buckets, cache=cache
    )
    out, idle = [], None
    while (batch := next_or_none(planned, idle)) is not False:
        idle = batch is None  # it waits for pages: every earlier batch is done by now
        if batch is not None:
            for context in filter(None, batch.contexts):
                cache.commit(context)
            out.append(batch)
    return out


def next_or_none(planned, idle):
    """The planner's next batch (None: it waits for running batches), or False at the end."""
    try:
        return planned.send(idle)
    except StopIteration:
        return False
