"""Turning a score call's query, items and labels into token sequences, with sglang's semantics.

Text query with text items are joined as text (`query + item`, or `item + query` with
`item_first`) and tokenised whole with the tokenizer's default special tokens; a token-id query
with token-id items is concatenated as ids; any other mix is an error. An empty query or item
is allowed; only a sequence with no token at all is an error. Every problem raises
`InvalidInput` (a ValueError) naming the field.
"""

from collections.abc import Sequence

import numpy as np
import tokenizers

import _native
from engine.errors import InputTooLarge, InvalidInput

Query = str | Sequence[int]
Items = str | Sequence[str] | Sequence[Sequence[int]]


_MIXED = (
    "must be all text (str query, list of str items) or all token ids "
    "(list[int] query, list of list[int] items)"
)


def _is_id_list(x: object) -> bool:
    """A list (or other non-text sequence) that may hold token ids; its ids are checked as they
    are copied (`join_ids`), not here: scanning W2's 12,000 ids for their type alone took as
    long as joining them."""
    return type(x) is list or (isinstance(x, Sequence) and not isinstance(x, str | bytes))


def normalize_items(items: Items, max_items: int | None = None) -> list:
    """A single string item becomes a one-item list; an over-long list is an error. An empty
    list is no error (sglang answers it with no scores)."""
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, Sequence):
        raise InvalidInput("items", "must be a string, list of strings or list of token-id lists")
    if max_items is not None and len(items) > max_items:
        raise InputTooLarge("items", f"{len(items)} items exceed the limit of {max_items}")
    return list(items)


def is_text_request(query: Query, items: list) -> bool:
    """True for text query with text items, False for id lists with id lists (`join_ids` finds
    a list holding something other than an int); ValueError for any other mix."""
    if isinstance(query, str) and all(isinstance(it, str) for it in items):
        return True
    if _is_id_list(query) and all(_is_id_list(it) for it in items):
        return False
    raise InvalidInput("query/items", _MIXED)


def check_labels(label_token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The label ids as a list; ValueError unless non-empty and inside the vocabulary."""
    if (
        not _is_id_list(label_token_ids)
        or not label_token_ids
        or not all(type(t) is int for t in label_token_ids)  # a bool is no token id
    ):
        raise InvalidInput("label_token_ids", "must be a non-empty list of token ids")
    bad = [t for t in label_token_ids if not 0 <= t < vocab_size]
    if bad:
        also = f"; all outside: {bad}" if len(bad) > 1 else ""
        raise InvalidInput(
            "label_token_ids",
            f"Token ID {bad[0]} is out of vocabulary range (vocab size: {vocab_size}){also}",
        )
    return list(label_token_ids)


def check_vocabulary(ids: Sequence[int], field: str, vocab_size: int) -> None:
    """InvalidInput naming `field` for an id outside [0, vocab_size); `ids` a list, or an int32
    array (`join_ids`, the native tokenizer)."""
    if not len(ids):
        return
    low, high = (ids.min(), ids.max()) if isinstance(ids, np.ndarray) else (min(ids), max(ids))
    if low < 0 or high >= vocab_size:
        raise InvalidInput(field, f"token id outside the vocabulary [0, {vocab_size})")


def texts_to_join(query: str, items: Sequence[str], *, item_first: bool) -> list[str]:
    """The texts to tokenise whole, one per item (an empty query or item adds nothing)."""
    return [it + query if item_first else query + it for it in items]


def join_ids(
    query: Sequence[int], items: Sequence[Sequence[int]], *, item_first: bool, vocab_size: int
) -> list[np.ndarray]:
    """The id sequences i32[len(query) + len(item)], one per item (an empty query or item adds
    nothing), as views into one buffer; InvalidInput naming `query` or `items[i]` for an id
    outside the vocabulary, and `query/items` for one that is not an int (text and ids mixed).

    The ids are checked as they are copied (the query once, not once per item), and the
    sequences are arrays, not lists: 500 items of a 2,000-token prompt are a million ids, which
    as Python lists the garbage collector would walk again and again.
    """
    try:
        return _native.join_ids(query, items, item_first, vocab_size)
    except TypeError:
        raise InvalidInput("query/items", _MIXED) from None
    except ValueError as e:
        why = f"token id outside the vocabulary [0, {vocab_size})"
        raise InvalidInput(str(e), why) from None


def as_lists(seqs: Sequence[Sequence[int]]) -> list[list[int]]:
    """Sequences as lists of Python ints (what the public API answers; the engine also runs
    i32 arrays, `join_ids`)."""
    return [s.tolist() if isinstance(s, np.ndarray) else list(s) for s in seqs]


def check_sequences(seqs: Sequence[Sequence[int]], *, vocab_size: int | None, max_len: int) -> None:
    """ValueError for an empty sequence, one longer than the context, or an id outside the
    vocabulary (None: the ids were checked when they were joined, `join_ids`)."""
    for i, seq in enumerate(seqs):
        if not len(seq):
            raise InvalidInput(f"items[{i}]", "no tokens: the query and the item are both empty")
        if len(seq) > max_len:
            raise InputTooLarge(
                f"items[{i}]",
                f"sequence of {len(seq)} tokens exceeds the model context of {max_len}. "
                "Please reduce the length of the input.",
            )
        if vocab_size is not None:
            check_vocabulary(seq, f"items[{i}]", vocab_size)


def build_sequences(
    tokenizer: tokenizers.Tokenizer, query: Query, items: Items, *, item_first: bool
) -> list:
    """One token sequence per item, built with sglang `/v1/score` semantics."""
    items = normalize_items(items)
    if is_text_request(query, items):
        texts = texts_to_join(query, items, item_first=item_first)
        return [e.ids for e in tokenizer.encode_batch_fast(texts)]
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return join_ids(query, items, item_first=item_first, vocab_size=vocab_size)
