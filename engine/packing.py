"""Host side of the packed prefix batch (DESIGN §3): group sequences by shared token prefix,
split groups into batches under a token budget, and build the flat arrays.

Layout of one batch: for each chunk, the shared prefix once, then each member's suffix; padding
at the end. Positions restart at 0 for every sequence, so RoPE sees what one-by-one scoring sees.
"""

from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from _native import pick_bucket
from engine.models.decoder import PackedInputs
from kernels import make_meta

Tokens = Sequence[int]


class Chunk(NamedTuple):
    """Sequences `members` sharing their first `prefix_len` tokens, placed in one batch."""

    prefix_len: int
    members: tuple[int, ...]


class Buckets(NamedTuple):
    """Padding grids: total tokens (multiples of `block_size`), score rows, schedule width."""

    block_size: int
    tokens: tuple[int, ...]
    rows: tuple[int, ...]
    widths: tuple[int, ...]


def default_buckets(max_tokens: int, block_size: int = 64) -> Buckets:
    """Power-of-two grids covering batches up to `max_tokens` tokens."""
    tokens = [block_size * 2]
    while tokens[-1] < max_tokens:
        tokens.append(tokens[-1] * 2)
    rows = [1]
    while rows[-1] < tokens[-1]:
        rows.append(rows[-1] * 4)
    widths = [1]
    while widths[-1] < tokens[-1] // block_size:
        widths.append(widths[-1] * 2)
    return Buckets(block_size, tuple(tokens), tuple(rows), tuple(widths))


def common_prefix(a: Tokens, b: Tokens) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def group_by_prefix(seqs: Sequence[Tokens]) -> list[Chunk]:
    """Partition sequences into groups sharing a token prefix, maximising the tokens saved.

    Sorted order puts sequences with long common prefixes side by side; a range of that order
    either stays one group (saving `(n - 1) * min_lcp` tokens) or splits where its adjacent LCP
    is smallest, whichever saves more. Every member keeps at least one suffix token, because the
    scored position is a sequence's last token.
    """
    order = sorted(range(len(seqs)), key=lambda i: tuple(seqs[i]))
    lcp = [
        min(common_prefix(seqs[a], seqs[b]), len(seqs[a]) - 1, len(seqs[b]) - 1)
        for a, b in pairwise(order)
    ]
    groups = []
    for lo, hi, prefix in _best_ranges(lcp, 0, len(order)):
        if prefix == 0:
            groups.extend(Chunk(0, (i,)) for i in order[lo:hi])
        else:
            groups.append(Chunk(prefix, tuple(sorted(order[lo:hi]))))
    return sorted(groups, key=lambda g: g.members[0])


def _best_ranges(lcp: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Ranges `(lo, hi, prefix)` of sorted positions [lo, hi) that save the most tokens."""
    plans: dict[tuple[int, int], tuple[int, list]] = {}
    stack = [(lo, hi, False)]
    while stack:  # post-order without recursion: sorted runs can nest thousands deep
        a, b, expanded = stack.pop()
        if b - a == 1:
            plans[a, b] = (0, [(a, b, 0)])
            continue
        low = min(lcp[a : b - 1])
        cuts = [a] + [j + 1 for j in range(a, b - 1) if lcp[j] == low] + [b]
        parts = list(pairwise(cuts))
        if not expanded:
            stack.append((a, b, True))
            stack.extend((x, y, False) for x, y in parts if len(parts) > 1)
            continue
        whole = (b - a - 1) * low
        split = sum(plans[p][0] for p in parts) if len(parts) > 1 else -1
        if low > 0 and whole >= split:
            plans[a, b] = (whole, [(a, b, low)])
        else:
            plans[a, b] = (split, [r for p in parts for r in plans[p][1]])
    return plans[lo, hi][1]


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


def pack(
    seqs: Sequence[Tokens],
    labels: Sequence[Sequence[int]],
    chunks: Sequence[Chunk],
    buckets: Buckets,
) -> tuple[PackedInputs, list[int]]:
    """Flat numpy arrays for one batch, and the sequence index behind each real score row."""
    tokens, positions, pstart, pend, ostart, rows, order = [], [], [], [], [], [], []
    for chunk in chunks:
        base = len(tokens)
        p = chunk.prefix_len
        first = seqs[chunk.members[0]]
        tokens.extend(first[:p])
        positions.extend(range(p))
        pstart.extend([base] * p)
        pend.extend([base] * p)
        ostart.extend([base] * p)
        for m in chunk.members:
            start = len(tokens)
            suffix = seqs[m][p:]
            tokens.extend(suffix)
            positions.extend(range(p, p + len(suffix)))
            pstart.extend([base] * len(suffix))
            pend.extend([base + p] * len(suffix))
            ostart.extend([start] * len(suffix))
            rows.append(len(tokens) - 1)
            order.append(m)
    return _padded(tokens, positions, pstart, pend, ostart, rows, order, labels, buckets), order


def _padded(tokens, positions, pstart, pend, ostart, rows, order, labels, buckets: Buckets):
    real = len(tokens)
    t = pick_bucket(buckets.tokens, real)
    pad = np.arange(real, t, dtype=np.int32)  # padding tokens attend only to themselves

    def flat(values, fill):
        return np.concatenate([np.asarray(values, np.int32), fill]).astype(np.int32)

    meta = make_meta(
        flat(pstart, pad),
        flat(pend, pad),
        flat(ostart, pad),
        block_size=buckets.block_size,
        width_buckets=buckets.widths,
    )
    s = pick_bucket(buckets.rows, len(rows))
    width = max(len(labels[m]) for m in order)
    label_ids = np.zeros((s, width), np.int32)  # i32[S, L]
    for r, m in enumerate(order):
        label_ids[r, : len(labels[m])] = labels[m]
    score_rows = np.zeros(s, np.int32)  # i32[S]
    score_rows[: len(rows)] = rows
    zeros = np.zeros(t - real, np.int32)
    return PackedInputs(flat(tokens, zeros), flat(positions, zeros), meta, score_rows, label_ids)
