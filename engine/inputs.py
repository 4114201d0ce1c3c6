"""Turning a score call's query, items and labels into token sequences, with sglang's semantics.

Text query with text items are joined as text (`query + item`, or `item + query` with
`item_first`) and tokenised whole with the tokenizer's default special tokens; a token-id query
with token-id items is concatenated as ids; any other mix is an error. An empty query or item
is allowed; only a sequence with no token at all is an error. Every problem raises
`InvalidInput` (a ValueError) naming the field.
"""

from collections.abc import Sequence

import tokenizers

from engine.errors import InputTooLarge, InvalidInput

Query = str | Sequence[int]
Items = str | Sequence[str] | Sequence[Sequence[int]]


def _is_ids(x) -> bool:
    # every element exactly an int (a bool is no token id), in one pass at C speed: a W2 request
    # is 12,000 ids
    return isinstance(x, Sequence) and not isinstance(x, str) and set(map(type, x)) <= {int}


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
    """True for text query with text items, False for ids with ids; ValueError for any mix."""
    if isinstance(query, str) and all(isinstance(it, str) for it in items):
        return True
    if _is_ids(query) and all(_is_ids(it) for it in items):
        return False
    raise InvalidInput(
        "query/items",
        "must be all text (str query, list of str items) or all token ids "
        "(list[int] query, list of list[int] items)",
    )


def check_labels(label_token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The label ids as a list; ValueError unless non-empty and inside the vocabulary."""
    if isinstance(label_token_ids, str) or not _is_ids(label_token_ids) or not label_token_ids:
        raise InvalidInput("label_token_ids", "must be a non-empty list of token ids")
    bad = [t for t in label_token_ids if not 0 <= t < vocab_size]
    if bad:
        also = f"; all outside: {bad}" if len(bad) > 1 else ""
        raise InvalidInput(
            "label_token_ids",
            f"Token ID {bad[0]} is out of vocabulary range (vocab size: {vocab_size}){also}",
        )
    return list(label_token_ids)


def check_ids(query: Sequence[int], items: Sequence[Sequence[int]], vocab_size: int) -> None:
    """ValueError naming `query` or `items[i]` for an id outside the vocabulary. Checked before
    the two are joined: the query once, not once per item (500 items of a 2,000-token prompt
    would be a million ids)."""
    _check_vocabulary(query, "query", vocab_size)
    for i, item in enumerate(items):
        _check_vocabulary(item, f"items[{i}]", vocab_size)


def _check_vocabulary(ids: Sequence[int], field: str, vocab_size: int) -> None:
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        raise InvalidInput(field, f"token id outside the vocabulary [0, {vocab_size})")


def texts_to_join(query: str, items: Sequence[str], *, item_first: bool) -> list[str]:
    """The texts to tokenise whole, one per item (an empty query or item adds nothing)."""
    return [it + query if item_first else query + it for it in items]


def join_ids(query: Sequence[int], items: Sequence[Sequence[int]], *, item_first: bool):
    """The id sequences, one per item (an empty query or item adds nothing)."""
    query = list(query)
    return [[*it, *query] if item_first else [*query, *it] for it in items]


def check_sequences(seqs: Sequence[Sequence[int]], *, vocab_size: int | None, max_len: int) -> None:
    """ValueError for an empty sequence, one longer than the context, or an id outside the
    vocabulary (None: the ids were checked before they were joined, `check_ids`)."""
    for i, seq in enumerate(seqs):
        if not seq:
            raise InvalidInput(f"items[{i}]", "no tokens: the query and the item are both empty")
        if len(seq) > max_len:
            raise InputTooLarge(
                f"items[{i}]",
                f"sequence of {len(seq)} tokens exceeds the model context of {max_len}. "
                "Please reduce the length of the input.",
            )
        if vocab_size is not None:
            _check_vocabulary(seq, f"items[{i}]", vocab_size)


def build_sequences(
    tokenizer: tokenizers.Tokenizer, query: Query, items: Items, *, item_first: bool
) -> list[list[int]]:
    """One token sequence per item, built with sglang `/v1/score` semantics (unvalidated ids)."""
    items = normalize_items(items)
    if is_text_request(query, items):
        texts = texts_to_join(query, items, item_first=item_first)
        return [e.ids for e in tokenizer.encode_batch(texts)]
    return join_ids(query, items, item_first=item_first)
