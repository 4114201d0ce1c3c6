"""Radix tree over token-id sequences in pure Python. Twin of `_native/_radix.pyx`.

A compressed trie: every edge holds a run of tokens, and every node other than the root either
ends an inserted sequence or branches. `match` and `insert` are the operations a prefix cache
needs; `group_by_prefix` plans shared-prefix groups for the packed batch (DESIGN §3).
"""

from collections.abc import Sequence

# Tokens compared per slice: one C-level list comparison per slice instead of one Python
# comparison per token, so long shared prompts cost little even here.
_STRIDE = 64


class _Node:
    __slots__ = ("children", "depth", "edge", "ends")

    def __init__(self, edge: list[int], depth: int):
        self.edge = edge  # tokens on the edge from the parent to this node
        self.depth = depth  # tokens from the root to the end of `edge`
        self.children: dict[int, _Node] = {}  # first edge token -> child
        self.ends: list[int] = []  # ids of the inserted sequences that end exactly here


class RadixTree:
    """A multiset of token sequences sharing storage for common prefixes.

    Sequences are Python int lists, tuples or integer numpy arrays. The i-th call of `insert`
    stores a sequence with id i (duplicates are kept, each with its own id).
    """

    def __init__(self):
        self._root = _Node([], 0)
        self._size = 0

    def __len__(self) -> int:
        """The number of sequences inserted (duplicates included)."""
        return self._size

    def insert(self, seq: Sequence[int]) -> int:
        """Add `seq` with the next id; returns how many of its leading tokens were already stored
        (what `match(seq)` returned just before)."""
        node, stored = _walk(self._root, _as_list(seq), grow=True)
        node.ends.append(self._size)
        self._size += 1
        return stored

    def match(self, seq: Sequence[int]) -> int:
        """Length of the longest prefix of `seq` that is a prefix of some inserted sequence."""
        return _walk(self._root, _as_list(seq), grow=False)[1]


def _walk(node: _Node, toks: list[int], grow: bool) -> tuple[_Node, int]:
    """Follow `toks` down from `node`: (the node reached, how many leading tokens the tree holds).

    Without `grow`, stops where the tree diverges from `toks`. With it, adds what is missing
    (splitting the edge where they diverge inside one) and reaches the node ending `toks`.
    """
    i, n = 0, len(toks)
    while i < n:
        child = node.children.get(toks[i])
        if child is None:
            if not grow:
                return node, i
            leaf = _Node(toks[i:], node.depth + n - i)
            node.children[toks[i]] = leaf
            return leaf, i
        k = _common(child.edge, toks, i, min(len(child.edge), n - i))
        if k < len(child.edge):
            if not grow:
                return node, i + k
            child = _split(node, child, k)
        node, i = child, i + k
    return node, n


def group_by_prefix(seqs: Sequence[Sequence[int]]) -> list[tuple[int, tuple[int, ...]]]:
    """Partition sequences into `(prefix_len, members)` groups that save the most tokens.

    Built on a tree of every sequence without its last token, so a group's prefix always leaves
    each member at least one suffix token (the scored position). At each node all sequences below
    either form one group, saving `(n - 1) * depth` tokens, or are split among the children,
    whichever saves more (the whole group on ties). Sequences that join no group are singletons
    `(0, (i,))`. Members ascend; groups are ordered by their first member.
    """
    shared = shared_prefix(seqs)
    tree = RadixTree()
    tree._root.depth = shared  # the tree of what follows the tokens every sequence shares
    for seq in seqs:
        tree.insert(seq[shared:-1])
    whole = _plan(tree._root)
    groups = []
    stack = [tree._root]
    while stack:
        node = stack.pop()
        if node in whole:
            groups.append((node.depth, tuple(sorted(_members(node)))))
        else:
            groups.extend((0, (m,)) for m in node.ends)
            stack.extend(node.children.values())
    groups.sort(key=lambda g: g[1][0])
    return groups


def shared_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all of `seqs` share, each keeping at least its last token."""
    if not len(seqs):
        return 0
    limit = min(len(seq) for seq in seqs) - 1
    first = _as_list(seqs[0])
    for seq in seqs[1:]:
        if limit <= 0:
            return 0
        limit = _common(first, _as_list(seq), 0, limit)
    return max(limit, 0)


def _as_list(seq: Sequence[int]) -> list[int]:
    if isinstance(seq, list):
        return seq
    tolist = getattr(seq, "tolist", None)  # numpy arrays: Python ints in one call
    return tolist() if tolist is not None else list(seq)


def _common(edge: list[int], toks: list[int], start: int, n: int) -> int:
    """Length of the common prefix of `edge[:n]` and `toks[start:start + n]`."""
    k = 0
    while k < n:
        step = min(_STRIDE, n - k)
        if edge[k : k + step] != toks[start + k : start + k + step]:
            while edge[k] == toks[start + k]:
                k += 1
            return k
        k += step
    return n


def _split(parent: _Node, child: _Node, k: int) -> _Node:
    """Insert a node `k` tokens down the edge into `child` and return it."""
    mid = _Node(child.edge[:k], child.depth - len(child.edge) + k)
    child.edge = child.edge[k:]
    mid.children[child.edge[0]] = child
    parent.children[mid.edge[0]] = mid
    return mid


def _plan(root: _Node) -> set[_Node]:
    """The nodes whose sequences form one group each, choosing bottom-up."""
    order, stack = [], [root]
    while stack:  # pre-order without recursion: nested sequences make chains thousands deep
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    count: dict[_Node, int] = {}
    saved: dict[_Node, int] = {}
    whole = set()
    for node in reversed(order):
        count[node] = len(node.ends) + sum(count[c] for c in node.children.values())
        split = sum(saved[c] for c in node.children.values())
        together = (count[node] - 1) * node.depth
        if count[node] > 1 and node.depth > 0 and together >= split:
            whole.add(node)
        saved[node] = together if node in whole else split
    return whole


def _members(node: _Node) -> list[int]:
    members, stack = [], [node]
    while stack:
        node = stack.pop()
        members.extend(node.ends)
        stack.extend(node.children.values())
    return members
