"""Encoder weights of Hugging Face directories (`*ForSequenceClassification` cross-encoders of
BERT, XLM-RoBERTa and ModernBERT, the bare model of a sentence-transformers embedder, or the
`*ForMaskedLM` of a SPLADE model, DistilBERT's too), mapped to the layout of
`engine.models.encoder`; biases and norm biases a checkpoint does not have
(ModernBERT's) are zeros. And the pair length CrossEncoder truncates to by default."""

import json
from pathlib import Path

import msgspec
import numpy as np
from tqdm import tqdm

from engine.loaders.checkpoint import CheckpointError
from engine.models import ModelConfig

# BERT and XLM-RoBERTa, under `{base}.encoder.layer.{i}.`: our name -> theirs
_BERT_LAYER = {
    "wq": "attention.self.query.weight",
    "bq": "attention.self.query.bias",
    "wk": "attention.self.key.weight",
    "bk": "attention.self.key.bias",
    "wv": "attention.self.value.weight",
    "bv": "attention.self.value.bias",
    "wo": "attention.output.dense.weight",
    "bo": "attention.output.dense.bias",
    "attn_norm": "attention.output.LayerNorm.weight",
    "attn_norm_b": "attention.output.LayerNorm.bias",
    "w_up": "intermediate.dense.weight",
    "b_up": "intermediate.dense.bias",
    "w_down": "output.dense.weight",
    "b_down": "output.dense.bias",
    "mlp_norm": "output.LayerNorm.weight",
    "mlp_norm_b": "output.LayerNorm.bias",
}
_BERT_TOP = {  # under `{base}.`, or (a head) at the top
    "embed": "embeddings.word_embeddings.weight",
    "positions": "embeddings.position_embeddings.weight",
    "token_types": "embeddings.token_type_embeddings.weight",
    "embed_norm": "embeddings.LayerNorm.weight",
    "embed_norm_b": "embeddings.LayerNorm.bias",
}
_HEADS = {
    "bert": {
        "pool_dense": "pooler.dense.weight",
        "pool_dense_b": "pooler.dense.bias",
        "head": "classifier.weight",
        "classifier_b": "classifier.bias",
    },
    "xlm-roberta": {
        "pool_dense": "classifier.dense.weight",
        "pool_dense_b": "classifier.dense.bias",
        "head": "classifier.out_proj.weight",
        "classifier_b": "classifier.out_proj.bias",
    },
}
_BASES = {"bert": "bert", "xlm-roberta": "roberta", "distilbert": "distilbert"}
# DistilBERT: BERT's post-norm layer under `distilbert.transformer.layer.{i}.`, no token types
_DISTILBERT_LAYER = {
    "wq": "attention.q_lin.weight",
    "bq": "attention.q_lin.bias",
    "wk": "attention.k_lin.weight",
    "bk": "attention.k_lin.bias",
    "wv": "attention.v_lin.weight",
    "bv": "attention.v_lin.bias",
    "wo": "attention.out_lin.weight",
    "bo": "attention.out_lin.bias",
    "attn_norm": "sa_layer_norm.weight",
    "attn_norm_b": "sa_layer_norm.bias",
    "w_up": "ffn.lin1.weight",
    "b_up": "ffn.lin1.bias",
    "w_down": "ffn.lin2.weight",
    "b_down": "ffn.lin2.bias",
    "mlp_norm": "output_layer_norm.weight",
    "mlp_norm_b": "output_layer_norm.bias",
}
# a `*ForMaskedLM`'s head (a SPLADE model's): our name -> theirs, at the top; the vocabulary
# rows ("mlm_decoder") are absent where they are the embedding table
_MLM_HEADS = {
    "bert": {
        "mlm_dense": "cls.predictions.transform.dense.weight",
        "mlm_dense_b": "cls.predictions.transform.dense.bias",
        "mlm_norm": "cls.predictions.transform.LayerNorm.weight",
        "mlm_norm_b": "cls.predictions.transform.LayerNorm.bias",
        "mlm_decoder": "cls.predictions.decoder.weight",
        "mlm_decoder_b": "cls.predictions.bias",
    },
    "distilbert": {
        "mlm_dense": "vocab_transform.weight",
        "mlm_dense_b": "vocab_transform.bias",
        "mlm_norm": "vocab_layer_norm.weight",
        "mlm_norm_b": "vocab_layer_norm.bias",
        "mlm_decoder": "vocab_projector.weight",
        "mlm_decoder_b": "vocab_projector.bias",
    },
    "xlm-roberta": {
        "mlm_dense": "lm_head.dense.weight",
        "mlm_dense_b": "lm_head.dense.bias",
        "mlm_norm": "lm_head.layer_norm.weight",
        "mlm_norm_b": "lm_head.layer_norm.bias",
        "mlm_decoder": "lm_head.decoder.weight",
        "mlm_decoder_b": "lm_head.bias",
    },
    "modernbert": {
        "mlm_dense": "head.dense.weight",
        "mlm_dense_b": "head.dense.bias",
        "mlm_norm": "head.norm.weight",
        "mlm_norm_b": "head.norm.bias",
        "mlm_decoder": "decoder.weight",
        "mlm_decoder_b": "decoder.bias",
    },
}
# ModernBERT (the `model.` prefix is dropped by the tensor index), under `layers.{i}.`
_MODERN_LAYER = {
    "attn_norm": "attn_norm.weight",
    "attn_norm_b": "attn_norm.bias",
    "qkv": "attn.Wqkv.weight",
    "qkv_b": "attn.Wqkv.bias",
    "wo": "attn.Wo.weight",
    "bo": "attn.Wo.bias",
    "mlp_norm": "mlp_norm.weight",
    "mlp_norm_b": "mlp_norm.bias",
    "wi": "mlp.Wi.weight",
    "wi_b": "mlp.Wi.bias",
    "w_down": "mlp.Wo.weight",
    "b_down": "mlp.Wo.bias",
}
_MODERN_TOP = {
    "embed": "embeddings.tok_embeddings.weight",
    "embed_norm": "embeddings.norm.weight",
    "embed_norm_b": "embeddings.norm.bias",
    "final_norm": "final_norm.weight",
    "final_norm_b": "final_norm.bias",
}
_MODERN_HEAD = {
    "pool_dense": "head.dense.weight",
    "pool_dense_b": "head.dense.bias",
    "pool_norm": "head.norm.weight",
    "pool_norm_b": "head.norm.bias",
    "head": "classifier.weight",
    "classifier_b": "classifier.bias",
}
# absent: identity
_ONES = ("attn_norm", "mlp_norm", "embed_norm", "final_norm", "pool_norm", "mlm_norm")


