"""A request's token ids joined into one int32 buffer, with numpy. Twin of `_native/_join.pyx`."""

from collections.abc import Sequence
from itertools import chain
from typing import NoReturn

import numpy as np


def join_ids(
    query: Sequence[int], items: Sequence[Sequence[int]], item_first: bool, vocab_size: int
) -> list[np.ndarray]:
    """Each item's sequence, `query + item` (`item + query` with `item_first`), as int32 views
    into one buffer; TypeError naming the field (`query` or `items[i]`) that holds something other
    than an int, ValueError naming the one that holds an id outside [0, vocab_size)."""
    if not set(map(type, chain(query, *items))) <= {int}:  # a bool is no token id
        _raise_first(query, items, vocab_size)
    lengths = [len(it) for it in items]
    try:
        q = np.fromiter(query, np.int64, len(query))  # i64[Q]
        flat = np.fromiter(chain.from_iterable(items), np.int64, sum(lengths))  # i64[sum(lengths)]
    except OverflowError:  # an id beyond 64 bits
        q = flat = np.array([-1])
    if _outside(q, vocab_size) or _outside(flat, vocab_size):
        _raise_first(query, items, vocab_size)
    out = np.empty(len(q) * len(items) + len(flat), np.int32)
    seqs, at, start = [], 0, 0
    for n in lengths:
        seq, item = out[at : at + len(q) + n], flat[start : start + n]
        if item_first:
            seq[:n], seq[n:] = item, q
        else:
            seq[: len(q)], seq[len(q) :] = q, item
        seqs.append(seq)
        at, start = at + len(seq), start + n
    return seqs


def _outside(ids: np.ndarray, vocab_size: int) -> bool:
    return bool(len(ids)) and (ids.min() < 0 or ids.max() >= vocab_size)


def _raise_first(query: Sequence[int], items: Sequence[Sequence[int]], vocab_size: int) -> NoReturn:
    """The compiled twin's error (only once one is known to be due): at the first id that is not
    an int (TypeError) or is outside the vocabulary (ValueError), naming its field."""
    fields = [("query", query), *((f"items[{i}]", it) for i, it in enumerate(items))]
    for field, ids in fields:
        for t in ids:
            if type(t) is not int:
                raise TypeError(field)
            if not 0 <= t < vocab_size:
                raise ValueError(field)
    raise AssertionError("no id is wrong")
