# cython: boundscheck=False, wraparound=False
"""Packed-batch layout, compiled. Twin of `_native/_pack_py.py`."""

from libc.stdint cimport int32_t

import numpy as np

from _native._ids cimport read_i32

__all__ = ["pack_chunks"]


def pack_chunks(seqs, chunks):
    """Lay out `(prefix_len, members)` chunks: each prefix once, then each member's suffix.

    Members of a chunk must share its first `prefix_len` tokens (taken from the first member) and
    be longer than it. Returns, unpadded, `tokens, positions, prefix_start, prefix_end,
    own_start` i32[N] for the N tokens laid out, then `score_rows` i32[R] (each member's last
    token) and `order` i32[R] (the sequence behind each row), in chunk order.
    """
    cdef Py_ssize_t n, r
    n, r = _sizes(seqs, chunks)
    arrays = tuple(np.empty(n, dtype=np.int32) for _ in range(5)) + tuple(
        np.empty(r, dtype=np.int32) for _ in range(2)
    )
    cdef int[::1] tok = arrays[0], pos = arrays[1], ps = arrays[2], pe = arrays[3]
    cdef int[::1] os = arrays[4], rows = arrays[5], order = arrays[6]
    cdef Py_ssize_t t = 0, row = 0, p, m, base, start, stop, j
    for chunk in chunks:
        p, members = chunk
        base = t
        read_i32(seqs[members[0]], 0, p, <int32_t*>&tok[0] + t)
        for j in range(p):
            pos[t + j] = j
            ps[t + j] = base
            pe[t + j] = base
            os[t + j] = base
        t += p
        for m in members:
            seq = seqs[m]
            stop = len(seq)
            start = t
            read_i32(seq, p, stop, <int32_t*>&tok[0] + t)
            for j in range(stop - p):
                pos[t + j] = p + j
                ps[t + j] = base
                pe[t + j] = base + p
                os[t + j] = start
            t += stop - p
            rows[row] = t - 1
            order[row] = m
            row += 1
    return arrays


cdef tuple _sizes(seqs, chunks):
    """(tokens, rows) of the layout; ValueError for an empty chunk or a member without suffix."""
    cdef Py_ssize_t n = 0, r = 0, p, length
    for chunk in chunks:
        p, members = chunk
        if not members:
            raise ValueError("a chunk has no members")
        n += p
        for m in members:
            length = len(seqs[m])
            if not 0 <= p < length:
                raise ValueError(
                    f"sequence {m} has {length} tokens; its chunk's prefix {p} must be shorter"
                )
            n += length - p
            r += 1
    return n, r
