"""Truncation on token ids (`engine.host.truncation`): a recipe rerank's document keeps exactly
its first (or last) k tokens of the sequence it was tokenised into, everything around it as it
was; never a cut text tokenised again."""

import pytest

from engine.host.truncation import kept
from engine.templates import MXBAI_RERANK_V2, PLAIN
from tests.conftest import tiny_tokenizer

DOCS = ["The quick brown fox jumps over the lazy dog.", "short", "", "東京東京 river"]
QUERY = "Where does the fox jump?"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_a_limit_keeps_the_first_or_the_last_tokens():
    assert list(kept(5, 3, "right")) == [0, 1, 2]
    assert list(kept(5, 3, "left")) == [2, 3, 4]
    assert list(kept(2, 3, "left")) == [0, 1] and list(kept(4, 0, "right")) == []


def whole(tok, doc: str) -> tuple[list[int], list[int]]:
    """The plain recipe's sequence of `doc`, and the positions of the document's own tokens."""
    text = PLAIN.query_text(QUERY, None)
    enc = tok.encode(text + PLAIN.document_text(doc))
    start, end = len(text), len(text) + len(doc)
    return enc.ids, [i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start and b > a]


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_joined_recipe_drops_the_documents_own_tokens_past_the_limit(tok, side):
    prompt, items, cut = recipe_ids(tok, DOCS, side=side, limit=3)
    assert prompt == []  # each item is its whole sequence
    removed = 0
    for doc, item in zip(DOCS, items, strict=True):
        ids, own = whole(tok, doc)
        gone = own[3:] if side == "right" else own[:-3]
        assert item == [t for i, t in enumerate(ids) if i not in gone]  # the ids themselves
        removed += len(gone)
    assert cut == removed > 0


def test_fitting_keeps_the_rest_of_the_sequence_whole(tok):
    ids, own = whole(tok, DOCS[0])
    fit = len(ids) - len(own) + 4  # room for four of the document's tokens
    _, (item,), cut = recipe_ids(tok, DOCS[:1], side="right", fit=fit)
    assert len(item) == fit and cut == len(own) - 4
    assert item == [t for i, t in enumerate(ids) if i not in own[4:]]
    _, (none,), _ = recipe_ids(tok, DOCS[:1], side="right", fit=len(ids) - len(own) - 5)
    assert none == [t for i, t in enumerate(ids) if i not in own]  # no room: the document goes


def test_a_piecewise_recipe_cuts_the_documents_part_alone(tok):
    prompt, items, _ = recipe_ids(tok, DOCS[:1], side="left", limit=2, template=MXBAI_RERANK_V2)
    assert prompt == MXBAI_RERANK_V2.query_ids(tok, QUERY, None)
    parts = MXBAI_RERANK_V2.document_parts(DOCS[0])
    encoded = [tok.encode(p, add_special_tokens=False) for p in parts]
    own = [t for t, (a, b) in zip(encoded[1].ids, encoded[1].offsets, strict=True) if b > 10]
    body = [t for t, (a, b) in zip(encoded[1].ids, encoded[1].offsets, strict=True) if b <= 10]
    want = [*encoded[0].ids, *body, *own[-2:], *(i for e in encoded[2:] for i in e.ids)]
    assert items == [want]


def recipe_ids(tok, docs, *, side, limit=None, fit=None, template=PLAIN):
    from engine.host import truncation

    args = (template, tok, QUERY, docs, None)
    return truncation.recipe_ids(*args, limit=limit, fit=fit, side=side)
