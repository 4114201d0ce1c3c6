"""Hybrid-retrieval checkpoints with random weights, saved as the reference libraries save them
and loaded by them and by the engine alike: SPLADE sparse encoders (a `*ForMaskedLM` with
sentence-transformers' SparseEncoder modules), each with a tokenizer of its family's kind
(`bench.encoders`)."""

import json
from collections.abc import Iterable
from pathlib import Path

from bench.encoders import save_pair_tokenizer, special_ids, train_pair_tokenizer

# SparseEncoder modules as sentence-transformers 6 writes them, and as 5.0-5.3 did
_SPARSE_MODULES = {
    "v6": (
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
    ),
    "v5": (
        "sentence_transformers.sparse_encoder.models.MLMTransformer",
        "sentence_transformers.sparse_encoder.models.SpladePooling",
    ),
}


def write_splade(
    path: Path,
    config_class: str,
    fields: dict,
    kind: str,
    *,
    seed: int,
    corpus: Iterable[str],
    model_max_length: int,
    vocab: int,
    pooling: str = "max",
    activation: str = "relu",
    format: str = "v6",
    prompts: dict[str, str] | None = None,
    perturb: float = 0.3,
    vocab_bias: float | None = None,
) -> Path:
    """A random `*ForMaskedLM` of `config_class(**fields)` with a tokenizer of `kind` of
    `vocab` tokens (the model's vocabulary), saved as a SparseEncoder directory of SpladePooling
    `pooling` and `activation`, its modules named as sentence-transformers `format` ("v6" or
    "v5") names them, with the named `prompts`. `perturb` moves norms and biases off 1 and 0;
    `vocab_bias` sets every vocabulary logit's bias instead, so that few are positive (a real
    SPLADE model's few hundred terms a text, where random weights make half the vocabulary's).
    `fields` may give a vocabulary larger than the tokenizer's."""
    import torch
    import transformers

    tok = train_pair_tokenizer(kind, corpus, vocab)
    ids = special_ids(tok, kind)
    cfg = getattr(transformers, config_class)(
        **{**ids, "vocab_size": tok.get_vocab_size(), **fields}
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForMaskedLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(perturb * torch.randn_like(p))
        if vocab_bias is not None:
            model.get_output_embeddings().bias.fill_(vocab_bias)
    model.save_pretrained(path, safe_serialization=True)
    save_pair_tokenizer(tok, kind, path, model_max_length)
    _write_sparse_modules(path, pooling, activation, format, prompts or {})
    return path


# naver/splade-v3's and splade-cocondenser's shape (BERT-base), weights aside
SPLADE_BERT_BASE = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "vocab_size": 30522,
    "initializer_range": 0.02,
}
SPARSE_SHAPES = {"splade-bert-base": ("BertConfig", SPLADE_BERT_BASE, "bert", 512)}
# BAAI/bge-m3's shape (XLM-RoBERTa large), weights aside
BGE_M3 = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "vocab_size": 250002,
    "layer_norm_eps": 1e-5,
    "initializer_range": 0.02,
}
HYBRID_SHAPES = {"bge-m3": BGE_M3}
SPLADE_VOCAB_BIAS = -2.0  # ~100-200 terms a text of 25-60 tokens, as real SPLADE models


def write_sparse_shape(path: Path, name: str, seed: int) -> None:
    """The SPLADE model of shape `name` (`SPARSE_SHAPES`) at `path`, max pooling."""
    from bench.workloads import bench_corpus

    cls_name, fields, kind, max_length = SPARSE_SHAPES[name]
    write_splade(
        path,
        cls_name,
        fields,
        kind,
        seed=seed,
        corpus=bench_corpus(seed),
        model_max_length=max_length,
        vocab=4096,
        perturb=0.0,
        vocab_bias=SPLADE_VOCAB_BIAS,
    )


def write_hybrid_shape(path: Path, name: str, seed: int) -> None:
    """The BGE-M3 of shape `name` (`HYBRID_SHAPES`) at `path`."""
    from bench.workloads import bench_corpus

    write_m3(
        path,
        HYBRID_SHAPES[name],
        seed=seed,
        corpus=bench_corpus(seed),
        model_max_length=8192,
        vocab=4096,
        max_seq_length=8192,
        perturb=0.0,
    )


def _write_sparse_modules(
    path: Path, pooling: str, activation: str, format: str, prompts: dict[str, str]
) -> None:
    transformer, splade = _SPARSE_MODULES[format]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": transformer},
        {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": splade},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_SpladePooling").mkdir(exist_ok=True)
    config = {"pooling_strategy": pooling, "activation_function": activation}
    config["embedding_dimension" if format == "v6" else "word_embedding_dimension"] = None
    (path / "1_SpladePooling" / "config.json").write_text(json.dumps(config, indent=2))
    if format == "v6":
        settings = {
            "transformer_task": "fill-mask",
            "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
            "module_output_name": "token_embeddings",
        }
    else:
        settings = {"max_seq_length": None, "do_lower_case": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2))
    st_config = {"model_type": "SparseEncoder", "prompts": prompts, "default_prompt_name": None}
    (path / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2))


def write_m3(
    path: Path,
    fields: dict,
    *,
    seed: int,
    corpus: Iterable[str],
    model_max_length: int,
    vocab: int,
    colbert_dim: int | None = None,
    max_seq_length: int | None = None,
    perturb: float = 0.3,
) -> Path:
    """A random BGE-M3 of XLM-RoBERTa `fields`: the sentence-transformers embedder (CLS pooling,
    normalised) with FlagEmbedding's `colbert_linear.pt` (to `colbert_dim`, by default the
    hidden size) and `sparse_linear.pt` beside it, saved with `torch.save` as FlagEmbedding
    saves them."""
    import torch

    from bench.encoders import write_encoder

    write_encoder(
        path,
        "XLMRobertaConfig",
        fields,
        "xlm-roberta",
        seed=seed,
        corpus=corpus,
        model_max_length=model_max_length,
        vocab=vocab,
        perturb=perturb,
        embedder=("cls", True, max_seq_length),
    )
    hidden = fields["hidden_size"]
    torch.manual_seed(seed + 1)
    colbert = torch.nn.Linear(hidden, colbert_dim or hidden)
    sparse = torch.nn.Linear(hidden, 1)
    with torch.no_grad():  # about half the tokens weigh above 0
        sparse.weight.normal_(0.0, 0.2)
        sparse.bias.fill_(0.0)
    torch.save(colbert.state_dict(), path / "colbert_linear.pt")
    torch.save(sparse.state_dict(), path / "sparse_linear.pt")
    return path
