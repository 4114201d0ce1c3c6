"""ColBERT checkpoints with random weights, written as PyLate saves them (a BERT
sentence-transformers Transformer, a Dense projection, `config_sentence_transformers.json`
with markers, lengths, expansion and skiplist) or as colbert-ir does (`HF_ColBERT`: BERT under
`bert.` with `linear.weight`, `artifact.metadata`). Made of numpy, safetensors and tokenizers
alone, from a seed and a fixed WordPiece vocabulary, so that the same directory comes out in
any environment: the test stack's and PyLate's own (`tests/reference/pylate_colbert.py`)."""

import json
import string
from pathlib import Path

import numpy as np
import tokenizers
from safetensors.numpy import save_file

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
# some punctuation is in the vocabulary; the rest of PyLate's skiplist stands for [UNK]
PUNCTUATION = list(".,!?'-:;()")
WORDS = (
    "the a an of to in is are was be on for with as by at from and or not this that it what "
    "which who how why when where dog dogs cat cats fox quick brown lazy jumps over runs run "
    "river bank money water fish tree trees green red blue sky sun moon star light dark night "
    "day time year city town road car train house home school book books paper score query "
    "document search rank late interaction vector vectors token tokens model models"
).split()
PIECES = ["##s", "##ing", "##ed", "##er", "##ly"]
MARKERS = ["[Q] ", "[D] "]  # PyLate's added tokens


# colbert-ir/colbertv2.0's shape (BERT-base, 128-dimensional vectors) with PyLate's lengths of
# answerai-colbert and GTE-ModernColBERT documents, weights aside
COLBERT_SHAPES = {
    "colbert-bert-base": dict(
        hidden=768,
        layers=12,
        heads=12,
        intermediate=3072,
        positions=512,
        dim=128,
        query_length=32,
        document_length=300,
        scale=0.02,
    ),
}


def vocabulary(words: list[str]) -> list[str]:
    return SPECIAL + PUNCTUATION + list(dict.fromkeys(words)) + PIECES


def write_colbert_shape(path: Path, name: str, seed: int) -> None:
    """The ColBERT model of shape `name` (`COLBERT_SHAPES`) at `path`, in PyLate's format, its
    vocabulary the bench corpus's words."""
    import re

    from bench.workloads import bench_corpus

    corpus = {w for text in bench_corpus(seed) for w in re.findall(r"[a-z]+", text.lower())}
    write_colbert(path, seed=seed, words=WORDS + sorted(corpus), **COLBERT_SHAPES[name])


def write_colbert(
    path: Path,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    intermediate: int = 64,
    positions: int = 64,
    dim: int = 16,
    query_length: int = 12,
    document_length: int = 24,
    expand: bool = True,
    attend_expansion: bool = False,
    bias: bool = False,
    format: str = "pylate",
    scale: float = 0.2,
    words: list[str] = WORDS,
) -> Path:
    """A ColBERT directory at `path` of `format` ("pylate" or "stanford"), its weights drawn
    from `seed`, its vocabulary `words` besides special tokens and punctuation; returns
    `path`."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(words)
    stanford = format == "stanford"
    size = len(vocab) + (0 if stanford else len(MARKERS))
    rng = np.random.default_rng(seed)
    tensors = _bert(rng, size, hidden, layers, intermediate, positions, scale)
    linear = {"linear.weight": _normal(rng, (dim, hidden), scale)}
    if bias:
        linear["linear.bias"] = _normal(rng, (dim,), scale)
    _write_tokenizer(path, vocab, markers=not stanford, positions=positions)
    config = {
        "architectures": ["HF_ColBERT" if stanford else "BertModel"],
        "model_type": "bert",
        "vocab_size": size,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "hidden_act": "gelu",
        "max_position_embeddings": positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }
    _json(path / "config.json", config)
    lengths = dict(query_length=query_length, document_length=document_length)
    if stanford:
        save_file(
            {**{f"bert.{k}": v for k, v in tensors.items()}, **linear}, path / "model.safetensors"
        )
        metadata = {
            "query_token_id": "[unused0]",
            "doc_token_id": "[unused1]",
            "query_maxlen": query_length,
            "doc_maxlen": document_length,
            "attend_to_mask_tokens": attend_expansion,
        }
        _json(path / "artifact.metadata", metadata)
        return path
    save_file(tensors, path / "model.safetensors")
    _write_pylate(path, linear, hidden, dim, bias, expand, attend_expansion, lengths, positions)
    return path


def _write_pylate(path, linear, hidden, dim, bias, expand, attend, lengths, positions) -> None:
    (path / "1_Dense").mkdir(exist_ok=True)
    save_file(linear, path / "1_Dense" / "model.safetensors")
    dense = {
        "in_features": hidden,
        "out_features": dim,
        "bias": bias,
        "activation_function": "torch.nn.modules.linear.Identity",
        "use_residual": False,
    }
    _json(path / "1_Dense" / "config.json", dense)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    _json(path / "modules.json", modules)
    _json(path / "sentence_bert_config.json", {"max_seq_length": positions, "do_lower_case": False})
    settings = {
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": MARKERS[0],
        "document_prefix": MARKERS[1],
        **lengths,
        "attend_to_expansion_tokens": attend,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": expand,
        "model_type": "ColBERT",
    }
    _json(path / "config_sentence_transformers.json", settings)


def _bert(rng, vocab: int, e: int, layers: int, i: int, positions: int, scale: float) -> dict:
    """A BertModel's tensors by their Hugging Face names (no `bert.` prefix), f32."""
    t = {
        "embeddings.word_embeddings.weight": _normal(rng, (vocab, e), scale),
        "embeddings.position_embeddings.weight": _normal(rng, (positions, e), scale),
        "embeddings.token_type_embeddings.weight": _normal(rng, (2, e), scale),
        **_norm(rng, "embeddings.LayerNorm", e),
        "pooler.dense.weight": _normal(rng, (e, e), scale),
        "pooler.dense.bias": _normal(rng, (e,), scale),
    }
    for n in range(layers):
        at = f"encoder.layer.{n}."
        shapes = {
            "attention.self.query": (e, e),
            "attention.self.key": (e, e),
            "attention.self.value": (e, e),
            "attention.output.dense": (e, e),
            "intermediate.dense": (i, e),
            "output.dense": (e, i),
        }
        for name, shape in shapes.items():
            t[f"{at}{name}.weight"] = _normal(rng, shape, scale)
            t[f"{at}{name}.bias"] = _normal(rng, shape[:1], scale)
        t |= _norm(rng, f"{at}attention.output.LayerNorm", e)
        t |= _norm(rng, f"{at}output.LayerNorm", e)
    return t


def _norm(rng, name: str, e: int) -> dict:
    return {
        f"{name}.weight": (1 + _normal(rng, (e,), 0.1)).astype(np.float32),
        f"{name}.bias": _normal(rng, (e,), 0.1),
    }


def _normal(rng, shape, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _write_tokenizer(path: Path, vocab: list[str], *, markers: bool, positions: int) -> None:
    """A lower-casing BERT WordPiece tokenizer of `vocab` ([CLS] text [SEP]), with PyLate's
    marker tokens added after it where `markers`."""
    model = tokenizers.models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tokenizers.decoders.WordPiece()
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in SPECIAL])
    if markers:
        tok.add_tokens([tokenizers.AddedToken(t, normalized=True) for t in MARKERS])
    tok.save(str(path / "tokenizer.json"))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "model_max_length": positions,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "unk_token": "[UNK]",
    }
    _json(path / "tokenizer_config.json", config)


def _json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
