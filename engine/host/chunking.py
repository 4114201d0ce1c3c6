"""Chunked prefill (DESIGN §3b): work longer than one batch computed over successive batches.

With a KV cache, a group of sequences sharing a prefix (or a single sequence) that costs more
than the token budget first has its cacheable prefix computed in *pieces*: piece k computes
tokens [a_k, b_k) of the prefix (whole pages, at most a budget's worth), reading [0, a_k) from
the pages earlier pieces wrote. A piece is laid out as a sequence of its own, the prefix's first
b_k + 1 tokens, whose score row nobody reads. The group's members then read the whole prefix
from the cache, so they cost only their suffixes. Each piece and the members that follow it
*expect* a cached length; a batch is packed only once what it expects is committed.
"""

from collections.abc import Sequence
from typing import NamedTuple

from engine.host.planning import Chunk, Tokens


class Planned(NamedTuple):
    """One batch of a plan: its chunks, and the cached tokens each chunk's context must find
    before the batch is packed (0: whatever the cache holds then)."""

    chunks: list[Chunk]
    expected: list[int]


def cacheable(chunk: Chunk, seqs: Sequence[Tokens]) -> int:
    """Tokens of a chunk the cache may hold: what its members share, or a lone sequence's all
    but its scored last token."""
    first = seqs[chunk.members[0]]
    return chunk.prefix_len if len(chunk.members) > 1 else len(first) - 1


def piece_bounds(
    cached: int, prefix: int, budget: int, page: int, capacity: int
) -> list[tuple[int, int]]:
    """[a, b) of each piece computing whole pages of `prefix` from `cached` (a page boundary):
    at most `budget` tokens laid out each (the piece's unread last token included), and no
    further than the `capacity` tokens the pool holds (what is left is computed in one batch)."""
    step = (budget - 1) // page * page
    end = min(prefix, capacity) // page * page
    if step < page or end <= cached:
        return []
    return [(a, min(a + step, end)) for a in range(cached, end, step)]


def pieces(
    seqs: Sequence[Tokens],
    groups: Sequence[Chunk],
    cached: Sequence[int],
    *,
    budget: int,
    page: int,
    capacity: int,
) -> tuple[list[Tokens], list[Planned], dict[int, int]]:
    """The pieces of every group that costs more than `budget` given what is `cached` of it,
    in a pool of `capacity` tokens with pages of `page` tokens.

    Returns the pieces' sequences (to append after `seqs`), one single-piece batch each, in
    order, and per member of a chunked group the cached length its chunk will expect.
    """
    extra: list[Tokens] = []
    planned: list[Planned] = []
    expect: dict[int, int] = {}
    for group, have in zip(groups, cached, strict=True):
        prefix = cacheable(group, seqs)
        cost = prefix - have + sum(len(seqs[m]) - prefix for m in group.members)
        bounds = piece_bounds(have, prefix, budget, page, capacity) if cost > budget else []
        first = seqs[group.members[0]]
        for a, b in bounds:
            extra.append(first[: b + 1])
            index = len(seqs) + len(extra) - 1
            planned.append(Planned([Chunk(0, (index,))], [a]))
        for m in group.members:
            expect[m] = bounds[-1][1] if bounds else 0
    return extra, planned, expect
