"""Cutting rerank documents to a token limit, at whole characters."""

from collections.abc import Sequence

import tokenizers

from engine.templates import Template

SIDES = ("right", "left")  # cut a document's end, or its start
TRUNCATION_MARGIN = 4  # tokens kept free when fitting: text joins can merge or split a token


def room_for_document(
    tokenizer: tokenizers.Tokenizer,
    template: Template,
    query: str,
    instruction: str | None,
    max_sequence: int,
) -> int:
    """Tokens a document may have so that its whole rerank prompt fits `max_sequence` (less a
    small margin)."""
    if template.piecewise:
        prompt = template.query_ids(tokenizer, query, instruction)
        suffix = template.document_ids(tokenizer, "", instruction)
    else:
        prompt = tokenizer.encode(template.query_text(query, instruction)).ids
        suffix = tokenizer.encode(template.document_text(""), add_special_tokens=False).ids
    return max(0, max_sequence - len(prompt) - len(suffix) - TRUNCATION_MARGIN)


def cut_documents(
    tokenizer: tokenizers.Tokenizer, documents: Sequence[str], limit: int, side: str = "right"
) -> list[str]:
    """Each document cut to its first `limit` tokens (`side` "left": its last `limit`)."""
    cut = _cut if side == "right" else _cut_start
    encodings = tokenizer.encode_batch(list(documents), add_special_tokens=False)
    return [cut(doc, enc.offsets, limit) for doc, enc in zip(documents, encodings, strict=True)]


def _cut(text: str, offsets: list[tuple[int, int]], limit: int) -> str:
    """The longest prefix of `text` made of its first `limit` tokens, in whole characters."""
    if len(offsets) <= limit:
        return text
    if limit == 0:
        return ""
    start, end = offsets[limit - 1]
    # a character split over several byte-level tokens: keep it only if all of them fit
    return text[: start if offsets[limit][0] < end else end]


def _cut_start(text: str, offsets: list[tuple[int, int]], limit: int) -> str:
    """The longest suffix of `text` made of its last `limit` tokens, in whole characters."""
    if len(offsets) <= limit:
        return text
    if limit == 0:
        return ""
    first = len(offsets) - limit
    start, before = offsets[first][0], offsets[first - 1][1]
    # a character split over several byte-level tokens: keep it only if all of them fit
    return text[before if before > start else start :]
