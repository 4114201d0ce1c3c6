"""SPLADE sparse vectors (`Engine.embed_sparse`, `ScoringModel.embed_sparse`, TEI's
`/embed_sparse`) against sentence-transformers' `SparseEncoder` on the same directories: tiny
random BERT, DistilBERT, ModernBERT and XLM-RoBERTa masked-language models saved as
SparseEncoders of each pooling and activation, in sentence-transformers 6's module names and
5's; packed batches against text by text; only non-zero entries leaving the device; prompts,
pruning, refusals and the errors that name the field."""

import numpy as np
import pytest
import trio
from sentence_transformers import SparseEncoder

from api.app import create_app
from api.settings import settings_from_env
from bench.retrieval_models import write_splade
from engine import (
    EngineConfig,
    InputTooLarge,
    InvalidInput,
    Unsupported,
    load_model,
    open_engine,
)
from engine.device import sparse
from engine.repl.loop import perform
from engine.repl.session import Embed
from engine.tasks.splade import FEW_ROWS
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import serving, tiny_env
from tests.test_embed import tiny_embedder, varied_texts

SPLADES = {
    # name: (config class, fields, tokenizer kind, pooling, activation, module names)
    "bert-max": ("BertConfig", dict(TINY_ENCODER, type_vocab_size=2), "bert", "max", "relu", "v6"),
    "bert-sum-v5": (
        "BertConfig",
        dict(TINY_ENCODER, type_vocab_size=2),
        "bert",
        "sum",
        "relu",
        "v5",
    ),
    "distilbert-log1p": (
        "DistilBertConfig",
        dict(dim=128, hidden_dim=256, n_layers=2, n_heads=2, max_position_embeddings=128),
        "bert",
        "max",
        "log1p_relu",
        "v6",
    ),
    "modernbert-max": (
        "ModernBertConfig",
        dict(TINY_ENCODER, num_hidden_layers=3, local_attention=16, global_attn_every_n_layers=2),
        "modernbert",
        "max",
        "relu",
        "v6",
    ),
    "xlm-roberta-max": (
        "XLMRobertaConfig",
        dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130),
        "xlm-roberta",
        "max",
        "relu",
        "v5",
    ),
}
MAX_LENGTH = 96
PROMPTS = {"query": "query: ", "document": "passage: "}


def tiny_splade(root, name: str, prompts=None):
    cls, fields, kind, pooling, activation, fmt = SPLADES[name]
    return write_splade(
        root / name,
        cls,
        fields,
        kind,
        seed=sum(map(ord, name)),
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
        pooling=pooling,
        activation=activation,
        format=fmt,
        prompts=prompts,
    )


@pytest.fixture(scope="module", params=sorted(SPLADES))
def splade(request, tmp_path_factory):
    return tiny_splade(tmp_path_factory.mktemp("splade"), request.param)


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    return tiny_splade(tmp_path_factory.mktemp("prompted"), "bert-max", PROMPTS)


def config(path, **fields) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        dtype="float32",
        progress=False,
        precompile=False,
        compile_cache_dir=None,
        **fields,
    )


def embed_sparse(path, texts, **options):
    """`Engine.embed_sparse`'s vectors, or the error it raised."""

    async def main():
        async with open_engine(config(path)) as engine:
            try:
                return (await engine.embed_sparse(texts, **options)).embeddings
            except (InvalidInput, Unsupported) as e:
                return e

    return trio.run(main)


def reference(path, texts, **options) -> np.ndarray:
    """sentence-transformers' vectors f32[N, V], dense (it truncates silently)."""
    model = SparseEncoder(str(path), device="cpu")
    return model.encode(texts, batch_size=16, convert_to_tensor=True, **options).to_dense().numpy()


