"""llama.cpp GGUF files of XLM-RoBERTa cross-encoders (bge-reranker-base/large/v2-m3) and
embedders (bge-m3, multilingual-e5), as its `convert_hf_to_gguf.py` writes them: architecture
"bert", a SentencePiece Unigram vocabulary (`tokenizer.ggml.model` "t5"), the position table with
its first `pad_token_id + 1` rows cut off (`context_length` counts what is left). A cross-encoder
(RANK pooling, or none written) has its classification head as `cls` (dense, then tanh) and
`cls.output` (out_proj); an embedder has no head and MEAN or CLS pooling (`bert.pooling_type`),
its vectors normalised, as llama.cpp's embeddings are by default.

The config is what `engine.models.xlm_roberta.config` gives for the original config.json, rebuilt
from metadata; the parameters follow `engine.models.encoder`'s layout, the cut-off position rows
restored as zeros (no position reads them), absent biases as zeros.
"""

import os
import sys

import msgspec
import numpy as np
from tqdm import tqdm

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import GGUFFile, GGUFTensor, metadata_value
from engine.loaders.gguf_tensors import dequantized, owned, require_tensor
from engine.models import ModelConfig, xlm_roberta
from engine.models.config import Pooling

ARCHITECTURE = "bert"
_POOLINGS = {0: "NONE", 1: "MEAN", 2: "CLS", 3: "LAST", 4: "RANK"}  # gguf.PoolingType
_RANK = 4
_EMBEDDER_MODES = {1: "mean", 2: "cls"}  # an embedder's pooling type -> `Pooling.mode`
_HEAD, _DENSE = "cls.output.weight", "cls.weight"

# GGUF tensor name (under `blk.{i}.` for a layer) -> our parameter
_LAYER = {
    "attn_q.weight": "wq",
    "attn_q.bias": "bq",
    "attn_k.weight": "wk",
    "attn_k.bias": "bk",
    "attn_v.weight": "wv",
    "attn_v.bias": "bv",
    "attn_output.weight": "wo",
    "attn_output.bias": "bo",
    "attn_output_norm.weight": "attn_norm",
    "attn_output_norm.bias": "attn_norm_b",
    "ffn_up.weight": "w_up",
    "ffn_up.bias": "b_up",
    "ffn_down.weight": "w_down",
    "ffn_down.bias": "b_down",
    "layer_output_norm.weight": "mlp_norm",
    "layer_output_norm.bias": "mlp_norm_b",
}
_TOP = {
    "token_embd.weight": "embed",
    "position_embd.weight": "positions",
    "token_types.weight": "token_types",
    "token_embd_norm.weight": "embed_norm",
    "token_embd_norm.bias": "embed_norm_b",
    "cls.weight": "pool_dense",
    "cls.bias": "pool_dense_b",
    "cls.output.weight": "head",
    "cls.output.bias": "classifier_b",
}
_TABLES = ("embed", "positions", "token_types", "head")  # kept [rows, E]; other matrices [in, out]


def encoder_checkpoint(
    reader: GGUFFile, tensors: dict[str, GGUFTensor], source: str, progress: bool = True
) -> tuple[ModelConfig, dict]:
    """(config, float32 host params) of an XLM-RoBERTa reranker or embedder file;
    `CheckpointError` naming the file for anything else llama.cpp files as "bert" (BERT's own
    models, which lose their pooler in conversion and have a WordPiece vocabulary)."""
    mode = _check(reader, tensors, source)
    cfg = _config(reader, tensors, source, mode)
    return cfg, _params(tensors, cfg, source, progress)


def _check(reader: GGUFFile, tensors: dict[str, GGUFTensor], source: str) -> str | None:
    """An embedder's pooling mode, or None for a cross-encoder; CheckpointError otherwise."""
    pooling = metadata_value(reader, f"{ARCHITECTURE}.pooling_type", source, _RANK)
    mode = _EMBEDDER_MODES.get(pooling)
    if pooling != _RANK and mode is None:
        raise CheckpointError(
            f"{source}: unsupported pooling type {_POOLINGS.get(pooling, pooling)} "
            f"({ARCHITECTURE}.pooling_type): rerankers (RANK pooling with a classification "
            "head) and MEAN or CLS embedders are supported"
        )
    if mode is None and _HEAD not in tensors:
        raise CheckpointError(
            f"{source}: no classification head (tensor {_HEAD!r}) for RANK pooling: a "
            "cross-encoder needs one"
        )
    if mode is not None and (_HEAD in tensors or _DENSE in tensors):
        raise CheckpointError(f"{source}: an embedder ({_POOLINGS[pooling]}) with a head")
    vocab = metadata_value(reader, "tokenizer.ggml.model", source)
    if vocab != "t5":
        raise CheckpointError(
            f"{source}: only XLM-RoBERTa cross-encoders (tokenizer.ggml.model 't5') are "
            f"supported, not {vocab!r} (BERT's own lose their pooler in llama.cpp's conversion)"
        )
    if mode is None and _DENSE not in tensors:
        raise CheckpointError(f"{source}: missing tensor {_DENSE!r} (the head's dense layer)")
    if metadata_value(reader, f"{ARCHITECTURE}.attention.causal", source, False):
        raise CheckpointError(f"{source}: {ARCHITECTURE}.attention.causal is set for an encoder")
    return mode


