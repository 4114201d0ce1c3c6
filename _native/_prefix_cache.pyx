# cython: boundscheck=False, wraparound=False
"""The KV pool's page allocator and radix prefix cache, compiled. Twin of
`_native/_prefix_cache_py.py`.

The pool has `num_pages` pages of `page_size` tokens. A compressed trie maps token prefixes, in
whole pages, to the pages that hold their keys and values: every edge is a run of pages, its
tokens an int32 array compared with `memcmp`, and a node's children are keyed by the bytes of
their edge's first page. Pins (reference counts, counted on a node and all its ancestors) keep
what planned and running batches read; unpinned leaves are evicted least recently used first
when pages run short. Every page is in exactly one place: the free list, the tree, or handed out
by `allocate` and not yet `insert`ed or `release`d.
"""

import heapq

import numpy as np

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcmp

from _native._ids cimport as_i32

__all__ = ["PrefixCache"]

cdef enum:
    FREE = 0
    TREE = 1
    OUT = 2

_STATES = ("free", "cached", "handed out")


cdef class _Node:
    cdef object owner  # the i32 array holding `edge`
    cdef const int* edge  # the edge's tokens: n_pages * page_size of them
    cdef Py_ssize_t n_pages
    cdef list pages
    cdef _Node parent
    cdef bytes key  # the parent's key for this node: its first page of tokens
    cdef dict children
    cdef long long id
    cdef long long pins
    cdef long long used


cdef bytes _page_key(const int* tokens, Py_ssize_t page):
    return PyBytes_FromStringAndSize(<const char*>tokens, page * sizeof(int))




