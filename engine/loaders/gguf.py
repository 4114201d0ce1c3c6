"""Loading llama.cpp GGUF files (llama, qwen2, qwen3 language models, rerankers and last-token
embedders; XLM-RoBERTa cross-encoders and embedders filed as "bert", `engine.loaders.gguf_encoder`)
into a `Checkpoint`.

The container is parsed by `engine.loaders.gguf_file`. Tensors are dequantised one at a time to
float32 with `gguf.quants.dequantize` and written straight into preallocated, layer-stacked
arrays, so peak memory is the float32 model plus one tensor.
"""

import os
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from engine.loaders import gguf_encoder
from engine.loaders.checkpoint import Checkpoint, CheckpointError
from engine.loaders.gguf_file import GGUFFile, GGUFTensor, metadata_value, read_gguf
from engine.loaders.gguf_tensors import dequantized, owned, require_tensor
from engine.loaders.gguf_tokenizer import tokenizer_from_gguf
from engine.models import FAMILIES as MODEL_FAMILIES
from engine.models.config import ModelConfig, Pooling, RopeScaling

FAMILIES = ("llama", "qwen2", "qwen3")  # general.architecture names read as decoders

# GGUF per-layer tensor -> (our layer parameter, whether it is a matrix stored [out, in]).
_LAYER_TENSORS = {
    "attn_norm.weight": ("attn_norm", False),
    "attn_q.weight": ("wq", True),
    "attn_k.weight": ("wk", True),
    "attn_v.weight": ("wv", True),
    "attn_output.weight": ("wo", True),
    "ffn_norm.weight": ("mlp_norm", False),
    "ffn_gate.weight": ("w_gate", True),
    "ffn_up.weight": ("w_up", True),
    "ffn_down.weight": ("w_down", True),
}
_QKV_BIAS_TENSORS = {
    "attn_q.bias": ("bq", False),
    "attn_k.bias": ("bk", False),
    "attn_v.bias": ("bv", False),
}
_QK_NORM_TENSORS = {
    "attn_q_norm.weight": ("q_norm", False),
    "attn_k_norm.weight": ("k_norm", False),
}


def load_gguf(path: str | os.PathLike, *, progress: bool = True) -> Checkpoint:
    """Load a llama/qwen2/qwen3 GGUF file, or an XLM-RoBERTa cross-encoder's: config from
    metadata, float32 parameters in the layout of `engine.models.config` (or of
    `engine.models.encoder`), and the tokenizer rebuilt from metadata.

    Raises `CheckpointError` naming the file for anything unsupported or missing.
    """
    source = os.fspath(path)
    reader = read_gguf(source)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if metadata_value(reader, "general.architecture", source) == gguf_encoder.ARCHITECTURE:
        config, params = gguf_encoder.encoder_checkpoint(reader, tensors, source, progress)
    else:
        config = _config(reader, tensors, source)
        params = _params(tensors, config, source, progress)
    tokenizer = tokenizer_from_gguf(reader, source)
    return Checkpoint(config=config, params=params, tokenizer=tokenizer, source=source)


# --- config --------------------------------------------------------------------------------------


