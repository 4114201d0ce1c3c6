"""Sentence-transformers embedder directories: `modules.json` names the modules an embedding
passes through (the transformer, then Pooling, then optionally Normalize), `1_Pooling/config.json`
how token states become one vector, `sentence_bert_config.json` the `max_seq_length` texts are
cut to, and `config_sentence_transformers.json` the prompts put before texts (a query
instruction). Read here into the model's `Pooling` and length; a module or pooling mode this
engine does not run is refused by name, never skipped."""

import json
from pathlib import Path

from engine.loaders.checkpoint import CheckpointError
from engine.models.config import Pooling

MODULES = "modules.json"
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
MODES_OF = {True: ("cls", "mean"), False: ("last",)}  # by whether the model is an encoder


def is_embedder(root: Path) -> bool:
    """Whether `root` is a sentence-transformers directory with a Pooling module."""
    path = root / MODULES
    return path.is_file() and any(m.get("type") == _POOLING for m in _read(path))


def read_embedder(root: Path, encoder: bool) -> tuple[Pooling, int | None]:
    """The pooling of the sentence-transformers directory `root` (of an `encoder`, else a
    decoder) and its `max_seq_length` (None: not set, the model's own limit); CheckpointError
    naming the file for a module or pooling mode that is not supported."""
    modules = _read(root / MODULES)
    kinds = [m.get("type") for m in modules]
    if kinds[:2] != [_TRANSFORMER, _POOLING] or any(k != _NORMALIZE for k in kinds[2:]):
        raise CheckpointError(
            f"{root / MODULES}: supported modules are Transformer, Pooling and Normalize, in "
            f"that order; got {kinds}"
        )
    if modules[0].get("path", "") != "":
        raise CheckpointError(f"{root / MODULES}: the Transformer module must be the directory")
    pooling_path = root / modules[1]["path"] / "config.json"
    pooling = _read(pooling_path)
    modes = [mode for key, mode in _MODES.items() if pooling.get(key)]
    other = [key for key in _UNSUPPORTED_MODES if pooling.get(key)]
    if pooling.get("include_prompt") is False:
        raise CheckpointError(
            f"{pooling_path}: pooling that leaves out the prompt is not supported"
        )
    supported = MODES_OF[encoder]
    if len(modes) != 1 or other or modes[0] not in supported:
        kind = "an encoder" if encoder else "a decoder"
        raise CheckpointError(
            f"{pooling_path}: {kind}'s pooling is one of {', '.join(supported)} here; "
            f"got {modes + other or 'none'}"
        )
    bert_config = root / "sentence_bert_config.json"
    limit = _read(bert_config).get("max_seq_length") if bert_config.is_file() else None
    prompts, default = _prompts(root / "config_sentence_transformers.json")
    pooling = Pooling(
        mode=modes[0],
        normalize=_NORMALIZE in kinds,
        prompts=prompts,
        default_prompt=default,
        **_matryoshka(root / "config.json"),
    )
    return pooling, limit


def _matryoshka(path: Path) -> dict:
    """Whether the model's `config.json` says it is Matryoshka-trained (`is_matryoshka`, or the
    widths it was trained at as `matryoshka_dimensions`), as vLLM reads it."""
    config = _read(path) if path.is_file() else {}
    widths = config.get("matryoshka_dimensions") or []
    if not (isinstance(widths, list) and all(type(d) is int and d > 0 for d in widths)):
        raise CheckpointError(f"{path}: matryoshka_dimensions must be a list of widths")
    trained = bool(config.get("is_matryoshka")) or bool(widths)
    return {"matryoshka": trained, "matryoshka_dimensions": tuple(sorted(widths))}


def _prompts(path: Path) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The named prompts and the default prompt's name of `config_sentence_transformers.json`."""
    config = _read(path) if path.is_file() else {}
    prompts = config.get("prompts") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise CheckpointError(f"{path}: prompts must map names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(f"{path}: default_prompt_name {default!r} names no prompt")
    return tuple(prompts.items()), default


def _read(path: Path):
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: missing {path.name}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from e
