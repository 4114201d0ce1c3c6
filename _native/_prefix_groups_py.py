"""Shared-prefix groups for the packed batch (DESIGN §3) in pure Python. Twin of
`_native/_prefix_groups.pyx` (`prefix_groups.h` explains the method: sorted tails, adjacent
common prefixes, one bottom-up pass over the radix tree's nodes with a stack)."""

from collections.abc import Sequence

# Tokens compared per slice: one C-level list comparison per slice instead of one Python
# comparison per token, so long shared prompts cost little even here.
_STRIDE = 64


def group_by_prefix(seqs: Sequence[Sequence[int]]) -> list[tuple[int, tuple[int, ...]]]:
    """Partition sequences into `(prefix_len, members)` groups that save the most tokens.

    On the radix tree of every sequence without its last token (so a group's prefix always
    leaves each member at least one suffix token, the scored position), all sequences below a
    node either form one group, saving `(n - 1) * depth` tokens, or are split among its children,
    whichever saves more (the whole group on ties). Sequences that join no group are singletons
    `(0, (i,))`. Members ascend; groups are ordered by their first member.
    """
    seqs = [_as_list(seq) for seq in seqs]
    shared = _shared_prefix(seqs)
    tails = [seq[shared : max(len(seq) - 1, shared)] for seq in seqs]
    order = sorted(range(len(tails)), key=tails.__getitem__)
    grouped, groups = [False] * len(order), []
    for prefix, first, last in reversed(_whole_nodes(tails, order, shared)):  # parents first
        if not grouped[first]:  # else inside a group already
            grouped[first : last + 1] = [True] * (last + 1 - first)
            groups.append((prefix, tuple(sorted(order[first : last + 1]))))
    groups += [(0, (order[k],)) for k, done in enumerate(grouped) if not done]
    return sorted(groups, key=lambda g: g[1][0])


def _whole_nodes(tails: list[list[int]], order: list[int], shared: int) -> list[tuple]:
    """`(prefix, first, last)` of each node whose sorted positions [first, last] stay one group,
    children before parents."""
    whole = []
    open_nodes = [[0, 0, 0, 0]]  # depth, first, count, split; the root first
    for k in range(len(order)):
        count, saved, first = 1, 0, k  # the subtree handed up: leaf k, then each node it closes
        if k + 1 < len(order):
            a, b = tails[order[k]], tails[order[k + 1]]
            following = _common(a, b, min(len(a), len(b)))
        else:
            following = -1  # closes the root too
        while open_nodes and open_nodes[-1][0] > following:
            depth, first, count_below, split = open_nodes.pop()
            count, prefix = count_below + count, shared + depth
            together, split = (count - 1) * prefix, split + saved
            one_group = count > 1 and prefix > 0 and together >= split
            if one_group:
                whole.append((prefix, first, k))
            saved = together if one_group else split
        if following < 0:
            break
        if open_nodes[-1][0] < following:
            open_nodes.append([following, first, 0, 0])
        open_nodes[-1][2] += count
        open_nodes[-1][3] += saved
    return whole


def _shared_prefix(seqs: list[list[int]]) -> int:
    """How many leading tokens all of `seqs` share, each keeping at least its last token."""
    if not seqs:
        return 0
    limit = min(len(seq) for seq in seqs) - 1
    for seq in seqs[1:]:
        if limit <= 0:
            return 0
        limit = _common(seqs[0], seq, limit)
    return max(limit, 0)


def _as_list(seq: Sequence[int]) -> list[int]:
    if isinstance(seq, list):
        return seq
    tolist = getattr(seq, "tolist", None)  # numpy arrays: Python ints in one call
    return tolist() if tolist is not None else list(seq)


def _common(a: list[int], b: list[int], n: int) -> int:
    """Length of the common prefix of `a[:n]` and `b[:n]`."""
    k = 0
    while k < n:
        step = min(_STRIDE, n - k)
        if a[k : k + step] != b[k : k + step]:
            while a[k] == b[k]:
                k += 1
            return k
        k += step
    return n
