"""Truncation, once, on token ids: which of a text's tokens a limit keeps (its first k, or with
side "left" its last k), applied to the ids its sequence was tokenised to, never to a cut text
tokenised again.

A recipe rerank's document is cut inside its whole sequence (the recipe's text around it, as
the tokenizer encodes the joined text, or each part on its own for a piecewise recipe): its own
tokens past the limit are dropped, everything else kept as it was. Pairs and texts alone are
cut by the tokenizer itself (`engine.host.pairs`). Each peer API's fields map onto these options
in one table (`api.truncation`).
"""

from collections.abc import Sequence

import tokenizers

from engine.templates import Template

SIDES = ("right", "left")  # "right": keep the first tokens (cut the end); "left": keep the last


def kept(n: int, limit: int, side: str) -> range:
    """Which of `n` tokens a limit of `limit` keeps: all, or the first (the last) `limit`."""
    if n <= limit:
        return range(n)
    return range(limit) if side == "right" else range(n - limit, n)


def recipe_ids(
    template: Template,
    tokenizer: tokenizers.Tokenizer,
    query: str,
    documents: Sequence[str],
    instruction: str | None,
    *,
    limit: int | None,
    fit: int | None,
    side: str,
) -> tuple[list[int], list[list[int]], int]:
    """A recipe rerank's query and items as token ids, each document keeping at most `limit` of
    its own tokens and as many as let its sequence hold at most `fit` tokens (None: no bound),
    at `side`; and the tokens cut, all documents together."""
    if template.piecewise:
        prompt = template.query_ids(tokenizer, query, instruction)
        sequences = [_piecewise(template, tokenizer, d, instruction) for d in documents]
    else:
        text = template.query_text(query, instruction)
        encodings = tokenizer.encode_batch([text + template.document_text(d) for d in documents])
        sequences = [
            (enc.ids, _overlapping(enc.offsets, len(text), len(text) + len(d)))
            for d, enc in zip(documents, encodings, strict=True)
        ]
        prompt = []  # the items are whole sequences: what they share is found as they pack
    items, cut = [], 0
    for ids, inside in sequences:
        keep = len(inside) if limit is None else limit
        if fit is not None:  # the rest of its sequence stays whole
            keep = min(keep, max(0, fit - len(prompt) - (len(ids) - len(inside))))
        item = _drop(ids, inside, keep, side)
        cut += len(ids) - len(item)
        items.append(item)
    return prompt, items, cut


def _piecewise(template, tokenizer, document: str, instruction) -> tuple[list[int], list[int]]:
    """A piecewise recipe's document ids (each part tokenised on its own), and the positions
    of the document's own tokens among them."""
    parts = template.document_parts(document, instruction)
    body = template.document_format.format(document=document)
    start = template.document_format.index("{document}")
    ids: list[int] = []
    inside: list[int] = []
    for part, enc in zip(
        parts, tokenizer.encode_batch(parts, add_special_tokens=False), strict=True
    ):
        if part == body and not inside:
            own = _overlapping(enc.offsets, start, start + len(document))
            inside = [len(ids) + i for i in own]
        ids.extend(enc.ids)
    return ids, inside


def _overlapping(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """The positions of the tokens whose characters overlap [start, end) (a special token added
    to the text spans no character)."""
    return [i for i, (a, b) in enumerate(offsets) if a < end and b > start and b > a]


def _drop(ids: Sequence[int], inside: list[int], keep: int, side: str) -> list[int]:
    """`ids` without the tokens at `inside` past the `keep` that `kept` keeps."""
    if len(inside) <= keep:
        return list(ids)
    gone = set(inside) - {inside[i] for i in kept(len(inside), keep, side)}
    return [t for i, t in enumerate(ids) if i not in gone]