def _config(
    reader: GGUFFile, tensors: dict[str, GGUFTensor], source: str, mode: str | None
) -> ModelConfig:
    """`xlm_roberta.config` of the config.json the file was converted from, with the pair length
    CrossEncoder would use: all the positions (GGUF keeps no `model_max_length`); an embedder's
    (`mode`: its pooling) without a head, its texts up to all the positions too."""

    def value(key: str, *default):
        return metadata_value(reader, f"{ARCHITECTURE}.{key}", source, *default)

    pad = metadata_value(reader, "tokenizer.ggml.padding_token_id", source, None)
    offset = 0 if pad is None else int(pad) + 1  # the converter cut rows only given a pad id
    types = require_tensor(tensors, "token_types.weight", source).shape[-1]
    hf = {
        "architectures": ["XLMRobertaModel" if mode else "XLMRobertaForSequenceClassification"],
        "num_labels": 0 if mode else int(require_tensor(tensors, _HEAD, source).shape[-1]),
        "vocab_size": int(require_tensor(tensors, "token_embd.weight", source).shape[-1]),
        "hidden_size": int(value("embedding_length")),
        "num_hidden_layers": int(value("block_count")),
        "num_attention_heads": int(value("attention.head_count")),
        "intermediate_size": int(value("feed_forward_length")),
        "layer_norm_eps": _decimal(value("attention.layer_norm_epsilon")),
        "max_position_embeddings": int(value("context_length")) + offset,
        "pad_token_id": offset - 1,
        "type_vocab_size": int(types),
        "hidden_act": "gelu",  # what XLM-RoBERTa uses; llama.cpp's BERT graph hardcodes GELU
    }
    try:
        cfg = xlm_roberta.config(hf)
    except (ValueError, msgspec.ValidationError) as error:
        raise CheckpointError(f"{source}: {error}") from error
    embedding = Pooling(mode=mode, normalize=True) if mode else None
    return msgspec.structs.replace(cfg, max_length=cfg.max_position_embeddings, embedding=embedding)


def _decimal(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06):
    the shortest decimal that rounds to the same float32."""
    return float(str(np.float32(value)))


def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameters' shapes as stored in GGUF, HF orientation ([out, in] matrices, one layer)."""
    e, i, labels = cfg.hidden_size, cfg.intermediate_size, cfg.num_labels
    vectors = ("bq", "bk", "bv", "bo", "b_down", "pool_dense_b")
    norms = ("attn_norm", "attn_norm_b", "mlp_norm", "mlp_norm_b", "embed_norm", "embed_norm_b")
    return {
        **{name: (e,) for name in (*vectors, *norms)},
        **{name: (e, e) for name in ("wq", "wk", "wv", "wo", "pool_dense")},
        "w_up": (i, e),
        "b_up": (i,),
        "w_down": (e, i),
        "embed": (cfg.vocab_size, e),
        "positions": (cfg.max_position_embeddings, e),
        "token_types": (cfg.type_vocab_size, e),
        "head": (labels, e),
        "classifier_b": (labels,),
    }


def _params(tensors: dict[str, GGUFTensor], cfg: ModelConfig, source: str, progress: bool) -> dict:
    """Every tensor dequantised once, layers written straight into stacks f32[N, ...]."""
    top = {k: v for k, v in _TOP.items() if not (cfg.embedding and k.startswith("cls."))}
    names = top | {
        f"blk.{n}.{suffix}": ours for n in range(cfg.num_layers) for suffix, ours in _LAYER.items()
    }
    unexpected = sorted(set(tensors) - set(names))
    if unexpected:
        raise CheckpointError(
            f"{source}: unsupported tensors for an XLM-RoBERTa model: {', '.join(unexpected[:5])}"
        )
    shapes = _shapes(cfg)
    params: dict = {}
    layers: dict[str, np.ndarray] = {}
    label = f"Loading {os.path.basename(source)}"
    for name, ours in tqdm(
        names.items(), desc=label, unit="tensor", file=sys.stderr, disable=not progress
    ):
        weight = _tensor(tensors, name, ours, shapes[ours], source)
        if name.startswith("blk."):
            stack = layers.setdefault(ours, np.empty((cfg.num_layers, *weight.shape), np.float32))
            stack[int(name.split(".")[1])] = weight
        else:
            params[ours] = owned(weight, tensors[name]) if name in tensors else weight
    params["positions"] = _restore_offset(params["positions"], cfg.position_offset)
    params["layers"] = layers
    return params


def _tensor(
    tensors: dict[str, GGUFTensor], name: str, ours: str, shape: tuple[int, ...], source: str
) -> np.ndarray:
    """f32 in our layout, perhaps a view of the file: matrices other than tables transposed to
    [in, out]; an absent bias is zeros, anything else absent an error."""
    if name not in tensors and name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    weight = dequantized(require_tensor(tensors, name, source), shape, source)
    return weight.T if weight.ndim == 2 and ours not in _TABLES else weight


def _restore_offset(positions: np.ndarray, offset: int) -> np.ndarray:  # f32[offset + P, E]
    """The position table as the original has it, ids counted from `offset`: the rows the
    converter cut off come back as zeros."""
    return np.concatenate([np.zeros((offset, positions.shape[1]), np.float32), positions])