def encoder_params(tensors, cfg: ModelConfig, progress: bool = True) -> dict:
    """Host params f32 of an encoder checkpoint (`tensors`: name -> array, `in`/`get`)."""
    if cfg.family == "modernbert":
        return _modernbert(tensors, cfg, progress)
    base = _BASES[cfg.family]
    get = _Lookup(tensors, cfg, (f"{base}.", ""))
    head = _HEADS[cfg.family] if cfg.num_labels else {}  # an embedder has none
    distil = cfg.family == "distilbert"
    names = {o: t for o, t in {**_BERT_TOP, **head}.items() if not (distil and o == "token_types")}
    top = {ours: get(theirs, ours) for ours, theirs in names.items()}
    layer, at = (_DISTILBERT_LAYER, "transformer") if distil else (_BERT_LAYER, "encoder")
    names = tqdm(layer.items(), desc="loading weights", leave=False, disable=not progress)
    stacks = {
        ours: _stack(get, f"{at}.layer.{{i}}.{theirs}", ours, cfg.num_layers)
        for ours, theirs in names
    }
    return {**top, **_mlm_head(get, cfg), "layers": stacks}


def _mlm_head(get: "_Lookup", cfg: ModelConfig) -> dict:
    """A SPLADE model's masked-language-model head; none for other encoders."""
    if cfg.splade is None:
        return {}
    names = dict(_MLM_HEADS[cfg.family])
    rows = names.pop("mlm_decoder")
    head = {ours: get(theirs, ours) for ours, theirs in names.items()}
    if get.has(rows):  # untied: the head's own vocabulary rows
        head["mlm_decoder"] = get(rows, "mlm_decoder")
    return head


