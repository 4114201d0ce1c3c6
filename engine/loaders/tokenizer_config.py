"""The special tokens a Hugging Face directory's tokenizer configuration names
(`tokenizer_config.json`, then `special_tokens_map.json`): which token is its cls, mask, pad,
unk..., by their names there ("mask_token")."""

import json
from pathlib import Path

import tokenizers

_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def special_tokens(root: Path) -> dict[str, str]:
    """Each named special token's text, by name ("cls_token": "[CLS]"), of the directory
    `root`; the later file wins where both name one."""
    named = {}
    for name in _FILES:
        path = root / name
        if path.is_file():
            config = json.loads(path.read_text())
            named |= {k: v for k, v in config.items() if k.endswith("_token") and v}
    return {k: v["content"] if isinstance(v, dict) else v for k, v in named.items()}


def special_ids(root: Path, tokenizer: tokenizers.Tokenizer, names) -> dict[str, int]:
    """The ids of the special tokens of `names` ("mask_token", ...) the directory `root` names
    and `tokenizer` has."""
    tokens = special_tokens(root)
    ids = {n: tokenizer.token_to_id(tokens[n]) for n in names if isinstance(tokens.get(n), str)}
    return {n: i for n, i in ids.items() if i is not None}
