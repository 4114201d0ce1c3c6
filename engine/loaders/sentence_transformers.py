"""Sentence-transformers embedder directories: `modules.json` names the modules an embedding
passes through (the transformer, then Pooling, then any Dense projections, then optionally
Normalize), `1_Pooling/config.json` how token states become one vector, each Dense module's
`config.json` and `model.safetensors` its projection, `sentence_bert_config.json` the
`max_seq_length` texts are cut to, and `config_sentence_transformers.json` the prompts put
before texts (a query instruction). Read here into the model's `Pooling` and length; a module or
pooling mode this engine does not run is refused by name, never skipped.

A SparseEncoder (SPLADE) directory names a masked-language-model transformer (`MLMTransformer`,
or since sentence-transformers 5.4 a `Transformer` of task "fill-mask") and then SpladePooling,
whose `config.json` gives its pooling and activation: read into the model's `Splade`."""

import json
from pathlib import Path

from safetensors import safe_open

from engine.loaders.checkpoint import CheckpointError
from engine.models.config import DenseLayer, Pooling, Splade

MODULES = "modules.json"
# modules by class name: sentence-transformers names them `sentence_transformers.models.Pooling`,
# and since version 6 by their module path (`...sentence_transformer.modules.pooling.Pooling`)
_TRANSFORMER, _POOLING, _NORMALIZE, _DENSE = "Transformer", "Pooling", "Normalize", "Dense"
_ACTIVATIONS = {  # torch's class -> the name `engine.tasks.pooler.ACTIVATIONS` knows it by
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}
_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
}
_NAMED = {"cls": "cls", "mean": "mean", "max": "max", "lasttoken": "last"}  # `pooling_mode`s
_UNSUPPORTED_MODES = (
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
_TANH = "torch.nn.modules.activation.Tanh"  # a Dense module's default activation
_SENTENCE = "sentence_embedding"
_MLM, _SPLADE = ("MLMTransformer", "Transformer"), "SpladePooling"
_SPLADE_POOLING = ("max", "sum")
_SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
MODES_OF = {
    True: ("cls", "mean", "max"),
    False: ("last", "mean"),
}  # by whether the model is an encoder


def is_embedder(root: Path) -> bool:
    """Whether `root` is a sentence-transformers directory with a Pooling module."""
    path = root / MODULES
    return path.is_file() and _POOLING in _kinds(_read(path))


def is_sparse_encoder(root: Path) -> bool:
    """Whether `root` is a sentence-transformers directory with a SpladePooling module."""
    path = root / MODULES
    return path.is_file() and _SPLADE in _kinds(_read(path))


def read_splade(root: Path) -> tuple[Splade, int | None]:
    """The SPLADE pooling of the SparseEncoder directory `root` and its `max_seq_length` (None:
    not set); CheckpointError naming the file for what is not supported."""
    modules = _read(root / MODULES)
    kinds = _kinds(modules)
    if len(kinds) != 2 or kinds[0] not in _MLM or kinds[1] != _SPLADE:
        raise CheckpointError(
            f"{root / MODULES}: a sparse encoder here is a masked-language-model Transformer "
            f"then SpladePooling; got {kinds}"
        )
    if modules[0].get("path", "") != "":
        raise CheckpointError(f"{root / MODULES}: the Transformer module must be the directory")
    bert_config = root / "sentence_bert_config.json"
    settings = _read(bert_config) if bert_config.is_file() else {}
    if settings.get("transformer_task", "fill-mask") != "fill-mask":
        raise CheckpointError(f"{bert_config}: SpladePooling needs transformer_task fill-mask")
    path = root / modules[1]["path"] / "config.json"
    config = _read(path)
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in _SPLADE_POOLING or activation not in _SPLADE_ACTIVATIONS:
        raise CheckpointError(
            f"{path}: pooling_strategy is one of {', '.join(_SPLADE_POOLING)} and "
            f"activation_function one of {', '.join(_SPLADE_ACTIVATIONS)} here; got "
            f"{pooling!r}, {activation!r}"
        )
    prompts, default = _prompts(root / "config_sentence_transformers.json")
    splade = Splade(pooling=pooling, activation=activation, prompts=prompts, default_prompt=default)
    return splade, settings.get("max_seq_length")


def read_embedder(root: Path, encoder: bool) -> tuple[Pooling, int | None]:
    """The pooling of the sentence-transformers directory `root` (of an `encoder`, else a
    decoder) and its `max_seq_length` (None: not set, the model's own limit); CheckpointError
    naming the file for a module or pooling mode that is not supported."""
    modules = _read(root / MODULES)
    kinds = _kinds(modules)
    middle = kinds[2:-1] if kinds[-1:] == [_NORMALIZE] else kinds[2:]
    if kinds[:2] != [_TRANSFORMER, _POOLING] or any(k != _DENSE for k in middle):
        raise CheckpointError(
            f"{root / MODULES}: supported modules are Transformer, Pooling, any Dense and "
            f"Normalize, in that order; got {kinds}"
        )
    if modules[0].get("path", "") != "":
        raise CheckpointError(f"{root / MODULES}: the Transformer module must be the directory")
    pooling_path = root / modules[1]["path"] / "config.json"
    pooling = _read(pooling_path)
    modes, other = _pooling_modes(pooling)
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
        dense=tuple(_dense(root / m["path"]) for m in modules[2 : 2 + len(middle)]),
        **_matryoshka(root / "config.json"),
    )
    return pooling, limit


def _pooling_modes(config: dict) -> tuple[list[str], list[str]]:
    """The pooling modes a Pooling config asks for that this engine runs, and the others: by
    `pooling_mode` (a name or a list of them, sentence-transformers 6), or by the older
    `pooling_mode_*` flags."""
    if "pooling_mode" in config:
        given = config["pooling_mode"]
        names = [given] if isinstance(given, str) else list(given)
        return [_NAMED[n] for n in names if n in _NAMED], [n for n in names if n not in _NAMED]
    modes = [mode for key, mode in _MODES.items() if config.get(key)]
    return modes, [key for key in _UNSUPPORTED_MODES if config.get(key)]


def _kinds(modules: list[dict]) -> list[str]:
    """Each module's class name, where it is sentence-transformers' own (else its whole type)."""
    types = [str(m.get("type")) for m in modules]
    return [t.rpartition(".")[2] if t.startswith("sentence_transformers.") else t for t in types]


def _dense(path: Path) -> DenseLayer:
    """A Dense module's projection; CheckpointError naming the file for what is not run here."""
    config = _read(path / "config.json")
    activation = _ACTIVATIONS.get(config.get("activation_function", _TANH))
    io = (config.get("module_input_name"), config.get("module_output_name"))
    if activation is None or config.get("use_residual") or io[0] not in (None, _SENTENCE):
        raise CheckpointError(
            f"{path / 'config.json'}: a Dense module of {', '.join(_ACTIVATIONS.values())} on "
            "the pooled vector, without a residual, is supported here"
        )
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{path}: missing model.safetensors (convert the module's weights)")
    n, m = config["out_features"], config["in_features"]
    with safe_open(weights, "numpy") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    want = {"linear.weight": (n, m)} | ({"linear.bias": (n,)} if config.get("bias", True) else {})
    if shapes != want:
        raise CheckpointError(f"{weights}: expected tensors {want}, got {shapes}")
    return DenseLayer(path=str(path), in_features=m, out_features=n, activation=activation)


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
