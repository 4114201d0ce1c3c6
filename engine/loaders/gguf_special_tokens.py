"""The special tokens of a tokenizer rebuilt from GGUF metadata (`engine.loaders.gguf_tokenizer`):
whole tokens added as such, and the post-processor that adds BOS/EOS to a sequence or a pair."""

import os
from typing import Any

from gguf import TokenType
from tokenizers import AddedToken, Tokenizer, processors

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import GGUFFile, metadata_value

_NAMED_SPECIAL_IDS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
)


def add_whole_tokens(
    reader: GGUFFile,
    path: str | os.PathLike,
    tokenizer: Tokenizer,
    tokens: list[str],
    token_types: list[int],
    vocab: dict[str, int],
) -> None:
    """Register control tokens (and the named bos/eos/unk/pad) as special and user-defined tokens
    as plain added tokens, so text containing them is matched whole instead of split into pieces.

    Only tokens whose own spelling is in the vocabulary are added: adding any other string would
    mint a new id past the embedding table.
    """
    typed = list(zip(tokens, token_types, strict=True))
    special = [token for token, kind in typed if kind == TokenType.CONTROL and token in vocab]
    for key in _NAMED_SPECIAL_IDS:
        token_id = metadata_value(reader, key, path, None)
        if token_id is not None and token_id < len(tokens) and tokens[token_id] in vocab:
            special.append(tokens[token_id])
    user = [token for token, kind in typed if kind == TokenType.USER_DEFINED and token in vocab]
    special_set = set(special)
    tokenizer.add_special_tokens(
        [AddedToken(token, normalized=False, special=True) for token in dict.fromkeys(special)]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, normalized=False, special=False)
            for token in dict.fromkeys(user)
            if token not in special_set
        ]
    )


def post_processor(
    reader: GGUFFile, path: str | os.PathLike, tokens: list[str], *, add_bos_default: bool
) -> processors.PostProcessor | None:
    """BOS/EOS around each sequence as the file asks; None when neither is added."""
    add_bos = metadata_value(reader, "tokenizer.ggml.add_bos_token", path, add_bos_default)
    add_eos = metadata_value(reader, "tokenizer.ggml.add_eos_token", path, False)
    if not add_bos and not add_eos:
        return None
    # Template names are placeholders (token strings may contain ':', which templates reserve).
    specials = []
    if add_bos:
        specials.append(_special_token(reader, path, tokens, "bos"))
    if add_eos:
        specials.append(_special_token(reader, path, tokens, "eos"))

    def sequence(name: str, type_id: int) -> list[str]:
        before = [f"BOS:{type_id}"] if add_bos else []
        after = [f"EOS:{type_id}"] if add_eos else []
        return [*before, f"${name}:{type_id}", *after]

    single = sequence("A", 0)
    return processors.TemplateProcessing(
        single=single, pair=[*single, *sequence("B", 1)], special_tokens=specials
    )


# llama.cpp spells the separator's key so (gguf-py `Keys.Tokenizer.SEP_ID`)
_SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
}


def pair_post_processor(
    reader: GGUFFile, path: str | os.PathLike, tokens: list[str]
) -> processors.PostProcessor:
    """A cross-encoder's template, as llama.cpp's `format_prompt_rerank` lays a pair out:
    `[BOS] A [EOS] [SEP] B [EOS]`, each special where its `add_*_token` flag says so, one text
    `[BOS] A [EOS]`; type ids are 0 throughout, as llama.cpp feeds them. A flag that is absent
    (files converted before gguf-py wrote them) counts as set when the file names the token, as
    llama.cpp's rerank formatting then added all three. XLM-RoBERTa's (`<s>`, `</s>`, `</s>`)
    give transformers' `<s> A </s></s> B </s>`.
    """

    def flag(name: str) -> bool:
        named = metadata_value(reader, _SPECIAL_ID_KEYS[name], path, None) is not None
        return bool(metadata_value(reader, f"tokenizer.ggml.add_{name}_token", path, named))

    added = {name: flag(name) for name in _SPECIAL_ID_KEYS}
    specials = [_special_token(reader, path, tokens, name) for name in added if added[name]]

    def marks(name: str) -> list[str]:
        return [f"{name.upper()}:0"] if added[name] else []

    single = [*marks("bos"), "$A:0", *marks("eos")]
    pair = [*single, *marks("sep"), "$B:0", *marks("eos")]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _special_token(
    reader: GGUFFile, path: str | os.PathLike, tokens: list[str], name: str
) -> dict[str, Any]:
    key = _SPECIAL_ID_KEYS[name]
    token_id = metadata_value(reader, key, path, None)
    if token_id is None or not 0 <= token_id < len(tokens):
        raise CheckpointError(
            f"{os.fspath(path)}: tokenizer.ggml.add_{name}_token is set but {key!r} is missing "
            "or out of range"
        )
    return {"id": name.upper(), "ids": [token_id], "tokens": [tokens[token_id]]}