def _modernbert(tensors, cfg: ModelConfig, progress: bool) -> dict:
    get = _Lookup(tensors, cfg, ("",))
    head = _MODERN_HEAD if cfg.num_labels else {}  # an embedder has none
    top = {ours: get(theirs, ours) for ours, theirs in {**_MODERN_TOP, **head}.items()}
    top |= _mlm_head(get, cfg)
    names = tqdm(_MODERN_LAYER.items(), desc="loading weights", leave=False, disable=not progress)
    layers = {ours: _stack(get, f"layers.{{i}}.{t}", ours, cfg.num_layers) for ours, t in names}
    e, i = cfg.hidden_size, cfg.intermediate_size
    qkv, qkv_b = layers.pop("qkv"), layers.pop("qkv_b")  # [N, E, 3E] q|k|v, [N, 3E]
    for j, name in enumerate("qkv"):
        layers[f"w{name}"] = qkv[..., j * e : (j + 1) * e]
        layers[f"b{name}"] = qkv_b[..., j * e : (j + 1) * e]
    wi, wi_b = layers.pop("wi"), layers.pop("wi_b")  # [N, E, 2I]: the activated half first
    layers["w_gate"], layers["w_up"] = wi[..., :i], wi[..., i:]
    layers["b_gate"], layers["b_up"] = wi_b[..., :i], wi_b[..., i:]
    return {**top, "layers": layers}


class _Lookup:
    """Tensors by their name under any of `prefixes`; a missing norm weight is ones, a missing
    bias zeros, shaped as the model says."""

    def __init__(self, tensors, cfg: ModelConfig, prefixes: tuple[str, ...]):
        self.tensors, self.cfg, self.prefixes = tensors, cfg, prefixes

    def has(self, name: str) -> bool:
        return any(prefix + name in self.tensors for prefix in self.prefixes)

    def __call__(self, name: str, ours: str) -> np.ndarray:
        for prefix in self.prefixes:
            if prefix + name in self.tensors:
                w = self.tensors.get(prefix + name)
                return w.T if w.ndim == 2 and ours not in _TABLES else w
        if ours in _ONES or ours.endswith("_b") or ours.startswith("b"):
            return self._filler(ours)
        raise CheckpointError(f"{self.tensors.root}: missing tensor {self.prefixes[0] + name!r}")

    def _filler(self, ours: str) -> np.ndarray:
        c = self.cfg
        width = {
            "qkv_b": 3 * c.hidden_size,
            "wi_b": 2 * c.intermediate_size,
            "b_up": c.intermediate_size,
            "classifier_b": c.num_labels,
            "mlm_decoder_b": c.vocab_size,
        }.get(ours, c.hidden_size)
        fill = np.ones if ours in _ONES else np.zeros
        return fill(width, np.float32)


# kept [rows, E], not transposed
_TABLES = ("embed", "positions", "token_types", "head", "mlm_decoder")


def _stack(get: _Lookup, pattern: str, ours: str, layers: int) -> np.ndarray:
    return np.stack([get(pattern.format(i=i), ours) for i in range(layers)])


def with_max_length(cfg: ModelConfig, root: Path) -> ModelConfig:
    """`cfg` with the pair length CrossEncoder truncates to: the tokenizer's `model_max_length`
    (tokenizer_config.json) capped at the config's position count, and within what the
    positions allow."""
    path = root / "tokenizer_config.json"
    tok_config = json.loads(path.read_text()) if path.is_file() else {}
    limit = tok_config.get("model_max_length") or cfg.max_position_embeddings
    limit = min(int(limit), cfg.max_position_embeddings + cfg.position_offset)
    return msgspec.structs.replace(cfg, max_length=min(limit, cfg.max_position_embeddings))