cdef class PrefixCache:
    """Token prefixes in whole pages -> the pages holding them, over a pool of `num_pages`."""

    cdef readonly Py_ssize_t num_pages
    cdef readonly Py_ssize_t page_size
    cdef _Node _root
    cdef dict _nodes
    cdef long long _next_id
    cdef long long _tick
    cdef list _free
    cdef object _where_array
    cdef unsigned char[::1] _where
    cdef Py_ssize_t _evictable
    cdef Py_ssize_t _evicted

    def __init__(self, num_pages, page_size):
        if num_pages < 1:
            raise ValueError(f"num_pages must be at least 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._evicted = 0
        self.clear()

    def clear(self):
        """Drop every node, pinned or not, and free every page; old node ids become unknown."""
        self._root = self._node(None, None, NULL, 0, [])
        self._nodes = {0: self._root}
        self._next_id = 1
        self._tick = 0
        self._free = list(range(self.num_pages - 1, -1, -1))  # a stack: page 0 first
        self._where_array = np.zeros(self.num_pages, np.uint8)
        self._where = self._where_array
        self._evictable = 0

    @property
    def free_pages(self):
        return len(self._free)

    @property
    def cached_pages(self):
        return int(np.count_nonzero(self._where_array == TREE))

    @property
    def evictable_pages(self):
        return self._evictable

    @property
    def evicted(self):
        return self._evicted

    def match(self, tokens):
        """(node, length, pages): the longest prefix of `tokens` held, in whole pages; `node`
        is exactly that prefix (an edge is split where the match ends inside it)."""
        toks = as_i32(tokens)
        held = []
        cdef Py_ssize_t length = 0
        cdef _Node node = self._walk(toks, None, held, &length)
        return node.id, length, np.asarray(held, np.int32)

    def insert(self, tokens, pages):
        """Give the tree `pages` holding `tokens` (whole pages); returns the node of exactly that
        prefix. Where the tree holds a leading part already, its own pages stay and the given
        ones (unless the very same) go back to the free list."""
        toks = as_i32(tokens)
        given = [int(p) for p in np.asarray(pages).tolist()]
        cdef Py_ssize_t n = toks.shape[0], length = 0
        if n != len(given) * self.page_size:
            raise ValueError(
                f"{n} tokens do not fill {len(given)} pages of {self.page_size}"
            )
        for p in given:
            self._check_page(p, (OUT, TREE), "insert")
        cdef _Node node = self._walk(toks, given, [], &length)
        if length < n:
            node = self._add_leaf(node, toks, length, given[length // self.page_size :])
        return node.id

    cdef _Node _walk(self, object toks, list given, list held, Py_ssize_t* matched):
        """Follow `toks` down in whole pages, touching the path; with `given` pages, hand back
        the duplicates of what the tree holds. `matched[0]` gets the tokens matched."""
        cdef const int[::1] view = toks
        cdef Py_ssize_t n = view.shape[0], page = self.page_size, i = 0, k
        cdef const int* t = &view[0] if n else NULL
        cdef _Node node = self._root, child
        self._tick += 1
        node.used = self._tick
        while i + page <= n:
            child = node.children.get(_page_key(t + i, page))
            if child is None:
                break
            k = _common_pages(child, t + i, (n - i) // page, page)
            if given is not None:
                self._hand_back(child.pages[:k], given[i // page : i // page + k])
            if k < child.n_pages:
                child = self._split(child, k)
            held.extend(child.pages)
            node = child
            i += k * page
            node.used = self._tick
        matched[0] = i
        return node

    cdef void _hand_back(self, list held, list given):
        for mine, theirs in zip(held, given):
            if theirs != mine:
                self._where[<Py_ssize_t>theirs] = FREE
                self._free.append(theirs)

    cdef _Node _split(self, _Node child, Py_ssize_t k):
        """A node for the first `k` pages of `child`'s edge, put between it and its parent."""
        cdef _Node mid = self._node(child.parent, child.owner, child.edge, k, child.pages[:k])
        mid.pins = child.pins
        mid.used = child.used
        child.edge += k * self.page_size
        child.n_pages -= k
        child.pages = child.pages[k:]
        child.key = _page_key(child.edge, self.page_size)
        child.parent.children[mid.key] = mid
        mid.children[child.key] = child
        child.parent = mid
        return mid

    cdef _Node _add_leaf(self, _Node parent, object toks, Py_ssize_t start, list pages):
        tail = np.array(toks[start:], dtype=np.int32)
        cdef const int[::1] view = tail
        cdef _Node leaf = self._node(parent, tail, &view[0], len(pages), pages)
        leaf.used = self._tick
        parent.children[leaf.key] = leaf
        for p in pages:
            self._where[<Py_ssize_t>p] = TREE
        self._evictable += len(pages)
        return leaf

    cdef _Node _node(self, _Node parent, object owner, const int* edge, Py_ssize_t n_pages,
                     list pages):
        cdef _Node node = _Node.__new__(_Node)
        node.owner = owner
        node.edge = edge
        node.n_pages = n_pages
        node.pages = pages
        node.parent = parent
        node.key = _page_key(edge, self.page_size) if n_pages else b""
        node.children = {}
        node.id = self._next_id if parent is not None else 0
        node.pins = 0
        node.used = 0
        if parent is not None:
            self._nodes[node.id] = node
            self._next_id += 1
        return node

    def pin(self, node):
        """One more pin on `node` and each of its ancestors: none of them is evicted."""
        cdef _Node n = self._nodes[node]
        while n is not None:
            if n.pins == 0:
                self._evictable -= n.n_pages
            n.pins += 1
            n = n.parent

    def unpin(self, node):
        """Take back one `pin`; ValueError when `node` is not pinned."""
        cdef _Node n = self._nodes[node]
        if n.pins == 0:
            raise ValueError(f"node {node} is not pinned")
        while n is not None:
            n.pins -= 1
            if n.pins == 0:
                self._evictable += n.n_pages
            n = n.parent

    def allocate(self, Py_ssize_t n):
        """`n` pages off the free list, evicting LRU leaves if needed; None (nothing evicted)
        when not even evicting everything evictable would give `n`."""
        if n > len(self._free) + self._evictable:
            return None
        if n > len(self._free):
            self.evict(n - len(self._free))
        out = np.empty(n, np.int32)
        cdef int[::1] view = out
        cdef Py_ssize_t i
        for i in range(n):
            view[i] = self._free.pop()
            self._where[view[i]] = OUT
        return out

    def release(self, pages):
        """Pages from `allocate` that were not inserted go back to the free list."""
        pages = [int(p) for p in np.asarray(pages).tolist()]
        for p in pages:
            self._check_page(p, (OUT,), "release")
        for p in pages:
            self._where[<Py_ssize_t>p] = FREE
            self._free.append(p)

    def evict(self, Py_ssize_t n):
        """Free at least `n` pages by evicting unpinned leaves, least recently used first;
        returns the pages freed (fewer when nothing more is evictable)."""
        cdef _Node x, leaf, parent
        heap = [(x.used, x.id) for x in self._nodes.values() if _evictable_leaf(x)]
        heapq.heapify(heap)
        cdef Py_ssize_t freed = 0
        while freed < n and heap:
            leaf = self._nodes[heapq.heappop(heap)[1]]
            parent = self._remove(leaf)
            freed += leaf.n_pages
            if _evictable_leaf(parent):
                heapq.heappush(heap, (parent.used, parent.id))
        self._evicted += freed
        return freed

    cdef _Node _remove(self, _Node leaf):
        cdef _Node parent = leaf.parent
        del parent.children[leaf.key]
        del self._nodes[leaf.id]
        for p in leaf.pages:
            self._where[<Py_ssize_t>p] = FREE
            self._free.append(p)
        self._evictable -= leaf.n_pages
        return parent

    cdef _check_page(self, Py_ssize_t page, tuple allowed, str what):
        if not 0 <= page < self.num_pages:
            raise ValueError(f"{what}: page {page} is not in the pool of {self.num_pages}")
        if self._where[page] not in allowed:
            raise ValueError(f"{what}: page {page} is {_STATES[self._where[page]]}")


cdef inline bint _evictable_leaf(_Node node):
    return node.id != 0 and node.pins == 0 and not node.children


cdef Py_ssize_t _common_pages(_Node child, const int* toks, Py_ssize_t available,
                              Py_ssize_t page):
    """Whole pages of `child`'s edge equal to `toks` (the first is known equal)."""
    cdef Py_ssize_t most = min(child.n_pages, available), k = 1
    if memcmp(child.edge, toks, most * page * sizeof(int)) == 0:
        return most  # the usual case for a shared prompt: one vectorised compare
    while k < most and memcmp(child.edge + k * page, toks + k * page, page * sizeof(int)) == 0:
        k += 1
    return k
