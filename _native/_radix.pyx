# cython: boundscheck=False, wraparound=False
"""Radix tree over token-id sequences, compiled. Twin of `_native/_radix_py.py`.

A compressed trie: every edge holds a run of int32 tokens, and every node other than the root
either ends an inserted sequence or branches. `match` and `insert` are the operations a prefix
cache needs; `group_by_prefix` plans shared-prefix groups for the packed batch (DESIGN §3).
"""

from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject
from libc.string cimport memcmp

from _native._ids cimport as_i32

import numpy as np

__all__ = ["RadixTree", "group_by_prefix"]


cdef class _Node:
    cdef object owner  # the i32 array that holds `edge`; keeps the pointer valid
    cdef const int* edge  # tokens on the edge from the parent to this node, i32[length]
    cdef Py_ssize_t length
    cdef Py_ssize_t depth  # tokens from the root to the end of `edge`
    cdef dict children  # first edge token -> _Node
    cdef list ends  # ids of the inserted sequences that end exactly here
    # Scratch of group_by_prefix's bottom-up plan.
    cdef Py_ssize_t count
    cdef long long saved
    cdef bint whole


cdef _Node _new_node(object owner, const int* edge, Py_ssize_t length, Py_ssize_t depth):
    cdef _Node node = _Node.__new__(_Node)
    node.owner = owner
    node.edge = edge
    node.length = length
    node.depth = depth
    node.children = {}
    node.ends = []
    return node


cdef _Node _new_leaf(object toks, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t depth):
    """A node at `depth` owning a copy of `toks[start:stop]` (never empty), so callers may
    reuse `toks`."""
    tail = np.array(toks[start:stop], dtype=np.int32)
    cdef const int[::1] view = tail
    return _new_node(tail, &view[0], stop - start, depth)


cdef _Node _split(_Node parent, _Node child, Py_ssize_t k):
    """Insert a node `k` tokens (0 < k < child.length) down the edge into `child`; return it."""
    cdef _Node mid = _new_node(child.owner, child.edge, k, child.depth - child.length + k)
    child.edge += k
    child.length -= k
    mid.children[child.edge[0]] = child
    parent.children[mid.edge[0]] = mid
    return mid


cdef inline Py_ssize_t _common(const int* a, const int* b, Py_ssize_t n) noexcept nogil:
    """Length of the common prefix of a[:n] and b[:n]."""
    cdef Py_ssize_t k = 0
    if memcmp(a, b, n * sizeof(int)) == 0:  # the usual case for a shared prompt: vectorised
        return n
    while a[k] == b[k]:
        k += 1
    return k




cdef class RadixTree:
    """A multiset of token sequences sharing storage for common prefixes.

    Sequences are Python int lists, tuples or integer numpy arrays (stored as int32). The i-th
    call of `insert` stores a sequence with id i (duplicates are kept, each with its own id).
    """

    cdef _Node root
    cdef Py_ssize_t size

    def __cinit__(self):
        self.root = _new_node(None, NULL, 0, 0)
        self.size = 0

    def __len__(self):
        """The number of sequences inserted (duplicates included)."""
        return self.size

    def insert(self, seq):
        """Add `seq` with the next id; returns how many of its leading tokens were already stored
        (what `match(seq)` returned just before)."""
        toks = as_i32(seq)
        return self._insert(toks, toks.shape[0])

    def match(self, seq):
        """Length of the longest prefix of `seq` that is a prefix of some inserted sequence."""
        toks = as_i32(seq)
        cdef Py_ssize_t stored
        _walk(self.root, toks, toks.shape[0], False, &stored)
        return stored

    cdef Py_ssize_t _insert(self, object toks, Py_ssize_t n) except -1:
        """Insert `toks[:n]` (an int32 array with at least n tokens)."""
        cdef Py_ssize_t stored
        _walk(self.root, toks, n, True, &stored).ends.append(self.size)
        self.size += 1
        return stored


