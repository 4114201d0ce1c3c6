# cython: boundscheck=False, wraparound=False
"""Shared-prefix groups for the packed batch (DESIGN §3), compiled (`prefix_groups.h`). Twin of
`_native/_prefix_groups_py.py`.

Int32 vectors are read in place (a request's ids joined into one buffer are never copied); lists
are converted, and when every sequence is a list the prefix they all share is found by comparing
token objects first (the same objects when the sequences were joined from one query), so only
the tails are converted.
"""

from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from _native._ids cimport as_i32, i32_data

__all__ = ["group_by_prefix"]


cdef extern from "prefix_groups.h" nogil:
    cdef struct Span "prefix_groups::Span":
        const int32_t* data
        int64_t size

    cdef cppclass Grouping "prefix_groups::Grouping":
        vector[int64_t] prefix
        vector[int64_t] offsets
        vector[int64_t] members

    int64_t c_shared_prefix "prefix_groups::shared_prefix"(const vector[Span]& seqs)
    Grouping c_group "prefix_groups::group"(const vector[Span]& tails, int64_t shared)


cdef class _Held:
    """Spans of int32 sequences: read in place where they can be (the caller keeps those
    alive), else converted, the copies kept here."""

    cdef list copies

    def __cinit__(self):
        self.copies = []

    cdef Span span(self, object seq, Py_ssize_t start, Py_ssize_t stop) except *:
        """`seq[start:stop]` in place when it is an int32 vector, else converted."""
        cdef const int32_t* ids = i32_data(seq)
        if ids != NULL:
            return Span(ids + start, stop - start)
        arr = as_i32(seq[start:stop])
        self.copies.append(arr)
        return Span(i32_data(arr), stop - start)


def group_by_prefix(seqs):
    """Partition sequences into `(prefix_len, members)` groups that save the most tokens.

    On the radix tree of every sequence without its last token (so a group's prefix always
    leaves each member at least one suffix token, the scored position), all sequences below a
    node either form one group, saving `(n - 1) * depth` tokens, or are split among its children,
    whichever saves more (the whole group on ties). Sequences that join no group are singletons
    `(0, (i,))`. Members ascend; groups are ordered by their first member.
    """
    seqs = list(seqs)
    cdef Py_ssize_t n = len(seqs), i
    if n == 0:
        return []
    cdef _Held held = _Held()
    cdef vector[Span] tails
    cdef int64_t shared
    if all(type(seq) is list for seq in seqs):
        shared = _shared_of_lists(seqs)
        for seq in seqs:
            tails.push_back(held.span(seq, shared, max(len(seq) - 1, shared)))
    else:
        for seq in seqs:
            tails.push_back(held.span(seq, 0, len(seq)))
        shared = c_shared_prefix(tails)
        for i in range(n):
            tails[i].data += shared
            tails[i].size = max(tails[i].size - 1 - shared, 0)
    cdef Grouping grouping
    with nogil:
        grouping = c_group(tails, shared)
    members = grouping.members
    return [
        (grouping.prefix[g], tuple(members[grouping.offsets[g] : grouping.offsets[g + 1]]))
        for g in range(grouping.prefix.size())
    ]


cdef Py_ssize_t _shared_of_lists(list seqs) except -1:
    cdef Py_ssize_t limit = min([len(seq) for seq in seqs]) - 1
    cdef list first = seqs[0]
    for seq in seqs[1:]:
        if limit <= 0:
            return 0
        limit = _common_objects(first, <list>seq, limit)
    return max(limit, 0)


cdef Py_ssize_t _common_objects(list a, list b, Py_ssize_t n) except -1:
    """Length of the common prefix of a[:n] and b[:n], Python ints compared by identity first."""
    cdef Py_ssize_t k = 0
    cdef PyObject* x
    cdef PyObject* y
    while k < n:
        x = PyList_GET_ITEM(a, k)
        y = PyList_GET_ITEM(b, k)
        if x != y and <object>x != <object>y:
            return k
        k += 1
    return n
