"""Host side of the packed prefix batch (DESIGN §3): group sequences by shared token prefix,
split groups into batches under a token budget, and build the flat arrays.

Layout of one batch: for each chunk, the shared prefix once, then each member's suffix; padding
at the end. Positions restart at 0 for every sequence, so RoPE sees what one-by-one scoring sees.
"""

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

import _native
from _native import pick_bucket
from engine.buckets import Buckets
from engine.models import PackedInputs
from kernels import make_meta

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
    groups: Sequence[Chunk], lengths: Sequence[int], *, token_budget: int, max_rows: int
) -> list[list[Chunk]]:
    """Split groups into batches of at most `token_budget` tokens and `max_rows` sequences.

    A group too big for one batch is cut into chunks, each repeating the prefix. A single
    sequence longer than the budget gets a batch of its own.
    """
    batches: list[list[Chunk]] = [[]]
    used = rows = 0
    for group in groups:
        open_chunk: list[int] = []
        for m in group.members:
            cost = lengths[m] - group.prefix_len + (0 if open_chunk else group.prefix_len)
            full = used + cost > token_budget or rows + 1 > max_rows
            if full and (batches[-1] or open_chunk):
                if open_chunk:
                    batches[-1].append(Chunk(group.prefix_len, tuple(open_chunk)))
                batches.append([])
                used = rows = 0
                open_chunk = []
                cost = lengths[m]
            open_chunk.append(m)
            used += cost
            rows += 1
        batches[-1].append(Chunk(group.prefix_len, tuple(open_chunk)))
    return [b for b in batches if b]


# A batch costs about its padded tokens plus this many more (a measured per-program overhead
# that makes small buckets dearer per token: on a 2-core CPU a 1024-token batch ran ~1.25x the
# per-token time of an 8192-token one). Used only to choose between ways of splitting.
BATCH_OVERHEAD_TOKENS = 256


class PackedBatch(NamedTuple):
    """One batch ready for the device, and what its rows stand for."""

    inputs: PackedInputs  # numpy arrays, bucketed
    order: list[int]  # the sequence index behind each real score row
    real_tokens: int  # tokens laid out before padding


def batches(
    seqs: Sequence[Tokens],
    labels: Sequence[Sequence[int]],
    *,
    token_budget: int,
    buckets: Buckets,
) -> Iterator[PackedBatch]:
    """The packed batches that score every sequence once: planned when first asked, each
    packed as it is taken, so a caller can dispatch one batch while the next is built."""
    for chunks in plan(seqs, token_budget=token_budget, buckets=buckets):
        inputs, order = pack(seqs, labels, chunks, buckets)
        yield PackedBatch(inputs, order, real_tokens(chunks, seqs))


def plan(seqs: Sequence[Tokens], *, token_budget: int, buckets: Buckets) -> list[list[Chunk]]:
    """Group sequences by shared prefix, then split them into batches that fit the grid.

    Batches fill up to `token_budget` in order. The last one is re-split in two when that costs
    less: its padded bucket against two smaller ones (repeated prefixes included), each batch
    charged `BATCH_OVERHEAD_TOKENS` more.
    """
    groups = group_by_prefix(seqs)
    lengths = [len(s) for s in seqs]
    batches = plan_batches(groups, lengths, token_budget=token_budget, max_rows=buckets.max_rows)
    return batches[:-1] + _split_last(batches[-1], seqs, buckets) if batches else batches


def _split_last(batch: list[Chunk], seqs: Sequence[Tokens], buckets: Buckets) -> list[list[Chunk]]:
    """`batch`, or its members in two batches, whichever costs less (see `plan`)."""
    real = real_tokens(batch, seqs)
    if pick_bucket(buckets.tokens, real) - real <= real // 32:
        return [batch]  # padding under 3%: no split can pay for its second batch
    lengths = [len(s) for s in seqs]
    best, best_cost = [batch], _cost([batch], seqs, buckets)
    for budget in (t for t in buckets.tokens if real // 2 <= t < real):
        split = plan_batches(batch, lengths, token_budget=budget, max_rows=buckets.max_rows)
        cost = _cost(split, seqs, buckets)
        if len(split) == 2 and cost < best_cost:
            best, best_cost = split, cost
    return best


def _cost(batches: list[list[Chunk]], seqs: Sequence[Tokens], buckets: Buckets) -> int:
    padded = sum(pick_bucket(buckets.tokens, real_tokens(b, seqs)) for b in batches)
    return padded + BATCH_OVERHEAD_TOKENS * len(batches)


def real_tokens(chunks: Sequence[Chunk], seqs: Sequence[Tokens]) -> int:
    """Tokens a batch of `chunks` lays out before padding: each prefix once, then suffixes."""
    return sum(c.prefix_len + sum(len(seqs[m]) - c.prefix_len for m in c.members) for c in chunks)


def pack(
    seqs: Sequence[Tokens],
    labels: Sequence[Sequence[int]],
    chunks: Sequence[Chunk],
    buckets: Buckets,
) -> tuple[PackedInputs, list[int]]:
    """Flat numpy arrays for one batch, and the sequence index behind each real score row.

    The shape (T, S, L) comes from `buckets.shape`; ValueError when the batch fits no bucket.
    """
    # Unpadded: i32[N] for the five per-token arrays, i32[R] for rows and order.
    tokens, positions, pstart, pend, ostart, rows, order = _native.pack_chunks(seqs, chunks)
    order = order.tolist()
    width = max((len(labels[m]) for m in order), default=0)
    t, s, label_width = buckets.shape(len(tokens), len(rows), width)
    pad = np.arange(len(tokens), t, dtype=np.int32)  # padding tokens attend only to themselves
    zeros = np.zeros(t - len(tokens), np.int32)
    meta = make_meta(
        np.concatenate([pstart, pad]),
        np.concatenate([pend, pad]),
        np.concatenate([ostart, pad]),
        block_size=buckets.block_size,
        width_buckets=(t // buckets.block_size,),
    )
    score_rows = np.zeros(s, np.int32)  # i32[S]
    score_rows[: len(rows)] = rows
    batch = PackedInputs(
        np.concatenate([tokens, zeros]),  # i32[T]
        np.concatenate([positions, zeros]),  # i32[T]
        meta,
        score_rows,
        _label_ids([labels[m] for m in order], s, label_width),
        np.full(t, -1, np.int32),  # i32[T]
    )
    return batch, order


def _label_ids(labels: Sequence[Sequence[int]], rows: int, width: int) -> np.ndarray:
    """i32[rows, width]: row r holds `labels[r]`, zero-padded."""
    label_ids = np.zeros((rows, width), np.int32)
    for r, lab in enumerate(labels):
        label_ids[r, : len(lab)] = lab
    return label_ids


def empty_batch(tokens: int, rows: int, labels: int, block_size: int) -> PackedInputs:
    """An all-padding batch of shape (T, S, L), for compiling that program ahead of traffic."""
    pad = np.arange(tokens, dtype=np.int32)  # every token attends only to itself
    meta = make_meta(pad, pad, pad, block_size=block_size, width_buckets=(tokens // block_size,))
    zeros = np.zeros(tokens, np.int32)
    return PackedInputs(
        zeros,
        zeros,
        meta,
        np.zeros(rows, np.int32),
        np.zeros((rows, labels), np.int32),
        np.full(tokens, -1, np.int32),
    )
