"""Cross-encoder checkpoints with random weights: the shapes of real rerankers (and the tests'
tiny ones), saved as real Hugging Face directories that the engine, transformers and
sentence-transformers' `CrossEncoder` all load, each with a tokenizer of its family's kind
trained on the bench's text:

    bert         WordPiece, lower-cased, "[CLS] A [SEP] B [SEP]" with token types 0/1
    xlm-roberta  Unigram (SentencePiece-like), "<s> A </s></s> B </s>"
    modernbert   byte-level BPE, "[CLS] A [SEP] B [SEP]"
"""

import json
from collections.abc import Iterable
from pathlib import Path

from bench.workloads import bench_corpus

# The shapes of cross-encoder/ms-marco-MiniLM-L-6-v2 and BAAI/bge-reranker-v2-m3 (XLM-R large),
# weights aside; the vocabularies are the real ones' sizes.
MINILM_L6 = {
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "vocab_size": 30522,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}
BGE_RERANKER_V2_M3 = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "vocab_size": 250002,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
}
ENCODER_SHAPES = {
    # name: (transformers config class, fields, tokenizer kind, tokenizer model_max_length)
    "minilm-l6": ("BertConfig", MINILM_L6, "bert", 512),
    "bge-reranker-v2-m3": ("XLMRobertaConfig", BGE_RERANKER_V2_M3, "xlm-roberta", 8192),
}
TOKENIZER_VOCAB = 4096

# Special tokens and the transformers tokenizer class of each kind.
_SPECIALS = {
    "bert": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "BertTokenizer"),
    "xlm-roberta": (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "XLMRobertaTokenizer"),
    "modernbert": (["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], "PreTrainedTokenizerFast"),
}
ROLES = {  # tokenizer_config.json's names of the special tokens
    "bert": {"unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"},
    "xlm-roberta": {
        **{"bos": "<s>", "eos": "</s>", "unk": "<unk>", "cls": "<s>", "sep": "</s>"},
        **{"pad": "<pad>", "mask": "<mask>"},
    },
    "modernbert": {
        "unk": "[UNK]",
        "cls": "[CLS]",
        "sep": "[SEP]",
        "pad": "[PAD]",
        "mask": "[MASK]",
    },
}


def train_pair_tokenizer(kind: str, corpus: Iterable[str], vocab_size: int):
    """A `tokenizers.Tokenizer` of `kind` (see the module docstring) with its pair template."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials, _ = _SPECIALS[kind]
    if kind == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials, show_progress=False
        )
    elif kind == "xlm-roberta":
        # the pipeline transformers' XLMRobertaTokenizer builds around a checkpoint's vocabulary
        tok = Tokenizer(models.Unigram())
        split = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), split])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
        )
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tok.train_from_iterator(list(corpus), trainer)
    if kind == "xlm-roberta":
        bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", bos), ("</s>", eos)],
        )
    else:
        cls, sep = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]"))
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    return tok


def special_ids(tok, kind: str) -> dict[str, int]:
    """The `*_token_id` fields of a transformers config for the tokenizer `tok` of `kind`."""
    specials = {r: tok.token_to_id(t) for r, t in ROLES[kind].items()}
    roles = ("pad", "bos", "eos", "cls", "sep")
    return {f"{r}_token_id": specials[r] for r in roles if r in specials}


def save_pair_tokenizer(tok, kind: str, path: Path, model_max_length: int) -> None:
    """tokenizer.json and the tokenizer_config.json transformers' AutoTokenizer reads."""
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    _, cls_name = _SPECIALS[kind]
    config = {
        "tokenizer_class": cls_name,
        "model_max_length": model_max_length,
        **{f"{role}_token": token for role, token in ROLES[kind].items()},
    }
    if kind == "bert":
        config["do_lower_case"] = True
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_encoder(
    path: Path,
    config_class: str,
    fields: dict,
    kind: str,
    *,
    seed: int,
    corpus: Iterable[str],
    model_max_length: int,
    vocab: int = TOKENIZER_VOCAB,
    perturb: float = 0.0,
    embedder: tuple[str, bool, int | None] | None = None,
) -> Path:
    """A random `*ForSequenceClassification` checkpoint of `config_class(**fields)` saved with
    `save_pretrained`, with a tokenizer of `kind`. `perturb` > 0 moves norms and biases off
    their initial 1 and 0 so that a test sees them. `embedder`: the bare model instead, with
    the sentence-transformers modules of that pooling ("cls" or "mean", normalised or not) and
    that `max_seq_length` (`write_st_modules`)."""
    import torch
    import transformers

    tok = train_pair_tokenizer(kind, corpus, vocab)
    ids = special_ids(tok, kind)
    cfg = getattr(transformers, config_class)(
        **{**ids, **fields, "num_labels": fields.get("num_labels", 1)}
    )
    torch.manual_seed(seed)
    auto = transformers.AutoModel if embedder else transformers.AutoModelForSequenceClassification
    model = auto.from_config(cfg, dtype=torch.float32)
    if perturb:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name.lower() or name.endswith("bias"):
                    p.add_(perturb * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    save_pair_tokenizer(tok, kind, path, model_max_length)
    if embedder:
        write_st_modules(path, cfg.hidden_size, *embedder)
    return path


def write_st_modules(
    path: Path,
    dimension: int,
    mode: str,
    normalize: bool,
    max_seq_length: int | None,
    prompts: dict[str, str] | None = None,
) -> None:
    """The files that make the model directory `path` a sentence-transformers embedder: its
    modules (Transformer, Pooling of `mode`, Normalize when `normalize`), the pooling's config,
    `max_seq_length` (None: left to the tokenizer) and the named `prompts`."""
    kinds = ["Transformer", "Pooling"] + ["Normalize"] * normalize
    paths = ["", "1_Pooling", "2_Normalize"]
    modules = [
        {"idx": i, "name": str(i), "path": paths[i], "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    pooling = {f"pooling_mode_{m}": mode == short for m, short in _POOLING_KEYS.items()}
    pooling["word_embedding_dimension"] = dimension
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    bert_config = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(bert_config))
    if prompts:
        st_config = {"prompts": prompts, "default_prompt_name": None}
        (path / "config_sentence_transformers.json").write_text(json.dumps(st_config))


_POOLING_KEYS = {
    "cls_token": "cls",
    "mean_tokens": "mean",
    "max_tokens": "max",
    "lasttoken": "last",
}


def write_encoder_shape(path: Path, name: str, seed: int) -> None:
    """The cross-encoder checkpoint of shape `name` (`ENCODER_SHAPES`) at `path`."""
    cls_name, fields, kind, max_length = ENCODER_SHAPES[name]
    corpus = bench_corpus(seed)
    write_encoder(
        path, cls_name, fields, kind, seed=seed, corpus=corpus, model_max_length=max_length
    )
