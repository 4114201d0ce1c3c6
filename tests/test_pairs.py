"""Pair encoding: an embedder's texts encoded alone natively give the reference's ids, cuts and
errors."""

import pytest
from tokenizers import Tokenizer, processors

from bench.encoders import write_encoder
from engine.errors import InputTooLarge, InvalidInput
from engine.host.inputs import as_lists
from engine.host.pairs import PairEncoder, PairOptions
from engine.text import native_tokenizer
from engine.text.native_tokenizer import NativeTokenizer, ReferenceTokenizer
from tests.conftest import CORPUS, TINY_ENCODER, tiny_tokenizer


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


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A BERT pair tokenizer (token types 0 and 1, [CLS] and [SEP]), as a cross-encoder's."""
    path = tmp_path_factory.mktemp("pairs") / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    options = dict(seed=3, corpus=CORPUS, model_max_length=96, vocab=300, perturb=0.3)
    write_encoder(path, "BertConfig", fields, "bert", **options)
    return Tokenizer.from_file(str(path / "tokenizer.json"))


@pytest.mark.parametrize("side", ["right", "left"])
def test_an_items_own_tokens_are_cut_before_the_pair_is_made(bert, side):
    """`item_limit` (a rerank's max_tokens_per_doc) keeps the item's first (last) k token ids,
    then makes the pair as encoding it would: special tokens, types, the pair's own limit."""
    pairs = PairEncoder(bert, vocab_size=300, type_vocab_size=2)
    query, docs = "Where does the fox jump?", [CORPUS[0] * 3, "short", CORPUS[2]]
    got = pairs.encode(query, docs, PairOptions(limit=96, side=side, item_limit=5))
    cls, sep = bert.token_to_id("[CLS]"), bert.token_to_id("[SEP]")
    q = bert.encode(query, add_special_tokens=False).ids
    removed = 0
    for doc, ids in zip(docs, got.sequences, strict=True):
        own = bert.encode(doc, add_special_tokens=False).ids
        keep = own[:5] if side == "right" else own[-5:]
        removed += len(own) - len(keep)
        coded = [cls, *q, sep] + [300 + t for t in [*keep, sep]]  # type 1: coded past the vocab
        assert ids == coded
    assert got.truncated == removed > 0
    plain = pairs.encode(query, docs, PairOptions(limit=96, side=side))
    assert plain.sequences[1] == got.sequences[1]  # an item under the limit is as it was
