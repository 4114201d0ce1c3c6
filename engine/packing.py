"""Host side of the packed prefix batch (DESIGN §3): group sequences by shared token prefix,
split groups into batches under a token budget, and build the flat arrays.

Layout of one batch: for each chunk, the shared prefix once, then each member's suffix; padding
at the end. Positions restart at 0 for every sequence, so RoPE sees what one-by-one scoring sees.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

import _native
from _native import pick_bucket
from engine.models.decoder import PackedInputs
from kernels import make_meta

Tokens = Sequence[int]


class Chunk(NamedTuple):
    """Sequences `members` sharing their first `prefix_len` tokens, placed in one batch."""

    prefix_len: int
    members: tuple[int, ...]


class Buckets(NamedTuple):
    """Padding grids. A batch's shape is (T tokens, S score rows, L labels per row).

    T comes from `tokens` (multiples of `block_size`); S from `rows_for(T)`, tied to T so that the
    compiled program grid stays small; L from `label_widths`. The block-schedule width is fixed
    per T (`T // block_size`), so it is not a grid dimension.
    """

    block_size: int
    tokens: tuple[int, ...]
    row_divisors: tuple[int, ...] = (32, 8, 2)
    label_widths: tuple[int, ...] = (4, 32, 256)

    def rows_for(self, tokens: int) -> tuple[int, ...]:
        """Score-row buckets of token bucket `tokens`, ascending."""
        return tuple(sorted({max(1, tokens // d) for d in self.row_divisors}))

    @property
    def max_rows(self) -> int:
        """The most score rows any batch can have."""
        return self.rows_for(self.tokens[-1])[-1]

    def grid(self, max_tokens: int) -> list[tuple[int, int, int]]:
        """The (T, S, L) shapes to precompile: T <= `max_tokens`, L the smallest label width."""
        return [
            (t, s, self.label_widths[0])
            for t in self.tokens
            if t <= max_tokens
            for s in self.rows_for(t)
        ]

    def shape(self, real_tokens: int, rows: int, labels: int) -> tuple[int, int, int]:
        """The (T, S, L) of a batch of `real_tokens` tokens, `rows` sequences and `labels` labels.

        T is the smallest token bucket that holds the tokens and whose largest row bucket holds
        the rows; S the smallest of its row buckets that holds them. ValueError when nothing does.
        """
        width = self._label_width(labels)
        smallest = pick_bucket(self.tokens, real_tokens)
        for t in self.tokens[self.tokens.index(smallest) :]:
            row_buckets = self.rows_for(t)
            if row_buckets[-1] >= rows:
                return t, pick_bucket(row_buckets, rows), width
        raise ValueError(f"score rows {rows} exceeds the largest bucket {self.max_rows}")

    def _label_width(self, labels: int) -> int:
        if labels > self.label_widths[-1]:
            raise ValueError(
                f"{labels} labels per sequence exceed the largest label width "
                f"{self.label_widths[-1]}"
            )
        return pick_bucket(self.label_widths, labels)


def default_buckets(max_tokens: int, block_size: int = 64) -> Buckets:
    """Token buckets from `2 * block_size` up to covering `max_tokens`.

    Powers of two up to 1024 tokens, then four per octave (P, 5P/4, 3P/2, 7P/4), so a large batch
    pads by at most a fifth and usually by far less; small batches are cheap either way. Each
    bucket is a multiple of `block_size`.
    """
    tokens = [block_size * 2]
    while tokens[-1] < max_tokens:
        last = tokens[-1]
        octave = 1 << (last.bit_length() - 1)  # the power of two at or below `last`
        step = octave // 4 if octave >= 1024 else octave
        tokens.append(-(-(last + step) // block_size) * block_size)
    return Buckets(block_size, tuple(tokens))


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
    )
    return batch, order


def _label_ids(labels: Sequence[Sequence[int]], rows: int, width: int) -> np.ndarray:
    """i32[rows, width]: row r holds `labels[r]`, zero-padded."""
    label_ids = np.zeros((rows, width), np.int32)
    for r, lab in enumerate(labels):
        label_ids[r, : len(lab)] = lab
    return label_ids
