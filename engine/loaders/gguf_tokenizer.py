"""Rebuilding a `tokenizers.Tokenizer` from the vocabulary a GGUF file carries in its metadata.

A GGUF has no `tokenizer.json`: llama.cpp stores the token strings, their types, the BPE merges,
the special token ids and a pre-tokenizer name (`tokenizer.ggml.pre`) instead. By default the
tokenizer built here gives the same ids as transformers' `AutoTokenizer.from_pretrained(dir,
gguf_file=...)`; `reference="llama.cpp"` follows llama.cpp where the two differ: SmolLM2's
`smollm` pre-tokenizer splits digits off one by one before the GPT-2 regex, and SentencePiece
vocabularies honour `add_space_prefix` and prefix "▁" after special tokens too.

SentencePiece Unigram vocabularies (`t5`: XLM-RoBERTa's, in llama.cpp's cross-encoder files) are
rebuilt as the original `tokenizer.json` tokenises, pairs included (`<s> A </s></s> B </s>`).
"""

import os
from collections.abc import Callable
from typing import Any, Literal

from gguf import TokenType
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
)
from tokenizers.models import BPE, Unigram

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import GGUFFile, metadata_value
from engine.loaders.gguf_special_tokens import (
    add_whole_tokens,
    pair_post_processor,
    post_processor,
)
from engine.text.byte_level import BYTE_ALPHABET, LLAMA3_SPLIT, QWEN2_SPLIT

Reference = Literal["transformers", "llama.cpp"]

_METASPACE = "\u2581"


def tokenizer_from_gguf(
    reader: GGUFFile, path: str | os.PathLike, *, reference: Reference = "transformers"
) -> Tokenizer:
    """The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.

    Supports `tokenizer.ggml.model` `gpt2` (byte-level BPE), `llama` (SentencePiece BPE with
    byte fallback) and `t5` (SentencePiece Unigram, as in cross-encoder files). Control and
    user-defined tokens are matched whole; BOS/EOS are added by a `TemplateProcessing`
    post-processor exactly when `add_bos_token`/`add_eos_token` say so (absent: no BOS for
    `gpt2`, BOS for `llama`, as llama.cpp and transformers do); `t5` vocabularies get a
    cross-encoder's pair template (`_pair_post_processor`).

    `reference` picks whose ids to reproduce where transformers and llama.cpp disagree (see the
    module docstring); the default matches transformers.
    """
    if reference not in _PRE_TOKENIZERS:
        raise ValueError(f"reference must be 'transformers' or 'llama.cpp', not {reference!r}")
    model = metadata_value(reader, "tokenizer.ggml.model", path)
    tokens = metadata_value(reader, "tokenizer.ggml.tokens", path)
    token_types = metadata_value(reader, "tokenizer.ggml.token_type", path, None)
    if token_types is not None and len(token_types) != len(tokens):
        raise CheckpointError(
            f"{os.fspath(path)}: tokenizer.ggml.token_type has {len(token_types)} entries "
            f"for {len(tokens)} tokens"
        )
    if model == "gpt2":
        vocab = _spelled_vocab(tokens)
        tokenizer = _byte_level_tokenizer(reader, path, vocab, reference)
        post = post_processor(reader, path, tokens, add_bos_default=False)
    elif model == "llama":
        vocab = {token: index for index, token in enumerate(tokens)}
        tokenizer = _sentencepiece_tokenizer(reader, path, tokens, vocab, reference)
        post = post_processor(reader, path, tokens, add_bos_default=True)
    elif model == "t5":
        vocab = {token: index for index, token in enumerate(tokens)}
        tokenizer = _unigram_tokenizer(reader, path, tokens, token_types or [])
        post = pair_post_processor(reader, path, tokens)
    else:
        raise CheckpointError(
            f"{os.fspath(path)}: unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
            "supported: 'gpt2', 'llama', 't5'"
        )
    add_whole_tokens(reader, path, tokenizer, tokens, token_types or [], vocab)
    tokenizer.post_processor = post
    return tokenizer


# --- byte-level BPE ("gpt2") ---------------------------------------------------------------------


_BYTE_CHARS = frozenset(BYTE_ALPHABET.values())


def _spell(token: str) -> str:
    """A token as the byte-level BPE model knows it.

    Vocabulary entries are stored in the byte alphabet already; a few files carry special tokens
    spelled in plain UTF-8 (e.g. with full-width bars), which are respelled byte by byte.
    """
    if set(token) <= _BYTE_CHARS:
        return token
    return "".join(BYTE_ALPHABET[byte] for byte in token.encode("utf-8"))


