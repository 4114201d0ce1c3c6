"""Pair encoding: an embedder's texts encoded alone natively give the reference's ids, cuts and
errors."""

import pytest
from tokenizers import processors

from engine.errors import InputTooLarge, InvalidInput
from engine.host.inputs import as_lists
from engine.host.pairs import PairEncoder, PairOptions
from engine.text import native_tokenizer
from engine.text.native_tokenizer import NativeTokenizer, ReferenceTokenizer
from tests.conftest import CORPUS, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    """A byte-level BPE closing every text with `<|endoftext|>`, as Qwen3-Embedding's does."""
    tok = tiny_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)]
    )
    return tok


def encoders(tok):
    return [
        PairEncoder(tok, vocab_size=300, type_vocab_size=1, native=native)
        for native in (True, False)
    ]


@pytest.mark.skipif(native_tokenizer._byte_bpe is None, reason="_native._byte_bpe is not built")
@pytest.mark.parametrize("side", ["right", "left"])
def test_texts_alone_are_native_and_equal_the_reference(tok, side):
    native, reference = encoders(tok)
    assert isinstance(native.texts, NativeTokenizer)
    assert isinstance(reference.texts, ReferenceTokenizer)
    texts = [*CORPUS, "", "ünïcödé 😀 text", "word " * 40]
    options = PairOptions(limit=24, side=side)
    ours, theirs = native.encode_texts(texts, options), reference.encode_texts(texts, options)
    assert as_lists(ours.sequences) == theirs.sequences and ours.truncated == theirs.truncated
    assert ours.truncated > 0 and max(map(len, ours.sequences)) == 24
    assert all(s[-1] == tok.token_to_id("<|endoftext|>") for s in ours.sequences if len(s) < 24)


def test_errors_name_the_text_either_way(tok):
    for pairs in encoders(tok):
        long = PairOptions(limit=8, truncate=False)
        with pytest.raises(InputTooLarge, match=r"^items\[1\]: 161 tokens exceed the model's lim"):
            pairs.encode_texts(["short", "word " * 40], long)
        native = isinstance(pairs.texts, NativeTokenizer)
        small = PairEncoder(tok, vocab_size=100, type_vocab_size=1, native=native)
        with pytest.raises(InvalidInput, match=r"^items\[0\]: token id outside"):
            small.encode_texts(["zebra quixotic xylophone"], PairOptions(limit=64))
