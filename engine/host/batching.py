"""The batches that score a window of sequences (DESIGN §3, §3b): planned when first asked,
each packed as it is taken, so a caller can dispatch one batch while the next is built.

With a KV cache, what is cached shortens the plan, work longer than a batch is chunked
(`engine.host.chunking`), and each chunk's context is made against the cache as its batch is packed.
A batch whose chunks expect pages that a running batch is still writing is not packed yet: the
generator yields None, and the caller asks again once its running batches are done, sending
True when none is running (the pages it waited for were lost or never fit: the batch is then
packed with what is cached, computing the rest).
"""

from collections.abc import Iterator, Sequence

from engine.host import chunking, packing, planning
from engine.host.buckets import Buckets
from engine.host.kv_cache import KVCache
from engine.host.packing import PackedBatch
from engine.host.planning import Tokens
from engine.kinds import Layout


def batches(
    seqs: Sequence[Tokens],
    labels: Sequence[Sequence[int]],
    *,
    token_budget: int,
    buckets: Buckets,
    cache: KVCache | None = None,
    layout: Layout = Layout.SHARED,
    visible: Sequence[int] | None = None,
) -> Iterator[PackedBatch | None]:
    """Every sequence scored once. Without `cache` this never yields None. With it, the caller
    commits or aborts each batch's contexts when the batch is done, and answers a None with
    `send(idle)` once its running batches are done (see the module docstring). `layout`: how
    the sequences are laid out (`planning.plan`); only a shared one is cached. `visible`: each
    sequence's tokens its tokens see (`packing.pack`; None: all)."""
    if cache is None:
        plan = planning.plan(seqs, token_budget=token_budget, buckets=buckets, layout=layout)
        for chunks in plan:
            yield packing.pack(seqs, labels, chunks, buckets, layout=layout, visible=visible)
        return
    if not layout.shares:
        raise ValueError("sequences packed alone are not cached: nothing is shared")
    every, planned, reused = _plan(seqs, token_budget, buckets, cache)
    every_labels = list(labels) + [[]] * (len(every) - len(seqs))
    pack = lambda chunks, contexts: _packed(
        cache, every, every_labels, chunks, contexts, buckets, reused, len(seqs)
    )
    for batch in planned:
        contexts = cache.contexts(every, batch.chunks)
        while not _ready(contexts, batch.expected):
            _abort(cache, contexts)
            idle = yield None
            contexts = cache.contexts(every, batch.chunks)
            if idle:  # nothing running will write what it waits for: go on with what is there
                break
        if packing.laid_out(every, batch.chunks, contexts) <= buckets.tokens[-1]:
            yield pack(batch.chunks, contexts)
            continue
        # Less was cached than planned for (evicted since, or no room): plan these chunks
        # again assuming nothing cached, so that each batch fits whatever it finds.
        _abort(cache, contexts)
        lengths = [len(s) for s in every]
        limits = dict(token_budget=token_budget, max_rows=buckets.max_rows)
        for chunks in planning.plan_batches(batch.chunks, lengths, **limits):
            yield pack(chunks, cache.contexts(every, chunks))


def _packed(cache, seqs, labels, chunks, contexts, buckets, reused, scored) -> PackedBatch:
    """`packing.pack` of a planned batch; its cache hits recorded, or its contexts aborted."""
    try:
        cached = packing.Cached(contexts, cache.page_size, reused)
        packed = packing.pack(seqs, labels, chunks, buckets, cached, scored=scored)
    except Exception:
        _abort(cache, contexts)
        raise
    _record(cache, seqs, chunks, contexts, reused, scored)
    return packed


def _abort(cache: KVCache, contexts) -> None:
    for ctx in filter(None, contexts):
        cache.abort(ctx)


def _plan(
    seqs: Sequence[Tokens], budget: int, buckets: Buckets, cache: KVCache
) -> tuple[list[Tokens], list[chunking.Planned], dict[int, int]]:
    """The pieces of chunked groups, then every sequence with what it will find cached; and
    what each sequence found cached before this plan."""
    groups = planning.group_by_prefix(seqs)
    cached = [cache.peek(seqs[g.members[0]][: chunking.cacheable(g, seqs)]) for g in groups]
    extra, planned, expect = chunking.pieces(
        seqs, groups, cached, budget=budget, page=cache.page_size, capacity=cache.capacity
    )
    have = {m: max(c, expect[m]) for g, c in zip(groups, cached, strict=True) for m in g.members}
    for chunks in planning.plan(
        seqs, token_budget=budget, buckets=buckets, groups=groups, cached=have
    ):
        planned.append(chunking.Planned(chunks, [expect[c.members[0]] for c in chunks]))
    reused = {m: c for g, c in zip(groups, cached, strict=True) for m in g.members}
    return [*seqs, *extra], planned, reused


def _record(cache: KVCache, seqs, chunks, contexts, reused, scored: int) -> None:
    """Cache hits and misses of the chunks that score: what they read that was cached before
    their plan, and the rest of their cacheable prefix (pieces are neither)."""
    for chunk, ctx in zip(chunks, contexts, strict=True):
        first = chunk.members[0]
        if first >= scored:
            continue
        hit = min(ctx.cached, reused[first]) if ctx is not None else 0
        cache.record(hit, chunking.cacheable(chunk, seqs) - hit)


def _ready(contexts: Sequence, expected: Sequence[int]) -> bool:
    """Whether every chunk finds at least the cached tokens it expects."""
    return all(
        want == 0 or (ctx is not None and ctx.cached >= want)
        for ctx, want in zip(contexts, expected, strict=True)
    )
