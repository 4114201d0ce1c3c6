# cython: boundscheck=False, wraparound=False, cdivision=True
"""The block schedule of packed two-span attention, compiled: the work of
`score_kernels.schedule.build_block_schedule`'s numpy form, with its errors (the width bucket is
picked there, between `block_lists` and `block_rows`).

One pass over the tokens of each query block collects their spans' key-block intervals, which
are sorted, merged and written out as the block's ascending key blocks.
"""

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

import numpy as np

__all__ = ["block_lists", "block_rows"]


cdef struct Interval:
    int64_t lo
    int64_t hi


cdef inline void _sort(Interval* xs, Py_ssize_t n) noexcept nogil:
    """Insertion sort by (lo, hi): a query block holds few distinct intervals."""
    cdef Py_ssize_t i, j
    cdef Interval x
    for i in range(1, n):
        x = xs[i]
        j = i - 1
        while j >= 0 and (xs[j].lo > x.lo or (xs[j].lo == x.lo and xs[j].hi > x.hi)):
            xs[j + 1] = xs[j]
            j -= 1
        xs[j + 1] = x


def block_lists(prefix_start, prefix_end, own_start, own_end, int block_size, int context):
    """Every query block's ascending key blocks, one block after another, i32[sum(count)], and
    their count i32[T//B]; ValueError as `score_kernels.schedule.build_block_schedule` raises it.
    `own_end` None: causal."""
    given = [prefix_start, prefix_end, own_start] + ([] if own_end is None else [own_end])
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in given]
    if any(a.ndim != 1 for a in arrays) or len({a.shape for a in arrays}) != 1:
        raise ValueError(f"spans must be 1-D of equal length, got {[a.shape for a in arrays]}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    cdef Py_ssize_t t = arrays[0].shape[0]
    if t == 0 or t % block_size:
        raise ValueError(f"token count {t} is not a positive multiple of block size {block_size}")
    if context < 0 or context % block_size:
        raise ValueError(f"context {context} is not a multiple of block size {block_size}")
    cdef const int64_t[::1] ps = arrays[0]
    cdef const int64_t[::1] pe = arrays[1]
    cdef const int64_t[::1] os_ = arrays[2]
    cdef const int64_t[::1] oe_given = arrays[3] if own_end is not None else arrays[2]
    cdef bint causal = own_end is None
    cdef int64_t end = context + t, pos, oe, b = block_size
    cdef Py_ssize_t i, n = t // block_size, q, k
    cdef int own_bad = 0, prefix_bad = 0
    for i in range(t):
        pos = context + i
        oe = pos + 1 if causal else oe_given[i]
        if os_[i] < 0 or os_[i] > pos or oe <= os_[i] or oe > end:
            own_bad = 1
        if ps[i] < 0 or ps[i] > pe[i] or pe[i] > end:
            prefix_bad = 1
    if own_bad:
        raise ValueError("own spans must satisfy 0 <= own_start[t] <= C + t, own_start[t] < own_end[t] <= C + T")
    if prefix_bad:
        raise ValueError("prefix spans must satisfy 0 <= prefix_start <= prefix_end <= C + T")

    counts = np.zeros(n, np.int32)
    cdef int32_t[::1] count = counts
    cdef vector[int32_t] blocks  # every query block's key blocks, one after another
    cdef vector[Interval] found
    cdef Interval cur, x
    cdef Last own, prefix
    with nogil:
        for q in range(n):
            found.clear()
            own.start = prefix.start = own.blocks.lo = prefix.blocks.lo = -1
            for i in range(q * block_size, (q + 1) * block_size):
                # a causal span's last key block is the query block's own
                oe = context + q * block_size + 1 if causal else oe_given[i]
                _add(&found, &own, os_[i], oe, b)
                if pe[i] > ps[i]:
                    _add(&found, &prefix, ps[i], pe[i], b)
            _sort(found.data(), found.size())
            cur = found[0]
            for k in range(1, found.size()):
                x = found[k]
                if x.lo > cur.hi + 1:
                    _emit(&blocks, cur, &count[q])
                    cur = x
                elif x.hi > cur.hi:
                    cur.hi = x.hi
            _emit(&blocks, cur, &count[q])

    return np.asarray(<int32_t[:blocks.size()]>blocks.data()).copy(), counts


def block_rows(const int32_t[::1] blocks, const int32_t[::1] count, Py_ssize_t width):
    """`block_lists`' blocks as rows i32[T//B, width], each padded with its last block."""
    cdef Py_ssize_t n = count.shape[0], q, k, m, at = 0
    block_kv = np.empty((n, width), np.int32)
    cdef int32_t[:, ::1] out = block_kv
    with nogil:
        for q in range(n):
            m = count[q]
            for k in range(width):
                out[q, k] = blocks[at + (k if k < m else m - 1)]
            at += m
    return block_kv


cdef struct Last:
    int64_t start, end  # the span last seen of its kind (own or prefix), in keys
    Interval blocks  # its key blocks


cdef inline void _add(
    vector[Interval]* found, Last* last, int64_t start, int64_t end, int64_t b
) noexcept nogil:
    """Append the key blocks of the span [start, end) unless they repeat those of `last`, the
    last span of its kind: a sequence's tokens share their spans, and a sliding window's
    spans, which move token by token, mostly share their blocks."""
    if last.start == start and last.end == end:
        return
    last.start = start
    last.end = end
    cdef Interval x
    x.lo = start // b
    x.hi = (end - 1) // b
    if last.blocks.lo == x.lo and last.blocks.hi == x.hi:
        return
    last.blocks = x
    found.push_back(x)


cdef inline void _emit(vector[int32_t]* blocks, Interval x, int32_t* count) noexcept nogil:
    cdef int64_t k
    for k in range(x.lo, x.hi + 1):
        blocks.push_back(<int32_t>k)
    count[0] += <int32_t>(x.hi - x.lo + 1)