def _spelled_vocab(tokens: list[str]) -> dict[str, int]:
    """Token string (byte alphabet) -> id; on a clash the later id wins, as in transformers."""
    return {_spell(token): index for index, token in enumerate(tokens)}


def _byte_level_tokenizer(
    reader: GGUFFile, path: str | os.PathLike, vocab: dict[str, int], reference: Reference
) -> Tokenizer:
    merges = metadata_value(reader, "tokenizer.ggml.merges", path)
    pre = metadata_value(reader, "tokenizer.ggml.pre", path, "default")
    model = _bpe(
        path,
        vocab=vocab,
        merges=[_merge_pair(merge, path) for merge in merges],
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(pre, path, reference)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _bpe(path: str | os.PathLike, **options: Any) -> BPE:
    """A BPE model; inconsistent vocab/merges become a `CheckpointError`."""
    try:
        return BPE(dropout=None, **options)
    except Exception as error:  # tokenizers raises a bare Exception
        raise CheckpointError(
            f"{os.fspath(path)}: invalid tokenizer vocabulary: {error}"
        ) from error


def _merge_pair(merge: str, path: str | os.PathLike) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise CheckpointError(f"{os.fspath(path)}: malformed tokenizer.ggml.merges entry {merge!r}")
    return parts[0], parts[1]


def _gpt2_regex() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2_regex() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_regex()])


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


# `tokenizer.ggml.pre` -> pre-tokenizer. transformers has no special case for `smollm` and splits
# it with the GPT-2 regex alone, where llama.cpp splits digits off first. transformers also reads a
# missing or "default" name as GPT-2, which llama.cpp does not, so the llama.cpp table omits it.
_PRE_TOKENIZERS: dict[Reference, dict[str, Callable[[], pre_tokenizers.PreTokenizer]]] = {
    "transformers": {
        "default": _gpt2_regex,
        "gpt-2": _gpt2_regex,
        "smollm": _gpt2_regex,
        "llama-bpe": _split_then_bytes(LLAMA3_SPLIT),
        "llama3": _split_then_bytes(LLAMA3_SPLIT),
        "llama-v3": _split_then_bytes(LLAMA3_SPLIT),
        "smaug-bpe": _split_then_bytes(LLAMA3_SPLIT),
        "qwen2": _split_then_bytes(QWEN2_SPLIT),
        "deepseek-r1-qwen": _split_then_bytes(QWEN2_SPLIT),
    },
}
_PRE_TOKENIZERS["llama.cpp"] = {
    **{pre: build for pre, build in _PRE_TOKENIZERS["transformers"].items() if pre != "default"},
    "smollm": _digits_then_gpt2_regex,
}


def _byte_level_pre_tokenizer(
    pre: str, path: str | os.PathLike, reference: Reference
) -> pre_tokenizers.PreTokenizer:
    table = _PRE_TOKENIZERS[reference]
    build = table.get(pre)
    if build is None:
        raise CheckpointError(
            f"{os.fspath(path)}: unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); "
            f"supported: {sorted(table)}"
        )
    return build()


# --- SentencePiece BPE ("llama") -----------------------------------------------------------------


def _sentencepiece_tokenizer(
    reader: GGUFFile,
    path: str | os.PathLike,
    tokens: list[str],
    vocab: dict[str, int],
    reference: Reference,
) -> Tokenizer:
    merges = metadata_value(reader, "tokenizer.ggml.merges", path, None)
    if merges is None:
        scores = metadata_value(reader, "tokenizer.ggml.scores", path)
        pairs = _merges_from_scores(tokens, scores, vocab)
    else:
        pairs = [_merge_pair(merge, path) for merge in merges]
    tokenizer = Tokenizer(_bpe(path, vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True))
    prefix = _space_prefix(reader, path, reference)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_METASPACE, prepend_scheme=prefix, split=False
    )
    strip = [decoders.Strip(content=" ", left=1, right=0)] if prefix != "never" else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_METASPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _space_prefix(reader: GGUFFile, path: str | os.PathLike, reference: Reference) -> str:
    """Metaspace `prepend_scheme`.

    transformers prefixes "▁" to the start of the text only, whatever `add_space_prefix` says;
    llama.cpp honours the flag and prefixes every stretch of text, including those right after a
    special or added token.
    """
    if reference == "transformers":
        return "first"
    add_prefix = metadata_value(reader, "tokenizer.ggml.add_space_prefix", path, True)
    return "always" if add_prefix else "never"


