"""Random-weight checkpoints with the exact shape of a real model, to measure its cost without
its weights: a real Hugging Face directory (config.json, model.safetensors, tokenizer.json) that
both the engine and transformers load, so the baseline runs the same weights.

The tokenizer is a small byte-level BPE trained on the bench's own English-like text; its ids
all lie far below the model's vocabulary size, and the LM head still spans the full vocabulary.
"""

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from bench.colbert_models import COLBERT_SHAPES, write_colbert_shape
from bench.encoders import ENCODER_SHAPES, write_encoder_shape, write_st_modules
from bench.retrieval_models import (
    HYBRID_SHAPES,
    SPARSE_SHAPES,
    write_hybrid_shape,
    write_sparse_shape,
)
from bench.workloads import bench_corpus

# Qwen3-0.6B's config.json, weights aside.
QWEN3_0_6B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
# SmolLM2-135M's (the default model's), for machines its GGUF file does not reach.
SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
# A small Qwen3 reranker with a one-label sequence-classification head: a decoder classifier's
# path, for checks that need one (`python -m bench snapshot`), not a real model's cost.
QWEN3_CLS_TINY = {
    **QWEN3_0_6B,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "num_labels": 1,
}
# Qwen3-Embedding-0.6B: Qwen3-0.6B's stack (its own vocabulary aside), last-token pooling,
# normalised, queries behind an instruction (the model card's prompt)
QWEN3_EMBEDDING_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
EMBEDDER_SHAPES = {"qwen3-embedding-0.6b": ("Qwen3Config", QWEN3_0_6B)}
SHAPES = {
    "qwen3-0.6b": ("Qwen3Config", QWEN3_0_6B),
    "smollm2-135m": ("LlamaConfig", SMOLLM2_135M),
    "qwen3-cls-tiny": ("Qwen3Config", QWEN3_CLS_TINY),
}
TOKENIZER_VOCAB = 4096


def shape_dir(name: str, *, seed: int = 0, root: Path | None = None) -> Path:
    """The checkpoint directory of shape `name` (a decoder's, or a cross-encoder's of
    `bench.encoders`), written on first use and reused after."""
    writers = {
        **dict.fromkeys(SHAPES, write_checkpoint),
        **dict.fromkeys(ENCODER_SHAPES, write_encoder_shape),
        **dict.fromkeys(EMBEDDER_SHAPES, write_embedder_shape),
        **dict.fromkeys(SPARSE_SHAPES, write_sparse_shape),
        **dict.fromkeys(HYBRID_SHAPES, write_hybrid_shape),
        **dict.fromkeys(COLBERT_SHAPES, write_colbert_shape),
    }
    if name not in writers:
        raise ValueError(f"--shape: {name!r} is not one of {sorted(writers)}")
    root = root or Path(tempfile.gettempdir()) / "llm-scoring-bench"
    path = root / f"{name}-seed{seed}"
    if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file():
        return path
    partial = root / f".{name}-seed{seed}-{os.getpid()}"
    writers[name](partial, name, seed)
    partial.replace(path)
    return path


def write_embedder_shape(path: Path, name: str, seed: int) -> None:
    """A decoder embedder of shape `name` (`EMBEDDER_SHAPES`): the bare model, a tokenizer
    that ends every text with `<|endoftext|>` (read as tokenizer.json is, by transformers too),
    and the sentence-transformers modules (last token, normalised, the query prompt)."""
    import torch
    import transformers
    from tokenizers import processors

    cls_name, fields = EMBEDDER_SHAPES[name]
    cfg = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(cfg, dtype=torch.float32).save_pretrained(
        path, safe_serialization=True
    )
    tok = train_tokenizer(bench_corpus(seed), TOKENIZER_VOCAB)
    eos = "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", special_tokens=[(eos, tok.token_to_id(eos))]
    )
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": eos, "eos_token": eos}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    prompts = {"query": QWEN3_EMBEDDING_PROMPT, "document": ""}
    write_st_modules(path, cfg.hidden_size, "last", True, 8192, prompts)


def write_checkpoint(path: Path, name: str, seed: int) -> None:
    import torch
    import transformers

    cls_name, fields = SHAPES[name]
    cfg = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(seed)
    auto = (
        "AutoModelForSequenceClassification" if "num_labels" in fields else "AutoModelForCausalLM"
    )
    model = getattr(transformers, auto).from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    train_tokenizer(bench_corpus(seed), TOKENIZER_VOCAB).save(str(path / "tokenizer.json"))


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens (`<|endoftext|>` among them) trained on `corpus`.

    The one trainer of the bench's shape checkpoints and the tests' tiny ones.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok
