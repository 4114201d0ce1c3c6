"""BGE-M3 directories: a sentence-transformers XLM-RoBERTa embedder (CLS pooling, normalised)
with FlagEmbedding's two heads beside it, `colbert_linear.pt` (the multi-vector projection) and
`sparse_linear.pt` (the lexical weight), as `BGEM3FlagModel` loads them; read into the model's
`M3Heads` and its `m3_*` parameters. The lexical weights of the tokenizer's cls, eos, pad and
unk tokens are dropped, as FlagEmbedding drops them."""

from pathlib import Path

import numpy as np
import tokenizers

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.tokenizer_config import special_ids
from engine.loaders.torch_pickle import read_state_dict
from engine.models.config import M3Heads, ModelConfig

COLBERT, SPARSE = "colbert_linear.pt", "sparse_linear.pt"
_UNUSED = ("cls_token", "eos_token", "pad_token", "unk_token")


def is_m3(root: Path) -> bool:
    """Whether `root` holds BGE-M3's two heads."""
    return (root / COLBERT).is_file() and (root / SPARSE).is_file()


def read_m3(root: Path, cfg: ModelConfig, tokenizer: tokenizers.Tokenizer) -> M3Heads:
    """The heads of the BGE-M3 directory `root` of an embedder of `cfg`; CheckpointError naming
    the file for what does not fit."""
    if cfg.embedding is None or cfg.embedding.mode != "cls":
        raise CheckpointError(f"{root}: BGE-M3's heads come with CLS pooling of the dense vector")
    weight = _linear(root / COLBERT, cfg.hidden_size)[0]
    _linear(root / SPARSE, cfg.hidden_size, out=1)
    return M3Heads(colbert_dim=weight.shape[0], unused=_special_ids(root, tokenizer))


def m3_params(root: Path, cfg: ModelConfig) -> dict:
    """The heads' host params: m3_colbert [E, D], m3_colbert_b [D], m3_sparse [E], m3_sparse_b
    []."""
    colbert, colbert_b = _linear(root / COLBERT, cfg.hidden_size)
    sparse, sparse_b = _linear(root / SPARSE, cfg.hidden_size, out=1)
    return {
        "m3_colbert": np.ascontiguousarray(colbert.T),
        "m3_colbert_b": colbert_b,
        "m3_sparse": sparse[0],
        "m3_sparse_b": sparse_b.reshape(()),
    }


def _linear(path: Path, width: int, out: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A torch Linear's (weight f32[out, width], bias f32[out]) saved at `path`."""
    state = read_state_dict(path)
    weight, bias = state.get("weight"), state.get("bias")
    if (
        weight is None
        or weight.ndim != 2
        or weight.shape[1] != width
        or (out and weight.shape[0] != out)
    ):
        raise CheckpointError(
            f"{path}: expected a Linear from {width} features, got {state.keys()}"
        )
    if bias is None or bias.shape != weight.shape[:1]:
        raise CheckpointError(f"{path}: expected a bias of {weight.shape[0]}")
    return weight.astype(np.float32), bias.astype(np.float32)


def _special_ids(root: Path, tokenizer: tokenizers.Tokenizer) -> tuple[int, ...]:
    """The ids of the cls, eos, pad and unk tokens the tokenizer's configuration names."""
    return tuple(sorted(set(special_ids(root, tokenizer, _UNUSED).values())))