def _merges_from_scores(
    tokens: list[str], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two vocabulary
    pieces, best-scored token first; ties go to longer left, then longer right pieces, then file
    order, then piece ids."""
    candidates = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        splits = [
            (token[:cut], token[cut:])
            for cut in range(1, len(token))
            if token[:cut] in vocab and token[cut:] in vocab
        ]
        splits.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        candidates.extend((left, right, score) for left, right in splits)
    candidates.sort(key=lambda merge: (-merge[2], -len(merge[0]), -len(merge[1])))
    return [(left, right) for left, right, _ in candidates]


# --- SentencePiece Unigram ("t5") ---------------------------------------------------------------


def _unigram_tokenizer(
    reader: GGUFFile, path: str | os.PathLike, tokens: list[str], token_types: list[int]
) -> Tokenizer:
    """The pipeline transformers' XLMRobertaTokenizer builds around the same pieces, scores and
    charsmap: the charsmap normalises, whitespace splits the text into words (runs of
    whitespace count as one, none is kept at either end, as llama.cpp's
    `remove_extra_whitespaces` does), each word gets a "▁" prefix when `add_space_prefix` is
    set (absent: set), and Unigram picks the best-scored pieces.
    """
    scores = metadata_value(reader, "tokenizer.ggml.scores", path)
    if len(scores) != len(tokens):
        raise CheckpointError(
            f"{os.fspath(path)}: tokenizer.ggml.scores has {len(scores)} entries "
            f"for {len(tokens)} tokens"
        )
    pieces = _unigram_pieces(tokens, scores, token_types)
    byte_fallback = TokenType.BYTE in token_types
    unk_id = _unknown_id(reader, path, token_types)
    try:
        model = Unigram(pieces, unk_id=unk_id, byte_fallback=byte_fallback)
    except Exception as error:  # tokenizers raises a bare Exception
        raise CheckpointError(
            f"{os.fspath(path)}: invalid tokenizer vocabulary: {error}"
        ) from error
    tokenizer = Tokenizer(model)
    charsmap = metadata_value(reader, "tokenizer.ggml.precompiled_charsmap", path, None)
    if charsmap:
        try:
            tokenizer.normalizer = normalizers.Precompiled(bytes(charsmap))
        except Exception as error:  # tokenizers raises a bare Exception
            raise CheckpointError(
                f"{os.fspath(path)}: invalid tokenizer.ggml.precompiled_charsmap: {error}"
            ) from error
    add_prefix = metadata_value(reader, "tokenizer.ggml.add_space_prefix", path, True)
    scheme = "always" if add_prefix else "never"
    metaspace = pre_tokenizers.Metaspace(replacement=_METASPACE, prepend_scheme=scheme)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])
    tokenizer.decoder = decoders.Metaspace(replacement=_METASPACE, prepend_scheme=scheme)
    return tokenizer


def _unigram_pieces(
    tokens: list[str], scores: list[float], token_types: list[int]
) -> list[tuple[str, float]]:
    """(piece, score) by id.

    Entries llama.cpp's converter pads the vocabulary with (UNUSED, `[PAD{id}]`, score -10000)
    are not in the original tokenizer. Kept as they are they would lower the least score, from
    which Unigram prices unknown characters (least score - 10), and so change how text with
    unknown characters splits; they are scored as the least real piece instead and spelled with
    a space, which no pre-tokenized word contains, so they never match.
    """
    unused = {i for i, kind in enumerate(token_types) if kind == TokenType.UNUSED}
    real = [score for i, score in enumerate(scores) if i not in unused]
    least = min(real, default=0.0)
    return [
        (f" {token}", least) if i in unused else (token, float(score))
        for i, (token, score) in enumerate(zip(tokens, scores, strict=True))
    ]


def _unknown_id(reader: GGUFFile, path: str | os.PathLike, token_types: list[int]) -> int | None:
    """`unknown_token_id`, else the first token typed UNKNOWN, else none."""
    token_id = metadata_value(reader, "tokenizer.ggml.unknown_token_id", path, None)
    if token_id is not None:
        return int(token_id)
    return next((i for i, kind in enumerate(token_types) if kind == TokenType.UNKNOWN), None)


# --- added tokens and post-processing ------------------------------------------------------------
