"""The host side of the KV cache (DESIGN §3b): which pool pages hold which token prefixes, and
what each chunk of a batch reads from and writes to the pool.

A chunk's cacheable prefix is what its members share (a singleton's whole sequence but its
scored last token). When the batch is packed, the prefix is matched in the radix tree
(`_native.PrefixCache`); the match is pinned, pages are allocated for the rest, and the batch
reads the cached part and writes the rest. When the batch is done its whole pages are inserted
and the pins released (`commit`), or everything is handed back (`abort`). Where pages or room in
the context region run out the chunk is computed as without a cache: the cache never fails a
request and never changes a score.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import _native
from engine.host.chunking import cacheable
from engine.host.packing import Context
from engine.host.planning import Chunk, Tokens

ROOT = 0  # the tree's root node: pinning it pins nothing that can be evicted


@dataclass
class CacheStats:
    hit_tokens: int = 0  # prefix tokens read from the pool instead of computed
    miss_tokens: int = 0  # prefix tokens computed (and written when pages allowed)


class KVCache:
    """The prefix tree over the pool's pages, and the contexts of planned and running batches.

    `max_context` bounds one batch's context region (the largest compiled bucket).
    """

    def __init__(self, num_pages: int, page_size: int, *, max_context: int):
        self.tree = _native.PrefixCache(num_pages, page_size)
        self.page_size = page_size
        self.max_context = max_context
        self.num_pages = num_pages
        self.stats = CacheStats()
        self.epoch = 0  # bumped by `reset`: contexts of an older epoch refer to lost pages

    @property
    def capacity(self) -> int:
        """The most cached tokens one chunk can read: the pool, bounded by `max_context`."""
        return min(self.num_pages * self.page_size, self.max_context)

    def peek(self, tokens: Tokens) -> int:
        """How many leading tokens of `tokens` the cache holds now (whole pages)."""
        return self.tree.match(tokens)[1]

    def contexts(self, seqs: Sequence[Tokens], chunks: Sequence[Chunk]) -> list[Context | None]:
        """Plan each chunk of one batch against the cache (pins and allocates: every context
        returned must be passed to `commit` or `abort`)."""
        room, out = self.max_context, []
        for chunk in chunks:
            ctx = self._context(seqs, chunk, room)
            room -= len(ctx.read_pages) * self.page_size if ctx else 0
            out.append(ctx)
        return out

    def _context(self, seqs: Sequence[Tokens], chunk: Chunk, room: int) -> Context | None:
        first = seqs[chunk.members[0]]
        prefix = cacheable(chunk, seqs)
        if prefix < self.page_size:
            return None  # nothing a page could hold
        reading = self._reading(first, prefix, len(chunk.members), room)
        return reading or self._writing(first, prefix)

    def record(self, hit: int, miss: int) -> None:
        """Count a chunk's cacheable prefix tokens read from the pool and computed."""
        self.stats.hit_tokens += hit
        self.stats.miss_tokens += miss

    def _reading(self, first: Tokens, prefix: int, members: int, room: int) -> Context | None:
        """Read the cached part of the prefix and write the rest, when it fits. Without room
        for the rest, read the cached part when that costs less than computing the prefix:
        each member then computes the uncached rest of the prefix itself."""
        node, cached, pages = self.tree.match(first[:prefix])
        if not cached or len(pages) * self.page_size > room:
            return None
        self.tree.pin(node)  # before allocating: allocation may evict
        written = -(-(prefix - cached) // self.page_size)  # the last page may be partial
        fits = (len(pages) + written) * self.page_size <= room
        fresh = self.tree.allocate(written) if fits else None
        if fresh is not None:
            reads = np.concatenate([pages, fresh]).astype(np.int32)
            return Context(cached, prefix, reads, fresh, node, self.epoch, first)
        if members * (prefix - cached) < prefix:
            pages = np.asarray(pages, np.int32)
            return Context(cached, cached, pages, np.zeros(0, np.int32), node, self.epoch, first)
        self.tree.unpin(node)
        return None

    def _writing(self, first: Tokens, prefix: int) -> Context | None:
        """Compute the whole prefix and write its whole pages (nothing here reads them)."""
        fresh = self.tree.allocate(prefix // self.page_size)
        if fresh is None:
            return None
        return Context(0, prefix, np.zeros(0, np.int32), fresh, ROOT, self.epoch, first)

    def commit(self, ctx: Context) -> None:
        """The batch that planned `ctx` succeeded: its chunk's whole prefix pages join the tree;
        a partial last page is freed."""
        if ctx.epoch != self.epoch:
            return
        whole = ctx.prefix // self.page_size
        cached_pages = ctx.read_pages[: ctx.cached // self.page_size]
        pages = np.concatenate([cached_pages, ctx.write_pages]).astype(np.int32)
        self.tree.insert(ctx.sequence[: whole * self.page_size], pages[:whole])
        self.tree.release(pages[whole:])
        self._unpin(ctx.node)

    def abort(self, ctx: Context) -> None:
        """The batch that planned `ctx` failed or was dropped: hand its pages and pin back."""
        if ctx.epoch != self.epoch:
            return
        self.tree.release(ctx.write_pages)
        self._unpin(ctx.node)

    def hold(self, tokens: Tokens) -> int:
        """Pin the longest cached prefix of `tokens` (a queued request's) so that it stays until
        `let_go`; returns the node to let go of."""
        node, _, _ = self.tree.match(tokens)
        if node != ROOT:
            self.tree.pin(node)
        return node

    def let_go(self, node: int, epoch: int) -> None:
        """Release a `hold` made in `epoch`."""
        if epoch == self.epoch:
            self._unpin(node)

    def _unpin(self, node: int) -> None:
        if node != ROOT:
            self.tree.unpin(node)

    def reset(self) -> None:
        """Forget every page (the device lost the pool, or a flush); older contexts and holds
        become void. Pages a planned batch holds may be handed out again: batches run in order,
        so it writes and reads them before any later batch does."""
        self.tree.clear()
        self.epoch += 1


def runner_caches(pools: Sequence[tuple[int, int]], *, max_context: int) -> list[KVCache | None]:
    """A cache for each runner's pool of (pages, page size); None where a runner has no pages."""
    return [
        KVCache(pages, page_size, max_context=max_context) if pages else None
        for pages, page_size in pools
    ]


def reset_all(caches: Sequence[KVCache | None]) -> None:
    """Forget every cached prefix of every runner."""
    for cache in filter(None, caches):
        cache.reset()


def counters(caches: Sequence[KVCache | None]) -> dict[str, int]:
    """The runners' cache counters summed (`EngineStats` fields); empty without a cache."""
    caches = [cache for cache in caches if cache is not None]
    if not caches:
        return {}
    trees = [cache.tree for cache in caches]
    return {
        "prefix_cache_hit_tokens": sum(cache.stats.hit_tokens for cache in caches),
        "prefix_cache_miss_tokens": sum(cache.stats.miss_tokens for cache in caches),
        "kv_pages_evicted": sum(tree.evicted for tree in trees),
        "kv_pages_used": sum(tree.num_pages - tree.free_pages for tree in trees),
        "kv_pages_free": sum(tree.free_pages for tree in trees),
    }
