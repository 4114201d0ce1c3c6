"""Packed-batch layout in pure Python. Twin of `_native/_pack.pyx`."""

from collections.abc import Sequence

import numpy as np


def pack_chunks(
    seqs: Sequence[Sequence[int]], chunks: Sequence[tuple[int, Sequence[int]]]
) -> tuple[np.ndarray, ...]:
    """Lay out `(prefix_len, members)` chunks: each prefix once, then each member's suffix.

    Members of a chunk must share its first `prefix_len` tokens (taken from the first member) and
    be longer than it. Returns, unpadded, `tokens, positions, prefix_start, prefix_end,
    own_start` i32[N] for the N tokens laid out, then `score_rows` i32[R] (each member's last
    token) and `order` i32[R] (the sequence behind each row), in chunk order.
    """
    _check(seqs, chunks)
    tokens, positions, pstart, pend, ostart, rows, order = [], [], [], [], [], [], []
    for p, members in chunks:
        base = len(tokens)
        tokens.extend(seqs[members[0]][:p])
        positions.extend(range(p))
        pstart.extend([base] * p)
        pend.extend([base] * p)
        ostart.extend([base] * p)
        for m in members:
            start = len(tokens)
            suffix = seqs[m][p:]
            tokens.extend(suffix)
            positions.extend(range(p, p + len(suffix)))
            pstart.extend([base] * len(suffix))
            pend.extend([base + p] * len(suffix))
            ostart.extend([start] * len(suffix))
            rows.append(len(tokens) - 1)
            order.append(m)
    arrays = (tokens, positions, pstart, pend, ostart, rows, order)
    return tuple(np.array(a, dtype=np.int32) for a in arrays)


def _check(seqs: Sequence[Sequence[int]], chunks: Sequence[tuple[int, Sequence[int]]]) -> None:
    for p, members in chunks:
        if not members:
            raise ValueError("a chunk has no members")
        for m in members:
            if not 0 <= p < len(seqs[m]):
                raise ValueError(
                    f"sequence {m} has {len(seqs[m])} tokens; its chunk's prefix {p} must be "
                    "shorter"
                )
