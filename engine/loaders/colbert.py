"""Late-interaction (ColBERT) directories, in the two formats people serve:

- PyLate's: a sentence-transformers directory whose `modules.json` names a Transformer then one
  Dense module (the projection of every token's state, no Pooling), and whose
  `config_sentence_transformers.json` gives the query and document markers
  (`query_prefix`, `document_prefix`: tokens of the tokenizer), their lengths, query expansion
  and the document skiplist; PyLate's defaults where a field is absent.
- colbert-ir's (Stanford's `HF_ColBERT`): a BERT checkpoint whose `linear.weight` is the
  projection, with `artifact.metadata` giving markers and lengths (defaults `[unused0]`,
  `[unused1]`, 32 and 180).

Read here into the model's `ColBERT` and its `colbert_proj*` parameters. A skiplist word the
vocabulary lacks stands for the unknown token, as `convert_tokens_to_ids` makes it.
"""

import json
import string
from pathlib import Path

import numpy as np
import tokenizers
from safetensors.numpy import load_file

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.tokenizer_config import special_ids
from engine.models.config import ColBERT, ModelConfig

STANFORD = "HF_ColBERT"  # colbert-ir's architecture name in config.json
_SETTINGS = "config_sentence_transformers.json"
_IDENTITY = "torch.nn.modules.linear.Identity"
# PyLate's defaults, and colbert-ir's where they differ
_PYLATE = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
}
_STANFORD_NAMES = {  # artifact.metadata's names of PyLate's settings
    "query_token_id": "query_prefix",
    "doc_token_id": "document_prefix",
    "query_maxlen": "query_length",
    "doc_maxlen": "document_length",
    "attend_to_mask_tokens": "attend_to_expansion_tokens",
}


def is_colbert(root: Path, architectures: list | None) -> bool:
    """Whether `root` is a ColBERT directory of either format (see the module docstring)."""
    if architectures == [STANFORD]:
        return True
    path = root / "modules.json"
    if not path.is_file():
        return False
    kinds = [str(m.get("type", "")).rpartition(".")[2] for m in json.loads(path.read_text())]
    return len(kinds) >= 2 and kinds[0] == "Transformer" and all(k == "Dense" for k in kinds[1:])


def read_colbert(
    root: Path, cfg: ModelConfig, tokenizer: tokenizers.Tokenizer, architectures: list | None
) -> ColBERT:
    """The encoding of the ColBERT directory `root` of an encoder of `cfg`; CheckpointError
    naming the file for what is not supported."""
    stanford = architectures == [STANFORD]
    settings = _stanford_settings(root) if stanford else _pylate_settings(root)
    markers = {
        role: _marker(root, tokenizer, settings[f"{role}_prefix"]) for role in ("query", "document")
    }
    expand = bool(settings["do_query_expansion"])
    limit = cfg.max_position_embeddings
    for role in ("query", "document"):
        length = settings[f"{role}_length"]
        if not (isinstance(length, int) and 2 <= length <= limit):
            raise CheckpointError(f"{root}: {role}_length must be from 2 to {limit}; got {length}")
    weight = _projection(root, cfg, stanford)[0]
    return ColBERT(
        dim=weight.shape[1],
        query_marker=markers["query"],
        document_marker=markers["document"],
        query_length=settings["query_length"],
        document_length=settings["document_length"],
        expand=expand,
        attend_expansion=expand and bool(settings["attend_to_expansion_tokens"]),
        pad_id=_pad_id(root, tokenizer),
        skiplist=_skiplist(root, tokenizer, settings.get("skiplist_words")),
        prompts=tuple((settings.get("prompts") or {}).items()),
        default_prompt=settings.get("default_prompt_name"),
    )


def colbert_params(root: Path, cfg: ModelConfig, architectures: list | None) -> dict:
    """The projection's host params: colbert_proj f32[E, D], colbert_proj_b f32[D] (zeros
    without a bias)."""
    weight, bias = _projection(root, cfg, architectures == [STANFORD])
    return {"colbert_proj": weight, "colbert_proj_b": bias}


