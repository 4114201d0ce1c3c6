"""Hugging Face model directories: config.json, safetensors (single or sharded), tokenizer.json.

Checkpoint naming is mapped to the layout of `engine.models.config` here, so the forward never
sees a checkpoint's quirks.
"""

import json
from pathlib import Path

import msgspec
import numpy as np
import tokenizers
from safetensors import safe_open
from tqdm import tqdm

from engine.loaders import bge_m3, colbert, sentence_transformers
from engine.loaders.checkpoint import Checkpoint, CheckpointError
from engine.loaders.hf_encoder import encoder_params, with_max_length
from engine.models import FAMILIES, MODEL_TYPES, ModelConfig, gemma

# our name -> Hugging Face name under `model.layers.{i}.`, transposed when a matrix
_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
_BIAS_NAMES = {
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
}
_QK_NORM_NAMES = {"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
# Gemma 2/3: "post_attention_layernorm" norms the attention output; the MLP's input norm is
# "pre_feedforward_layernorm"
_SANDWICH_NAMES = {
    "mlp_norm": "pre_feedforward_layernorm.weight",
    "post_attn_norm": "post_attention_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
}


def load_hf_dir(path: str | Path, *, progress: bool = True) -> Checkpoint:
    """Load a Hugging Face model directory of family llama, qwen2, qwen3, gemma, gemma2 or
    gemma3 (text), or a cross-encoder, embedder or SPLADE model of family bert, xlm-roberta,
    modernbert or distilbert."""
    root = Path(path)
    hf = _read_json(root / "config.json")
    family = FAMILIES.get(MODEL_TYPES.get(hf.get("model_type")))
    if family is None:
        raise CheckpointError(
            f"{root / 'config.json'}: unsupported model_type {hf.get('model_type')!r} "
            f"(supported: {', '.join(MODEL_TYPES)})"
        )
    try:
        cfg = family.config_from_hf(hf)
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{root / 'config.json'}: missing or invalid field {e}") from e
    except ValueError as e:
        raise CheckpointError(f"{root / 'config.json'}: {e}") from e
    tensors = _TensorFiles(root)
    tokenizer = _tokenizer(root)
    cfg = _head_config(cfg, root)
    architectures = hf.get("architectures")
    if cfg.encoder and not cfg.num_labels and colbert.is_colbert(root, architectures):
        late = colbert.read_colbert(root, cfg, tokenizer, architectures)
        cfg = msgspec.structs.replace(cfg, colbert=late)
    if cfg.encoder and cfg.embedding is not None and bge_m3.is_m3(root):
        cfg = msgspec.structs.replace(cfg, m3=bge_m3.read_m3(root, cfg, tokenizer))
    if cfg.encoder:
        params = encoder_params(tensors, cfg, progress)
    else:
        params = _params(tensors, cfg, progress)
    if cfg.m3 is not None:
        params |= bge_m3.m3_params(root, cfg)
    if cfg.colbert is not None:
        params |= colbert.colbert_params(root, cfg, architectures)
    return Checkpoint(cfg, params, tokenizer, str(root))


def _tokenizer(root: Path) -> tokenizers.Tokenizer:
    """tokenizer.json without the truncation or padding it may carry (all-MiniLM-L6-v2's cuts
    at 128 tokens): the engine pads nothing, and cuts only where a caller asks."""
    path = root / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{root}: missing tokenizer.json")
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _head_config(cfg: ModelConfig, root: Path) -> ModelConfig:
    """The config with what the model computes besides its stack: a classifier's logits, a
    decoder's language-model head, or (a sentence-transformers directory, no classifier) an
    embedder's pooled vectors; and the tokens an encoder's pair or an embedder's text is cut
    to."""
    if cfg.encoder:
        cfg = with_max_length(cfg, root)
    if cfg.encoder and not cfg.num_labels and sentence_transformers.is_sparse_encoder(root):
        splade, limit = sentence_transformers.read_splade(root)
        return msgspec.structs.replace(
            cfg, splade=splade, max_length=min(limit or cfg.max_length, cfg.max_length)
        )
    if cfg.num_labels or not sentence_transformers.is_embedder(root):
        late = colbert.is_colbert(root, _read_json(root / "config.json").get("architectures"))
        if cfg.encoder and not cfg.num_labels and not late:
            raise CheckpointError(
                f"{root}: an encoder is served as a cross-encoder (*ForSequenceClassification), "
                "a sentence-transformers embedder (modules.json with a Pooling module), a "
                "sparse encoder (with SpladePooling) or a ColBERT model (PyLate's or "
                "colbert-ir's); this is none of them"
            )
        return cfg
    pooling, limit = sentence_transformers.read_embedder(root, cfg.encoder)
    most = cfg.max_length if cfg.encoder else cfg.max_position_embeddings
    return msgspec.structs.replace(cfg, embedding=pooling, max_length=min(limit or most, most))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: missing {path.name}")
    return json.loads(path.read_text())


class _TensorFiles:
    """Name -> tensor over one `model.safetensors` or the shards of its index."""

    def __init__(self, root: Path):
        index = root / "model.safetensors.index.json"
        if index.is_file():
            weight_map = _read_json(index)["weight_map"]
        elif (root / "model.safetensors").is_file():
            with safe_open(root / "model.safetensors", "numpy") as f:
                weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        else:
            raise CheckpointError(f"{root}: no model.safetensors or model.safetensors.index.json")
        # some exports drop the `model.` prefix; accept both spellings
        self.files = {k.removeprefix("model."): (root / v, k) for k, v in weight_map.items()}
        self.root = root

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> np.ndarray:
        if name not in self.files:
            raise CheckpointError(f"{self.root}: missing tensor {name!r}")
        file, key = self.files[name]
        with safe_open(file, "numpy") as f:
            return np.asarray(f.get_tensor(key), np.float32)


def _params(tensors: _TensorFiles, cfg, progress: bool = True) -> dict:
    names = dict(_LAYER_NAMES)
    if cfg.qkv_bias:
        names |= _BIAS_NAMES
    if cfg.qk_norm:
        names |= _QK_NORM_NAMES
    if cfg.sandwich_norms:
        names |= _SANDWICH_NAMES
    layers = {}
    for ours, theirs in tqdm(
        names.items(), desc="loading weights", leave=False, disable=not progress
    ):
        stack = [tensors.get(f"layers.{i}.{theirs}") for i in range(cfg.num_layers)]
        layers[ours] = np.stack([w.T if w.ndim == 2 else w for w in stack])  # [N, in, out]
    params = {
        "embed": tensors.get("embed_tokens.weight"),  # f32[V, E]
        "final_norm": tensors.get("norm.weight"),
        "layers": layers,
    }
    if cfg.family in gemma.NAMES:  # RMSNorm applies 1 + w: stored as the weight it multiplies by
        for name in gemma.NORMS_PLUS_ONE:
            held = layers if name in layers else params
            if name in held:
                held[name] = held[name] + 1.0
    if cfg.num_labels:  # the classification head in the language-model head's place
        params["lm_head"] = tensors.get("score.weight")  # f32[num_labels, E]
    elif cfg.embedding is None and not cfg.tie_word_embeddings:  # an embedder reads no head
        if "lm_head.weight" not in tensors:
            raise CheckpointError(f"{tensors.root}: missing tensor 'lm_head.weight'")
        params["lm_head"] = tensors.get("lm_head.weight")  # f32[V, E]
    return params