cdef _Node _walk(_Node node, object toks, Py_ssize_t n, bint grow, Py_ssize_t* stored):
    """Follow `toks[:n]` (an int32 array) down from `node`; `stored[0]` gets how many of its
    leading tokens the tree already holds.

    Without `grow`, stops where the tree diverges from `toks`. With it, adds what is missing
    (splitting the edge where they diverge inside one) and returns the node ending `toks[:n]`.
    """
    cdef const int[::1] view = toks
    cdef const int* t = &view[0] if n else NULL
    cdef _Node child
    cdef Py_ssize_t i = 0, k
    while i < n:
        child = node.children.get(t[i])
        if child is None:
            stored[0] = i
            if not grow:
                return node
            child = _new_leaf(toks, i, n, node.depth + n - i)
            node.children[t[i]] = child
            return child
        k = _common(child.edge, t + i, min(child.length, n - i))
        if k < child.length:
            if not grow:
                stored[0] = i + k
                return node
            child = _split(node, child, k)
        node = child
        i += k
    stored[0] = n
    return node


def group_by_prefix(seqs):
    """Partition sequences into `(prefix_len, members)` groups that save the most tokens.

    Built on a tree of every sequence without its last token, so a group's prefix always leaves
    each member at least one suffix token (the scored position). At each node all sequences below
    either form one group, saving `(n - 1) * depth` tokens, or are split among the children,
    whichever saves more (the whole group on ties). Sequences that join no group are singletons
    `(0, (i,))`. Members ascend; groups are ordered by their first member.
    """
    cdef Py_ssize_t shared = shared_prefix(seqs)
    cdef RadixTree tree = RadixTree()
    tree.root.depth = shared  # the tree of what follows the tokens every sequence shares
    for seq in seqs:
        toks = as_i32(seq[shared:] if shared else seq)
        tree._insert(toks, max(toks.shape[0] - 1, 0))
    _plan(tree.root)
    cdef list groups = []
    cdef list stack = [tree.root]
    cdef _Node node
    while stack:
        node = stack.pop()
        if node.whole:
            groups.append((node.depth, tuple(sorted(_members(node)))))
        else:
            groups.extend([(0, (m,)) for m in node.ends])
            stack.extend(node.children.values())
    groups.sort(key=_first_member)
    return groups


def shared_prefix(seqs):
    """How many leading tokens all of `seqs` share, each keeping at least its last token.

    The prompt of a multi-item request is shared by every sequence: found by comparing token
    objects (the same objects when the sequences were joined from one query) rather than
    converting every copy of it.
    """
    if not len(seqs):
        return 0
    cdef Py_ssize_t limit = min([len(seq) for seq in seqs]) - 1
    first = seqs[0]
    first_i32 = None  # converted once, if any sequence is not a list
    for seq in seqs[1:]:
        if limit <= 0:
            return 0
        if type(seq) is list and type(first) is list:
            limit = _common_objects(<list>first, <list>seq, limit)
        else:
            if first_i32 is None:
                first_i32 = as_i32(first)
            limit = _common_i32(first_i32, as_i32(seq), limit)
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


cdef Py_ssize_t _common_i32(object a, object b, Py_ssize_t n):
    cdef const int[::1] va = a
    cdef const int[::1] vb = b
    return _common(&va[0], &vb[0], n) if n > 0 else 0


def _first_member(group):
    return group[1][0]


cdef void _plan(_Node root) except *:
    """Mark the nodes whose sequences form one group each, choosing bottom-up."""
    cdef list order = [], stack = [root]
    cdef _Node node, child
    cdef Py_ssize_t i
    cdef long long split, together
    while stack:  # pre-order without recursion: nested sequences make chains thousands deep
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    for i in range(len(order) - 1, -1, -1):
        node = order[i]
        node.count = len(node.ends)
        split = 0
        for child in node.children.values():
            node.count += child.count
            split += child.saved
        together = (node.count - 1) * <long long>node.depth
        node.whole = node.count > 1 and node.depth > 0 and together >= split
        node.saved = together if node.whole else split


cdef list _members(_Node top):
    cdef list members = [], stack = [top]
    cdef _Node node
    while stack:
        node = stack.pop()
        members.extend(node.ends)
        stack.extend(node.children.values())
    return members
