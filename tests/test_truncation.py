"""Cutting rerank documents to a token limit at whole characters."""

import pytest

from engine.host.truncation import TRUNCATION_MARGIN, cut_documents, room_for_document
from engine.templates import PLAIN
from tests.conftest import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_documents_are_cut_to_their_first_tokens(tok):
    docs = ["The quick brown fox jumps over the lazy dog.", "short", ""]
    cut = cut_documents(tok, docs, 3)
    for doc, got in zip(docs, cut, strict=True):
        ids = tok.encode(doc, add_special_tokens=False).ids
        assert doc.startswith(got)
        assert tok.encode(got, add_special_tokens=False).ids == ids[:3]
    assert cut[0] != docs[0] and cut[2] == ""
    assert cut_documents(tok, docs, 0) == ["", "", ""]


def test_a_character_split_over_tokens_is_kept_whole_or_dropped(tok):
    text = "東京東京"  # byte-level: each character spans several tokens
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text)
    for limit in range(len(ids) + 1):
        (got,) = cut_documents(tok, [text], limit)
        assert text.startswith(got)  # whole characters only
        assert len(tok.encode(got, add_special_tokens=False).ids) <= limit


def test_the_left_side_keeps_the_last_tokens(tok):
    docs = ["The quick brown fox jumps over the lazy dog.", "short", ""]
    cut = cut_documents(tok, docs, 3, side="left")
    for doc, got in zip(docs, cut, strict=True):
        ids = tok.encode(doc, add_special_tokens=False).ids
        assert doc.endswith(got)
        assert tok.encode(got, add_special_tokens=False).ids == ids[-3:] if ids else got == ""
    assert cut[0] == " lazy dog." or len(cut[0]) < len(docs[0])
    text = "東京東京"
    ids = tok.encode(text, add_special_tokens=False).ids
    for limit in range(len(ids) + 1):
        (got,) = cut_documents(tok, [text], limit, side="left")
        assert text.endswith(got)  # whole characters only
        assert len(tok.encode(got, add_special_tokens=False).ids) <= limit
    assert cut_documents(tok, [text], len(ids), side="left") == [text]


def test_room_leaves_the_prompt_and_a_margin(tok):
    prompt = tok.encode(PLAIN.query_text("q?", None)).ids
    suffix = tok.encode(PLAIN.document_text(""), add_special_tokens=False).ids
    room = room_for_document(tok, PLAIN, "q?", None, 500)
    assert room == 500 - len(prompt) - len(suffix) - TRUNCATION_MARGIN
    assert room_for_document(tok, PLAIN, "q?", None, 3) == 0