def _config(reader: GGUFFile, tensors: dict[str, GGUFTensor], source: str) -> ModelConfig:
    arch = metadata_value(reader, "general.architecture", source)
    if arch not in FAMILIES:
        raise CheckpointError(
            f"{source}: unsupported architecture {arch!r} (general.architecture); "
            f"supported: {sorted([*FAMILIES, 'bert'])}"
        )
    traits = dict(MODEL_FAMILIES[arch].traits)
    theta = traits.pop("default_theta")

    def value(key: str, *default):
        found = metadata_value(reader, f"{arch}.{key}", source, *default)
        if isinstance(found, list):  # per-layer values, as some files store head counts
            if len(set(found)) != 1:
                raise CheckpointError(f"{source}: unsupported per-layer {arch}.{key} {found}")
            found = found[0]
        return found

    hidden = int(value("embedding_length"))
    num_heads = int(value("attention.head_count"))
    # llama.cpp treats a missing kv head count as plain multi-head attention.
    num_kv_heads = int(value("attention.head_count_kv", num_heads))
    head_dim = _head_dim(reader, arch, hidden, num_heads, source)
    embedding = _embedding(reader, arch, source)
    context = int(value("context_length"))
    return ModelConfig(
        family=arch,
        vocab_size=_vocab_size(tensors, source),
        hidden_size=hidden,
        num_layers=int(value("block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=int(value("feed_forward_length")),
        norm_eps=float(value("attention.layer_norm_rms_epsilon")),
        rope_theta=float(value("rope.freq_base", theta)),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in tensors,
        rope_scaling=_rope_scaling(reader, tensors, arch, source),
        num_labels=_num_labels(tensors),
        embedding=embedding,
        max_length=context if embedding else 0,  # an embedder's texts: up to the context
        **traits,
    )


def _embedding(reader: GGUFFile, arch: str, source: str) -> Pooling | None:
    """A decoder embedder's pooling (`{arch}.pooling_type` LAST, as llama.cpp writes
    Qwen3-Embedding, or MEAN), its vectors normalised as llama.cpp's embeddings are by default;
    None for a language model or a reranker (no pooling type, or RANK)."""
    pooling = metadata_value(reader, f"{arch}.pooling_type", source, None)
    if pooling is None or pooling == _RANK:
        return None
    if pooling not in _DECODER_MODES:
        raise CheckpointError(
            f"{source}: unsupported pooling type {pooling} ({arch}.pooling_type) for a decoder: "
            "MEAN (1) and LAST (3) embedders and RANK (4) rerankers are supported"
        )
    return Pooling(mode=_DECODER_MODES[pooling], normalize=True)


def _num_labels(tensors: dict[str, GGUFTensor]) -> int:
    """Labels of a reranker's classification head as llama.cpp's converter writes it
    (`cls.output.weight`, ggml shape [E, labels]: Qwen3-Reranker's is the yes row less the no
    row); 0 for a language model."""
    head = tensors.get(CLS_HEAD)
    return int(head.shape[-1]) if head is not None else 0


def _head_dim(reader: GGUFFile, arch: str, hidden: int, num_heads: int, source: str) -> int:
    """`attention.key_length` when given, else hidden / heads; partial rotary is unsupported."""
    head_dim = int(metadata_value(reader, f"{arch}.attention.key_length", source, 0))
    if not head_dim:
        head_dim = hidden // num_heads
    value_dim = int(metadata_value(reader, f"{arch}.attention.value_length", source, head_dim))
    rotary_dim = int(metadata_value(reader, f"{arch}.rope.dimension_count", source, head_dim))
    if value_dim != head_dim or rotary_dim != head_dim:
        raise CheckpointError(
            f"{source}: unsupported attention shape: key_length {head_dim}, value_length "
            f"{value_dim}, rope.dimension_count {rotary_dim} (all must be equal)"
        )
    return head_dim


def _vocab_size(tensors: dict[str, GGUFTensor], source: str) -> int:
    """Rows of the embedding table (ggml shape is [E, V])."""
    embed = require_tensor(tensors, "token_embd.weight", source)
    return int(embed.shape[-1])


def _rope_scaling(
    reader: GGUFFile, tensors: dict[str, GGUFTensor], arch: str, source: str
) -> RopeScaling | None:
    if "rope_freqs.weight" in tensors:
        # llama.cpp writes Llama-3.1-style scaling as precomputed per-frequency divisors, which
        # do not determine the (factor, low/high_freq_factor, original context) parameters.
        raise CheckpointError(
            f"{source}: unsupported tensor 'rope_freqs.weight' (per-frequency RoPE scaling as "
            "llama.cpp stores Llama-3.1+); this loader needs llama3 scaling as metadata"
        )
    prefix = f"{arch}.rope.scaling."
    kind = metadata_value(reader, prefix + "type", source, "none")
    if kind == "none":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{source}: unsupported RoPE scaling type {kind!r} ({prefix}type)")
    return RopeScaling(
        factor=float(metadata_value(reader, prefix + "factor", source)),
        low_freq_factor=float(metadata_value(reader, prefix + "low_freq_factor", source)),
        high_freq_factor=float(metadata_value(reader, prefix + "high_freq_factor", source)),
        original_max_position_embeddings=int(
            metadata_value(reader, prefix + "original_context_length", source)
        ),
    )


# --- tensors -------------------------------------------------------------------------------------

CLS_HEAD = "cls.output.weight"  # a reranker's classification head (llama.cpp's converter)
_RANK = 4  # gguf.PoolingType: a reranker's
_DECODER_MODES = {1: "mean", 3: "last"}  # an embedder's gguf.PoolingType -> `Pooling.mode`


@dataclass(frozen=True)
class _Slot:
    """Where one GGUF tensor goes: a parameter name, the layer (None for global) and its
    expected shape in the HF orientation ([out, in] for matrices)."""

    param: str
    layer: int | None
    shape: tuple[int, ...]
    matrix: bool


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer HF-orientation shapes, keyed by our parameter name."""
    e, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    return {
        "attn_norm": (e,),
        "mlp_norm": (e,),
        "wq": (q, e),
        "wk": (kv, e),
        "wv": (kv, e),
        "wo": (e, q),
        "w_gate": (i, e),
        "w_up": (i, e),
        "w_down": (e, i),
        "bq": (q,),
        "bk": (kv,),
        "bv": (kv,),
        "q_norm": (d,),
        "k_norm": (d,),
    }


def _slots(config: ModelConfig) -> dict[str, _Slot]:
    """Every GGUF tensor name this config needs, with where it goes."""
    per_layer = dict(_LAYER_TENSORS)
    if config.qkv_bias:
        per_layer |= _QKV_BIAS_TENSORS
    if config.qk_norm:
        per_layer |= _QK_NORM_TENSORS
    shapes = _layer_shapes(config)
    slots = {
        f"blk.{layer}.{suffix}": _Slot(param, layer, shapes[param], matrix)
        for layer in range(config.num_layers)
        for suffix, (param, matrix) in per_layer.items()
    }
    embed_shape = (config.vocab_size, config.hidden_size)
    slots["token_embd.weight"] = _Slot("embed", None, embed_shape, False)
    slots["output_norm.weight"] = _Slot("final_norm", None, (config.hidden_size,), False)
    if config.num_labels:
        head_shape = (config.num_labels, config.hidden_size)
        slots[CLS_HEAD] = _Slot("lm_head", None, head_shape, False)
    elif not config.tie_word_embeddings:
        slots["output.weight"] = _Slot("lm_head", None, embed_shape, False)
    return slots


def _params(
    tensors: dict[str, GGUFTensor], config: ModelConfig, source: str, progress: bool = True
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    slots = _slots(config)
    for name in slots:
        require_tensor(tensors, name, source)
    if config.num_labels:  # a reranker's language-model head, if kept, is not used
        tensors = {name: t for name, t in tensors.items() if name != "output.weight"}
    unexpected = sorted(set(tensors) - set(slots))
    if unexpected:
        raise CheckpointError(
            f"{source}: unsupported tensors for {config.family}: {', '.join(unexpected[:5])}"
        )
    layers = _allocate_layers(config, slots)
    params: dict[str, np.ndarray | dict[str, np.ndarray]] = {}
    label = f"Loading {os.path.basename(source)}"
    for tensor in tqdm(
        tensors.values(), desc=label, unit="tensor", file=sys.stderr, disable=not progress
    ):
        slot = slots[tensor.name]
        weight = dequantized(tensor, slot.shape, source)  # f32[out, in] or f32[n]
        if config.family == "llama" and slot.param in ("wq", "wk"):
            heads = config.num_heads if slot.param == "wq" else config.num_kv_heads
            weight = _unpermute_rows(weight, heads)
        if slot.layer is None:
            params[slot.param] = owned(weight, tensor)
        else:
            # f32[N, in, out] for matrices, f32[N, n] for vectors
            layers[slot.param][slot.layer] = weight.T if slot.matrix else weight
    params["layers"] = layers
    return params


def _allocate_layers(config: ModelConfig, slots: dict[str, _Slot]) -> dict[str, np.ndarray]:
    """Uninitialised stacked arrays; every slot is filled because every tensor is required."""
    shapes = {
        slot.param: slot.shape[::-1] if slot.matrix else slot.shape for slot in slots.values()
    }
    return {
        slot.param: np.empty((config.num_layers, *shapes[slot.param]), dtype=np.float32)
        for slot in slots.values()
        if slot.layer == 0
    }


def _unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order for interleaved RoPE.

    Its converter reorders each head's rows from [first half, second half] (rotate-half, as in
    HF checkpoints) to alternating pairs; reading each head as [D/2, 2] rows and swapping back
    restores rotate-half order.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # f32[H, D/2, 2, in]
    return per_head.swapaxes(1, 2).reshape(weight.shape)
