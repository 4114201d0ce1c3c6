# cython: boundscheck=False, wraparound=False
"""A request's token ids joined into one int32 buffer, compiled. Twin of `_native/_join_py.py`.

One pass over each id list, checking every id against the vocabulary as it is copied; the query
is converted once and copied beside each item.
"""

from cpython.list cimport PyList_GET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

import numpy as np

__all__ = ["join_ids"]


def join_ids(query, items, bint item_first, int64_t vocab_size):
    """Each item's sequence, `query + item` (`item + query` with `item_first`), as int32 views
    into one buffer; ValueError naming the field (`query` or `items[i]`) that holds an id outside
    [0, vocab_size)."""
    cdef Py_ssize_t q_len = len(query), n = len(items), i, at = 0, m, item_at, query_at
    lengths = [len(it) for it in items]
    q = np.empty(max(q_len, 1), np.int32)
    cdef int32_t[::1] qv = q
    if not _fill(query, &qv[0], vocab_size):
        raise ValueError("query")
    out = np.empty(max(q_len * n + sum(lengths), 1), np.int32)
    cdef int32_t[::1] ov = out
    cdef int32_t* o = &ov[0]
    seqs = []
    for i in range(n):
        m = lengths[i]
        item_at, query_at = (at, at + m) if item_first else (at + q_len, at)
        if not _fill(items[i], o + item_at, vocab_size):
            raise ValueError(f"items[{i}]")
        memcpy(o + query_at, &qv[0], q_len * sizeof(int32_t))
        seqs.append(out[at : at + q_len + m])
        at += q_len + m
    return seqs


cdef bint _fill(object ids, int32_t* dst, int64_t vocab_size) except -1:
    """Copy `ids` to `dst`; False at the first id outside [0, vocab_size)."""
    cdef list xs = ids if type(ids) is list else list(ids)
    cdef Py_ssize_t j
    cdef long long v
    cdef int overflow
    for j in range(len(xs)):
        v = PyLong_AsLongLongAndOverflow(<object>PyList_GET_ITEM(xs, j), &overflow)
        if overflow or v < 0 or v >= vocab_size:
            return False
        dst[j] = <int32_t>v
    return True
