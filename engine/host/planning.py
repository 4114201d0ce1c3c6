"""Which sequences go in which batch (DESIGN §3): sequences grouped by shared token prefix, the
groups split into batches under a token budget and a row limit, and the last batch split in two
when that costs less. `engine.host.packing` lays each batch out."""

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

import _native
from _native import pick_bucket
from engine.host.buckets import Buckets
from engine.kinds import Layout

Tokens = Sequence[int]


class Chunk(NamedTuple):
    """Sequences `members` sharing their first `prefix_len` tokens, placed in one batch."""

    prefix_len: int
    members: tuple[int, ...]


def group_by_prefix(seqs: Sequence[Tokens]) -> list[Chunk]:
    """Partition sequences into groups sharing a token prefix, maximising the tokens saved.

    On a radix tree of the sequences, the sequences below each node either stay one group
    (saving `(n - 1) * depth` tokens) or split among the node's children, whichever saves more.
    Every member keeps at least one suffix token, because the scored position is a sequence's
    last token. Groups are ordered by their first member; ungrouped sequences are singletons.
    """
    return [Chunk(p, members) for p, members in _native.group_by_prefix(seqs)]


def plan_batches(
    groups: Sequence[Chunk],
    lengths: Sequence[int],
    *,
    token_budget: int,
    max_rows: int,
    cached: Mapping[int, int] | None = None,
) -> list[list[Chunk]]:
    """Split groups into batches of at most `token_budget` tokens and `max_rows` sequences.

    A group too big for one batch is cut into chunks, each repeating the prefix. A single
    sequence longer than the budget gets a batch of its own. `cached` (by member) are leading
    tokens a chunk will read from the KV cache instead of laying out.
    """
    cached = cached or {}
    batches: list[list[Chunk]] = [[]]
    used = rows = 0
    for group in groups:
        open_chunk: list[int] = []
        for m in group.members:
            # the chunk's first member lays out the prefix (less what is cached), the rest only
            # their suffixes
            cost = lengths[m] - (group.prefix_len if open_chunk else cached.get(m, 0))
            full = used + cost > token_budget or rows + 1 > max_rows
            if full and (batches[-1] or open_chunk):
                if open_chunk:
                    batches[-1].append(Chunk(group.prefix_len, tuple(open_chunk)))
                batches.append([])
                used = rows = 0
                open_chunk = []
                cost = lengths[m] - cached.get(m, 0)
            open_chunk.append(m)
            used += cost
            rows += 1
        batches[-1].append(Chunk(group.prefix_len, tuple(open_chunk)))
    return [b for b in batches if b]


# A batch costs about its padded tokens plus this many more (a measured per-program overhead
# that makes small buckets dearer per token: on a 2-core CPU a 1024-token batch ran ~1.25x the
# per-token time of an 8192-token one). Used only to choose between ways of splitting.
BATCH_OVERHEAD_TOKENS = 256


def plan(
    seqs: Sequence[Tokens],
    *,
    token_budget: int,
    buckets: Buckets,
    groups: Sequence[Chunk] | None = None,
    cached: Mapping[int, int] | None = None,
    layout: Layout = Layout.SHARED,
) -> list[list[Chunk]]:
    """Group sequences by shared prefix (or take `groups`), then split them into batches that
    fit the grid, `cached` tokens (by member) read from the KV cache rather than laid out.

    Batches fill up to `token_budget` in order. The last one is re-split in two when that costs
    less: its padded bucket against two smaller ones (repeated prefixes included), each batch
    charged `BATCH_OVERHEAD_TOKENS` more. Sequences of a `layout` that does not share (an
    encoder's, an output that reads every token of its sequence) are each a group of their own.
    """
    if groups is None and layout.shares:
        groups = group_by_prefix(seqs)
    elif groups is None:
        groups = [Chunk(0, (i,)) for i in range(len(seqs))]
    lengths = [len(s) for s in seqs]
    limits = dict(token_budget=token_budget, max_rows=buckets.max_rows, cached=cached)
    batches = plan_batches(groups, lengths, **limits)
    if not batches:
        return batches
    return batches[:-1] + _split_last(batches[-1], seqs, buckets, cached or {})


def _split_last(
    batch: list[Chunk], seqs: Sequence[Tokens], buckets: Buckets, cached: Mapping[int, int]
) -> list[list[Chunk]]:
    """`batch`, or its members in two batches, whichever costs less (see `plan`). Each way of
    splitting is `plan_batches` of `batch` at a smaller bucket's budget that yields two
    batches; all are costed from one running sum of its members' tokens."""
    real = real_tokens(batch, seqs, cached)
    if pick_bucket(buckets.tokens, real) - real <= real // 32:
        return [batch]  # padding under 3%: no split can pay for its second batch
    costs, restart = _member_costs(batch, seqs, cached)  # i64[n] each, costs summing to real
    filled = np.cumsum(costs)  # i64[n]: the tokens of the first j + 1 members
    best, best_cost = None, pick_bucket(buckets.tokens, real) + BATCH_OVERHEAD_TOKENS
    for budget in (t for t in buckets.tokens if real // 2 <= t < real):
        # the first batch takes members [0, k) as `plan_batches` fills it (at least one)
        k = max(1, min(int(np.searchsorted(filled, budget, side="right")), buckets.max_rows))
        if k == len(costs):
            continue  # all of it fits: no split
        first = int(filled[k - 1])
        second = real - first + int(restart[k])  # a chunk cut at k lays its prefix out again
        if second > budget or len(costs) - k > buckets.max_rows:
            continue  # more than two batches
        cost = sum(pick_bucket(buckets.tokens, n) for n in (first, second))
        cost += 2 * BATCH_OVERHEAD_TOKENS
        if cost < best_cost:
            best, best_cost = budget, cost
    if best is None:
        return [batch]
    lengths = [len(s) for s in seqs]
    return plan_batches(batch, lengths, token_budget=best, max_rows=buckets.max_rows, cached=cached)


def _member_costs(
    batch: Sequence[Chunk], seqs: Sequence[Tokens], cached: Mapping[int, int]
) -> tuple[np.ndarray, np.ndarray]:  # i64[n], i64[n]
    """The tokens each member of `batch` (in order) adds to a batch as `plan_batches` lays
    them out: a chunk's first member its whole sequence less what is cached, the others their
    suffixes; and what a member adds more when a cut makes it first of its chunk."""
    members = [m for c in batch for m in c.members]
    sizes = [len(c.members) for c in batch]
    prefix = np.repeat(np.array([c.prefix_len for c in batch], np.int64), sizes)
    length = np.fromiter((len(seqs[m]) for m in members), np.int64, len(members))
    held = np.fromiter((cached.get(m, 0) for m in members), np.int64, len(members))
    first = np.zeros(len(members), bool)
    first[np.cumsum([0, *sizes[:-1]])] = True
    costs = np.where(first, length - held, length - prefix)
    return costs, np.where(first, 0, prefix - held)


def real_tokens(
    chunks: Sequence[Chunk], seqs: Sequence[Tokens], cached: Mapping[int, int] | None = None
) -> int:
    """Tokens a batch of `chunks` lays out before padding: each prefix once (less what its first
    member finds `cached`), then suffixes."""
    cached = cached or {}
    return sum(
        c.prefix_len
        - cached.get(c.members[0], 0)
        + sum(len(seqs[m]) - c.prefix_len for m in c.members)
        for c in chunks
    )
