"""The models one server serves, and which of them answers a request.

One model by default: the engine the `SCORING_*` variables configure, named `model_name`.
Several when `SCORING_MODELS` names a TOML or JSON file listing them:

    [[models]]
    name = "smollm2"                  # served name: `model` fields, /v1/models
    dtype = "float32"                 # any EngineConfig field; unset ones: the SCORING_* value
    [[models]]
    name = "all-MiniLM-L6-v2"
    model = "/models/all-MiniLM-L6-v2"

(JSON: `{"models": [{...}, ...]}`.) Each is its own engine (its actors, programs and KV pool)
in the one process; the default KV pools divide the memory between them (`kv_pool_share`). A
request goes to the model its `model` field names (a name no model has is a 404), or without
one to the first model in the file that offers what its route does (an embedding to the
embedder, a score to the decoder); with one model, to it whatever the field says, as before.
"""

import json
import tomllib
from pathlib import Path

import msgspec

from engine import CheckpointError, EngineConfig, default_model_path


class ServedModel(msgspec.Struct, frozen=True):
    """A model the server serves: the name clients use and its engine's configuration."""

    name: str
    engine: EngineConfig


class ModelsFileError(ValueError):
    """A models file that cannot be served; the message names the file and the field."""


def served_models(
    models_file: str | None, base: EngineConfig, name: str | None
) -> tuple[ServedModel, ...]:
    """The models to serve: `base` named `name` (None: its file's) without a models file, else
    the file's, each `base` with the entry's fields."""
    if models_file is None:
        return (ServedModel(name or _name(base.model), base),)
    entries = _entries(Path(models_file))
    # the default KV pools divide the memory between the engines
    base = msgspec.structs.replace(base, kv_pool_share=len(entries))
    out = tuple(_served(base, entry, i, models_file) for i, entry in enumerate(entries))
    names = [m.name for m in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ModelsFileError(f"{models_file}: models[].name: served twice: {', '.join(twice)}")
    return out


def _entries(path: Path) -> list[dict]:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as e:
        raise ModelsFileError(f"{path}: {e}") from None
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ModelsFileError(f"{path}: models: a non-empty list of models is needed")
    if not all(isinstance(e, dict) for e in entries):
        raise ModelsFileError(f"{path}: models: each model is a table of fields")
    return entries


def _served(base: EngineConfig, entry: dict, i: int, source: str) -> ServedModel:
    fields = dict(entry)
    name = fields.pop("name", None)
    try:
        engine = msgspec.convert(msgspec.to_builtins(base) | fields, EngineConfig)
    except msgspec.ValidationError as e:
        field = str(e).rpartition("$.")[2].rstrip("`")
        raise ModelsFileError(f"{source}: models[{i}].{field}: {e}") from None
    return ServedModel(name if isinstance(name, str) and name else _name(engine.model), engine)


def model_path(model: str | None) -> str | None:
    """The checkpoint `model` names; None is the default model (None if it is not installed)."""
    if model is not None:
        return model
    try:
        return str(default_model_path())
    except CheckpointError:
        return None


def _name(model: str | None) -> str:
    """A model's served name when none is given: its file's stem or its directory's name."""
    path = model_path(model)
    if path is None:
        return "default"
    return Path(path).stem if path.endswith(".gguf") else Path(path).name
