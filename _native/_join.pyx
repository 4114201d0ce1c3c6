# cython: boundscheck=False, wraparound=False
"""A request's token ids joined into one int32 buffer, compiled. Twin of `_native/_join_py.py`.

One pass over each id list, checking every id's type (exactly an int: a bool is no token id) and
range as it is copied; the query is converted once and copied beside each item.
"""

from cpython.list cimport PyList_GET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

import numpy as np

__all__ = ["join_ids"]


cdef enum Fill:
    FILLED, NOT_AN_INT, OUTSIDE


def join_ids(query, items, bint item_first, int64_t vocab_size):
    """Each item's sequence, `query + item` (`item + query` with `item_first`), as int32 views
    into one buffer; TypeError naming the field (`query` or `items[i]`) that holds something other
    than an int, ValueError naming the one that holds an id outside [0, vocab_size)."""
    cdef Py_ssize_t q_len = len(query), n = len(items), i, at = 0, m, item_at, query_at
    lengths = [len(it) for it in items]
    q = np.empty(max(q_len, 1), np.int32)
    cdef int32_t[::1] qv = q
    cdef Fill fill = _fill(query, &qv[0], vocab_size)
    if fill != FILLED:
        _raise(fill, "query")
    out = np.empty(max(q_len * n + sum(lengths), 1), np.int32)
    cdef int32_t[::1] ov = out
    cdef int32_t* o = &ov[0]
    seqs = []
    for i in range(n):
        m = lengths[i]
        item_at, query_at = (at, at + m) if item_first else (at + q_len, at)
        fill = _fill(items[i], o + item_at, vocab_size)
        if fill != FILLED:
            _raise(fill, f"items[{i}]")
        memcpy(o + query_at, &qv[0], q_len * sizeof(int32_t))
        seqs.append(out[at : at + q_len + m])
        at += q_len + m
    return seqs


cdef Fill _fill(object ids, int32_t* dst, int64_t vocab_size) except *:
    """Copy `ids` to `dst`, stopping at the first one not an int or outside [0, vocab_size)."""
    cdef list xs = ids if type(ids) is list else list(ids)
    cdef Py_ssize_t j
    cdef long long v
    cdef int overflow
    cdef object x
    for j in range(len(xs)):
        x = <object>PyList_GET_ITEM(xs, j)
        if not PyLong_CheckExact(x):
            return NOT_AN_INT
        v = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow or v < 0 or v >= vocab_size:
            return OUTSIDE
        dst[j] = <int32_t>v
    return FILLED


cdef _raise(Fill fill, str field):
    """The error naming the field `_fill` stopped in."""
    raise (TypeError if fill == NOT_AN_INT else ValueError)(field)
