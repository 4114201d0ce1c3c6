"""The KV pool's page allocator and radix prefix cache in pure Python. Twin of
`_native/_prefix_cache.pyx`.

The pool has `num_pages` pages of `page_size` tokens. A compressed trie maps token prefixes, in
whole pages, to the pages that hold their keys and values: every edge is a run of pages. Pins
(reference counts, counted on a node and all its ancestors) keep what planned and running
batches read; unpinned leaves are evicted least recently used first when pages run short.
Every page is in exactly one place: the free list, the tree, or handed out by `allocate` and
not yet `insert`ed or `release`d.
"""

import heapq
from collections.abc import Sequence

import numpy as np

from ._prefix_groups_py import _as_list

_FREE, _TREE, _OUT = 0, 1, 2  # where a page is


class _Node:
    __slots__ = ("children", "id", "key", "pages", "parent", "pins", "tokens", "used")

    def __init__(self, node_id: int, parent, tokens: list[int], pages: list[int], page: int):
        self.id = node_id
        self.parent = parent
        self.tokens = tokens  # the edge from the parent: len(pages) * page_size tokens
        self.pages = pages
        self.key = tuple(tokens[:page])  # the parent's key for this child: its first page
        self.children: dict[tuple, _Node] = {}
        self.pins = 0
        self.used = 0