def _pylate_settings(root: Path) -> dict:
    path = root / _SETTINGS
    given = json.loads(path.read_text()) if path.is_file() else {}
    return _PYLATE | {k: v for k, v in given.items() if v is not None}


def _stanford_settings(root: Path) -> dict:
    path = root / "artifact.metadata"
    given = json.loads(path.read_text()) if path.is_file() else {}
    ours = {_STANFORD_NAMES[k]: v for k, v in given.items() if k in _STANFORD_NAMES}
    return _PYLATE | {"query_prefix": "[unused0]", "document_prefix": "[unused1]"} | ours


def _marker(root: Path, tokenizer: tokenizers.Tokenizer, prefix) -> int | None:
    """The id of a marker token (None: no marker, an empty prefix)."""
    if prefix == "":
        return None
    marker = tokenizer.token_to_id(prefix) if isinstance(prefix, str) else None
    if marker is None:
        raise CheckpointError(f"{root}: the tokenizer has no marker token {prefix!r}")
    return marker


def _pad_id(root: Path, tokenizer: tokenizers.Tokenizer) -> int:
    """A query's expansion token: the mask token, else the end-of-sequence one, else the pad
    token (PyLate's choice)."""
    ids = special_ids(root, tokenizer, ("mask_token", "eos_token", "pad_token"))
    for name in ("mask_token", "eos_token", "pad_token"):
        if name in ids:
            return ids[name]
    raise CheckpointError(f"{root}: the tokenizer names no mask, eos or pad token to expand with")


def _skiplist(root: Path, tokenizer: tokenizers.Tokenizer, words) -> tuple[int, ...]:
    """The ids of the skiplist's words (PyLate's default: ASCII punctuation), an unknown word's
    the unknown token's."""
    words = list(string.punctuation) if words is None else words
    if not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{root / _SETTINGS}: skiplist_words must be a list of strings")
    unknown = special_ids(root, tokenizer, ("unk_token",)).get("unk_token")
    ids = {tokenizer.token_to_id(w) for w in words}
    ids = {unknown if i is None else i for i in ids}
    return tuple(sorted(i for i in ids if i is not None))


def _projection(root: Path, cfg: ModelConfig, stanford: bool) -> tuple[np.ndarray, np.ndarray]:
    """The projection (weight f32[E, D], bias f32[D]) of either format."""
    if stanford:
        path = root / "model.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{root}: missing model.safetensors (convert the weights)")
        tensors = load_file(str(path))
        weight, bias, where = tensors.get("linear.weight"), None, path
    else:
        modules = json.loads((root / "modules.json").read_text())
        if len(modules) != 2:
            raise CheckpointError(f"{root / 'modules.json'}: one Dense projection is supported")
        weight, bias, where = _dense(root / modules[1]["path"])
    if weight is None or weight.ndim != 2 or weight.shape[1] != cfg.hidden_size:
        raise CheckpointError(f"{where}: expected linear.weight [D, {cfg.hidden_size}]")
    weight = np.ascontiguousarray(weight.astype(np.float32).T)  # [E, D]
    bias = np.zeros(weight.shape[1], np.float32) if bias is None else bias.astype(np.float32)
    if bias.shape != weight.shape[1:]:
        raise CheckpointError(f"{where}: expected linear.bias [{weight.shape[1]}]")
    return weight, bias


def _dense(path: Path) -> tuple[np.ndarray | None, np.ndarray | None, Path]:
    """A PyLate (or sentence-transformers) Dense module's weight and bias."""
    config_path = path / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if config.get("activation_function", _IDENTITY) != _IDENTITY or config.get("use_residual"):
        raise CheckpointError(
            f"{config_path}: a ColBERT projection here is linear (Identity, no residual)"
        )
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{path}: missing model.safetensors (convert the module's weights)")
    tensors = load_file(str(weights))
    return tensors.get("linear.weight"), tensors.get("linear.bias"), weights