def assert_equal_support(got, want: np.ndarray) -> None:
    """Each vector of `got` has the non-zero entries of its row of `want`, in order, and values
    within 1e-5 of the row's scale (sum pooling adds up to ~80 here, where f32's own spacing is
    8e-6). An entry within that of zero on either side may be zero on the other: a logit at
    ReLU's edge rounds to either side between the engine's products and torch's (which of the
    measured f32 strategies the engine runs decides the order of its sums)."""
    assert len(got) == len(want)
    for i, ((ids, values), row) in enumerate(zip(got, want, strict=True)):
        assert ids.dtype == np.int32 and values.dtype == np.float32
        assert np.all(values > 0) and np.all(np.diff(ids) > 0)
        atol = 1e-5 * max(1.0, row.max())
        dense = np.zeros_like(row)
        dense[ids] = values
        np.testing.assert_allclose(dense, row, rtol=0, atol=atol, err_msg=f"text {i}")
        differ = np.flatnonzero((dense > 0) != (row > 0))
        assert np.all(np.maximum(dense, row)[differ] <= atol), f"text {i}: support {differ}"
        assert len(differ) <= max(1, len(ids) // 100), f"text {i}: support {differ}"


def test_tiny_splades_equal_sentence_transformers(splade):
    # 300 texts, some far over 256 tokens: batches of more than HEAD_ROWS texts, the MLM head
    # over several SPLADE_TOKENS steps, texts cut at the model's 96 tokens
    texts = varied_texts(300, seed=3)
    got = embed_sparse(splade, texts, truncate=True)
    assert_equal_support(got, reference(splade, texts))


def test_packed_batches_equal_text_by_text(splade):
    texts = varied_texts(12, seed=4)
    packed = embed_sparse(splade, texts, truncate=True)
    for text, (ids, values) in zip(texts, packed, strict=True):
        [(alone_ids, alone)] = embed_sparse(splade, [text], truncate=True)
        np.testing.assert_array_equal(ids, alone_ids)
        # 1e-6 of the scale the values come from, as far as f32 sums in another order (a batch
        # of another shape) allow: a max pool's logits (each value is log1p of its logit, at
        # most), a sum pool's sums
        scale = np.expm1(alone.max()) if SPLADES[splade.name][3] == "max" else alone.max()
        assert np.abs(values - alone).max() <= 1e-6 * max(1.0, scale)


def test_max_active_dims_keeps_the_largest_entries_as_sentence_transformers(tmp_path):
    path = tiny_splade(tmp_path, "bert-max")
    texts = CORPUS[:5]
    got = embed_sparse(path, texts, max_active_dims=7)
    want = reference(path, texts, max_active_dims=7)
    assert all(len(ids) == 7 for ids, _ in got)
    assert_equal_support(got, want)


def test_prompts_as_encode_query_and_encode_document(prompted):
    texts = CORPUS[:4]
    model = SparseEncoder(str(prompted), device="cpu")
    query = model.encode_query(texts, convert_to_tensor=True).to_dense().numpy()
    document = model.encode_document(texts, convert_to_tensor=True).to_dense().numpy()
    assert_equal_support(embed_sparse(prompted, texts, prompt_name="query"), query)
    assert_equal_support(embed_sparse(prompted, texts, prompt_name="document"), document)
    assert not np.array_equal(query, document)
    error = embed_sparse(prompted, texts, prompt_name="passage")
    assert isinstance(error, InvalidInput) and error.field == "prompt_name"


def test_load_model_answers_the_engines_vectors(prompted):
    texts = CORPUS[:3]
    with load_model(prompted, dtype="float32") as model:
        got = model.embed_sparse(texts, max_active_dims=5)
    want = embed_sparse(prompted, texts, max_active_dims=5)
    for (ids, values), (want_ids, want_values) in zip(got, want, strict=True):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(values, want_values)


def test_only_non_zero_entries_of_real_rows_leave_the_device():
    rng = np.random.default_rng(0)
    x = np.maximum(rng.normal(size=(40, 30_000)), 0).astype(np.float32)
    x[:5][x[:5] < 3.0] = 0  # ~40 non-zero entries in each of the 5 real rows
    x[4] = 0  # a real row of none
    # the 35 padding rows keep ~15,000 entries each: neither read nor widening the gather
    rows = sparse.fetch(sparse.Pending(x, rows=5))
    counts = (x[:5] > 0).sum(1)
    assert sparse.rows_read(5, 40) == sparse.MIN_WIDTH == 16
    np.testing.assert_array_equal(rows.counts, np.pad(counts, (0, 11)))
    width = sparse.width_for(int(counts.max()), 30_000)
    assert width == 64  # the largest count rounded up, not the vocabulary
    assert rows.values.shape == rows.indices.shape == (16, width)
    for r in range(5):
        ids, values = rows.row(r)
        np.testing.assert_array_equal(ids, np.flatnonzero(x[r]))
        np.testing.assert_array_equal(values, x[r][ids])
    assert sparse.rows_read(17, 40) == 32 and sparse.rows_read(33, 40) == 40


def test_a_batch_of_long_texts_takes_a_bucket_of_few_rows(tmp_path):
    # vocabulary-wide rows: besides the configured T // 2 rows, a T // FEW_ROWS bucket, which a
    # batch of texts of FEW_ROWS tokens or more on average fits
    path = tiny_splade(tmp_path, "bert-max")
    long = " ".join(CORPUS)

    async def main():
        async with open_engine(config(path)) as engine:
            tokens = engine.buckets.tokens[-1]
            assert engine.buckets.rows_for(tokens) == (tokens // FEW_ROWS, tokens // 2)
            await engine.embed_sparse([long] * 3, truncate=True)
            return {shape[:2] for shape in engine.runner.compiled}

    [(tokens, rows)] = trio.run(main)
    assert rows == tokens // FEW_ROWS


def test_refusals_name_the_reason(tmp_path):
    splade = tiny_splade(tmp_path, "bert-max")
    embedder = tiny_embedder(tmp_path, "bert-mean")
    error = embed_sparse(embedder, ["a"])
    assert isinstance(error, Unsupported) and "not a sparse encoder" in str(error)

    async def main():
        async with open_engine(config(splade)) as engine:
            with pytest.raises(Unsupported, match="sparse encoder"):
                await engine.embed(["a"])
            with pytest.raises(InvalidInput, match="sparse encoder") as e:
                await engine.score("q", ["a"], [1])
            assert e.value.field == "label_token_ids"
            with pytest.raises(Unsupported, match="does not rerank"):
                await engine.rerank("q", ["a"])
            assert engine.capabilities.verbs() == ["embed_sparse"]

    trio.run(main)


@pytest.mark.parametrize(
    "texts, options, field, error",
    [
        ([], {}, "input", InvalidInput),
        (["fine", 3], {}, "input[1]", InvalidInput),
        (["fine"], {"max_active_dims": 0}, "max_active_dims", InvalidInput),
        (["fine"], {"max_active_dims": True}, "max_active_dims", InvalidInput),
        (["fine", "word " * 200], {}, "input[1]", InputTooLarge),
        (["fine"], {"truncation_side": "middle"}, "truncation_side", InvalidInput),
    ],
)
def test_bad_input_names_the_field(tmp_path_factory, texts, options, field, error):
    path = tiny_splade(tmp_path_factory.mktemp("bad"), "bert-max")
    got = embed_sparse(path, texts, **options)
    assert isinstance(got, error) and got.field == field, got


def test_the_repl_ranks_by_dot_product_and_shows_top_terms(tmp_path):
    path = tiny_splade(tmp_path, "bert-max")
    docs = CORPUS[:3]

    async def main():
        async with open_engine(config(path)) as engine:
            shown = await perform(engine, Embed(CORPUS[0], docs, None), 120)
            q = (await engine.embed_sparse([CORPUS[0]])).embeddings[0]
            d = (await engine.embed_sparse(docs)).embeddings
            return shown, q, d, engine.tokenizer, engine.model_config.vocab_size

    shown, q, d, tokenizer, vocab = trio.run(main)
    dense = np.zeros((4, vocab), np.float64)
    for row, (ids, values) in zip(dense, [q, *d], strict=True):
        row[ids] = values
    dots = dense[1:] @ dense[0]
    lines = shown.splitlines()
    assert "dot" in lines[0]
    ranked = [int(line.split()[1]) for line in lines[1:4]]
    assert ranked == np.argsort(-dots, kind="stable").tolist()
    top = int(q.indices[np.argmax(q.values)])
    heaviest = tokenizer.id_to_token(top) or f"[{top}]"
    assert lines[4].startswith(f"query: {heaviest} ")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tiny_splade(tmp_path_factory.mktemp("served"), "bert-max")
    for c in serving(create_app(settings_from_env(tiny_env(path))), "asyncio"):
        yield c, path


def test_embed_sparse_route_answers_the_engines_vectors(client):
    client, path = client
    texts = CORPUS[:4]
    want = embed_sparse(path, texts)
    r = client.post("/embed_sparse", json={"inputs": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body) == len(texts)
    for entries, (ids, values) in zip(body, want, strict=True):
        assert [e["index"] for e in entries] == ids.tolist()
        np.testing.assert_array_equal(np.float32([e["value"] for e in entries]), values)
    one = client.post("/embed_sparse", json={"inputs": texts[0], "max_active_dims": 3}).json()
    assert len(one) == 1 and len(one[0]) == 3
    info = client.get("/get_model_info").json()
    assert info["endpoints"] == ["/embed_sparse", "/invocations", "/"]  # SageMaker's, TEI's root


@pytest.mark.parametrize(
    "body, status, kind, field",
    [
        ({"inputs": []}, 400, "Empty", "inputs"),
        ({"inputs": ["fine", ""]}, 400, "Empty", "inputs[1]"),
        ({"inputs": ["fine"], "max_active_dims": 0}, 422, "Validation", "max_active_dims"),
        ({"inputs": ["fine"], "top_k": 3}, 422, "Validation", "top_k"),
        ({"inputs": ["fine", "word " * 200], "truncate": False}, 422, "Validation", "inputs[1]"),
    ],
)
def test_embed_sparse_route_errors_are_teis(client, body, status, kind, field):
    client, _ = client
    r = client.post("/embed_sparse", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error_type"] == kind and field in r.json()["error"], r.text


def test_embed_sparse_on_an_embedder_is_refused(minilm):
    for client in serving(create_app(settings_from_env(tiny_env(minilm))), "asyncio"):
        r = client.post("/embed_sparse", json={"inputs": ["a"]})
        assert r.status_code == 424 and "not a sparse encoder" in r.json()["error"], r.text
        assert r.json()["error_type"] == "Backend"  # TEI's for a model without SPLADE pooling