class PrefixCache:
    """Token prefixes in whole pages -> the pages holding them, over a pool of `num_pages`."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1:
            raise ValueError(f"num_pages must be at least 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.clear()
        self._evicted = 0

    def clear(self) -> None:
        """Drop every node, pinned or not, and free every page; old node ids become unknown."""
        self._root = _Node(0, None, [], [], self.page_size)
        self._nodes = {0: self._root}
        self._next_id = 1
        self._tick = 0
        self._free = list(range(self.num_pages - 1, -1, -1))  # a stack: page 0 first
        self._where = bytearray(self.num_pages)  # _FREE / _TREE / _OUT per page
        self._evictable = 0

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def cached_pages(self) -> int:
        return self._where.count(_TREE)

    @property
    def evictable_pages(self) -> int:
        return self._evictable

    @property
    def evicted(self) -> int:
        return self._evicted

    def match(self, tokens: Sequence[int]) -> tuple[int, int, np.ndarray]:
        """(node, length, pages): the longest prefix of `tokens` held, in whole pages; `node`
        is exactly that prefix (an edge is split where the match ends inside it)."""
        toks = _as_list(tokens)
        node, length, pages = self._walk(toks, None)
        return node.id, length, np.asarray(pages, np.int32)

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> int:
        """Give the tree `pages` holding `tokens` (whole pages); returns the node of exactly that
        prefix. Where the tree holds a leading part already, its own pages stay and the given
        ones (unless the very same) go back to the free list."""
        toks, given = _as_list(tokens), [int(p) for p in _as_list(pages)]
        if len(toks) != len(given) * self.page_size:
            raise ValueError(
                f"{len(toks)} tokens do not fill {len(given)} pages of {self.page_size}"
            )
        for p in given:
            self._check_page(p, (_OUT, _TREE), "insert")
        node, length, _ = self._walk(toks, given)
        if length < len(toks):
            node = self._add_leaf(node, toks[length:], given[length // self.page_size :])
        return node.id

    def _walk(self, toks: list[int], given: list[int] | None) -> tuple[_Node, int, list[int]]:
        """Follow `toks` down in whole pages, touching the path; with `given` pages, hand back
        the duplicates of what the tree holds. Returns (node reached, tokens matched, pages)."""
        page, node, i, held = self.page_size, self._root, 0, []
        self._tick += 1
        node.used = self._tick
        while i + page <= len(toks):
            child = node.children.get(tuple(toks[i : i + page]))
            if child is None:
                break
            k = _common_pages(child.tokens, toks, i, page)
            if given is not None:
                self._hand_back(child.pages[:k], given[i // page : i // page + k])
            if k < len(child.pages):
                child = self._split(child, k)
            held.extend(child.pages)
            node, i = child, i + k * page
            node.used = self._tick
        return node, i, held

    def _hand_back(self, held: list[int], given: list[int]) -> None:
        for mine, theirs in zip(held, given, strict=False):
            if theirs != mine:
                self._where[theirs] = _FREE
                self._free.append(theirs)

    def _split(self, child: _Node, k: int) -> _Node:
        """A node for the first `k` pages of `child`'s edge, put between it and its parent."""
        cut = k * self.page_size
        mid = self._new_node(child.parent, child.tokens[:cut], child.pages[:k])
        mid.pins, mid.used = child.pins, child.used
        child.tokens, child.pages = child.tokens[cut:], child.pages[k:]
        child.key = tuple(child.tokens[: self.page_size])
        child.parent.children[mid.key] = mid
        mid.children[child.key] = child
        child.parent = mid
        return mid

    def _add_leaf(self, parent: _Node, tokens: list[int], pages: list[int]) -> _Node:
        leaf = self._new_node(parent, tokens, pages)
        leaf.used = self._tick
        parent.children[leaf.key] = leaf
        for p in pages:
            self._where[p] = _TREE
        self._evictable += len(pages)
        return leaf

    def _new_node(self, parent: _Node, tokens: list[int], pages: list[int]) -> _Node:
        node = _Node(self._next_id, parent, tokens, pages, self.page_size)
        self._nodes[node.id] = node
        self._next_id += 1
        return node

    def pin(self, node: int) -> None:
        """One more pin on `node` and each of its ancestors: none of them is evicted."""
        n = self._nodes[node]
        while n is not None:
            if n.pins == 0:
                self._evictable -= len(n.pages)
            n.pins += 1
            n = n.parent

    def unpin(self, node: int) -> None:
        """Take back one `pin`; ValueError when `node` is not pinned."""
        n = self._nodes[node]
        if n.pins == 0:
            raise ValueError(f"node {node} is not pinned")
        while n is not None:
            n.pins -= 1
            if n.pins == 0:
                self._evictable += len(n.pages)
            n = n.parent

    def allocate(self, n: int) -> np.ndarray | None:
        """`n` pages off the free list, evicting LRU leaves if needed; None (nothing evicted)
        when not even evicting everything evictable would give `n`."""
        if n > len(self._free) + self._evictable:
            return None
        if n > len(self._free):
            self.evict(n - len(self._free))
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self._where[p] = _OUT
        return np.asarray(out, np.int32)

    def release(self, pages: Sequence[int]) -> None:
        """Pages from `allocate` that were not inserted go back to the free list."""
        pages = [int(p) for p in _as_list(pages)]
        for p in pages:
            self._check_page(p, (_OUT,), "release")
        for p in pages:
            self._where[p] = _FREE
            self._free.append(p)

    def evict(self, n: int) -> int:
        """Free at least `n` pages by evicting unpinned leaves, least recently used first;
        returns the pages freed (fewer when nothing more is evictable)."""
        heap = [(x.used, x.id) for x in self._nodes.values() if _evictable_leaf(x)]
        heapq.heapify(heap)
        freed = 0
        while freed < n and heap:
            _, node_id = heapq.heappop(heap)
            leaf = self._nodes[node_id]
            parent = self._remove(leaf)
            freed += len(leaf.pages)
            if _evictable_leaf(parent):
                heapq.heappush(heap, (parent.used, parent.id))
        self._evicted += freed
        return freed

    def _remove(self, leaf: _Node) -> _Node:
        parent = leaf.parent
        del parent.children[leaf.key]
        del self._nodes[leaf.id]
        for p in leaf.pages:
            self._where[p] = _FREE
            self._free.append(p)
        self._evictable -= len(leaf.pages)
        return parent

    def _check_page(self, page: int, allowed: tuple[int, ...], what: str) -> None:
        if not 0 <= page < self.num_pages:
            raise ValueError(f"{what}: page {page} is not in the pool of {self.num_pages}")
        if self._where[page] not in allowed:
            state = ("free", "cached", "handed out")[self._where[page]]
            raise ValueError(f"{what}: page {page} is {state}")


def _evictable_leaf(node: _Node) -> bool:
    return node.id != 0 and node.pins == 0 and not node.children


def _common_pages(edge: list[int], toks: list[int], start: int, page: int) -> int:
    """Whole pages of `edge` equal to `toks` from `start` (the first is known equal)."""
    k, most = 1, min(len(edge), len(toks) - start) // page
    while k < most:
        lo = k * page
        if edge[lo : lo + page] != toks[start + lo : start + lo + page]:
            break
        k += 1
    return k
