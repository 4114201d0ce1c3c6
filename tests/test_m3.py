"""BGE-M3 (`Engine.embed_hybrid`, and `embed`, `embed_sparse`, `embed_multi` on it) against
FlagEmbedding's `BGEM3FlagModel.encode` on the same directory: a tiny random XLM-RoBERTa
sentence-transformers embedder with `colbert_linear.pt` and `sparse_linear.pt` beside it, as
FlagEmbedding saves them. Dense vectors, lexical weights and multi-vectors from one forward of
each text, equal to each asked alone, packed equal to alone."""

import msgspec
import numpy as np
import pytest
import trio
from FlagEmbedding import BGEM3FlagModel

from api.app import create_app
from api.settings import settings_from_env
from bench.retrieval_models import write_m3
from engine import EngineConfig, InputTooLarge, InvalidInput, Unsupported, open_engine
from engine.capabilities import Ability
from engine.loaders.torch_pickle import read_state_dict
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import serving, tiny_env
from tests.test_embed import varied_texts

FIELDS = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
MAX_LENGTH = 96  # the tokenizer's model_max_length, FlagEmbedding's max_length here


@pytest.fixture(scope="module", params=[None, 48])
def m3(request, tmp_path_factory):
    """A tiny BGE-M3, its multi-vectors of the hidden width and of 48 dimensions."""
    root = tmp_path_factory.mktemp("m3")
    options = dict(seed=11, corpus=CORPUS, model_max_length=MAX_LENGTH, vocab=300)
    return write_m3(root / "m3", FIELDS, colbert_dim=request.param, **options)


def config(path) -> EngineConfig:
    return EngineConfig(
        model=str(path), dtype="float32", progress=False, precompile=False, compile_cache_dir=None
    )


def run(path, calls):
    """`calls(engine)`'s answer on an engine of `path`."""

    async def main():
        async with open_engine(config(path)) as engine:
            return await calls(engine)

    return trio.run(main)


def reference(path, texts) -> dict:
    colbert_dim = read_state_dict(path / "colbert_linear.pt")["weight"].shape[0]
    model = BGEM3FlagModel(str(path), use_fp16=False, devices="cpu", colbert_dim=colbert_dim)
    return model.encode(
        texts,
        batch_size=16,
        max_length=MAX_LENGTH,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )


def assert_hybrid_equal(got, want: dict) -> None:
    assert np.abs(got.dense - want["dense_vecs"]).max() < 1e-5
    for (ids, weights), lexical in zip(got.sparse, want["lexical_weights"], strict=True):
        theirs = sorted(int(k) for k in lexical)
        assert ids.tolist() == theirs
        expected = np.float32([lexical[str(k)] for k in theirs])
        assert np.abs(weights - expected).max(initial=0) <= 1e-5 * max(1.0, expected.max(initial=0))
    for vectors, colbert in zip(got.multi, want["colbert_vecs"], strict=True):
        assert vectors.shape == colbert.shape
        assert np.abs(vectors - colbert).max() < 1e-5


def test_one_pass_equals_flag_embedding(m3):
    texts = varied_texts(60, seed=5)
    got = run(m3, lambda e: e.embed_hybrid(texts, truncate=True))
    assert_hybrid_equal(got, reference(m3, texts))
    assert sum(len(ids) for ids, _ in got.sparse) > 0  # some tokens weigh above 0


def test_three_outputs_from_one_forward_equal_each_asked_alone(m3):
    texts = varied_texts(20, seed=6)

    async def calls(engine):
        before = engine.stats().real_tokens
        both = await engine.embed_hybrid(texts, truncate=True)
        one_pass = engine.stats().real_tokens - before
        dense = await engine.embed(texts, truncate=True)
        sparse = await engine.embed_sparse(texts, truncate=True)
        multi = await engine.embed_multi(texts, truncate=True)
        return both, one_pass, dense, sparse, multi

    both, one_pass, dense, sparse, multi = run(m3, calls)
    assert one_pass == both.prompt_tokens  # each text's tokens computed once for all three
    np.testing.assert_array_equal(both.dense, dense.embeddings)
    for (ids, w), (alone_ids, alone_w) in zip(both.sparse, sparse.embeddings, strict=True):
        np.testing.assert_array_equal(ids, alone_ids)
        np.testing.assert_array_equal(w, alone_w)
    for a, b in zip(both.multi, multi.embeddings, strict=True):
        np.testing.assert_array_equal(a, b)


def test_packed_equals_text_by_text(m3):
    texts = varied_texts(8, seed=7)
    packed = run(m3, lambda e: e.embed_hybrid(texts, truncate=True))
    for i, text in enumerate(texts):
        alone = run(m3, lambda e, t=text: e.embed_hybrid([t], truncate=True))
        assert np.abs(packed.dense[i] - alone.dense[0]).max() <= 1e-6
        np.testing.assert_array_equal(packed.sparse[i].indices, alone.sparse[0].indices)
        assert np.abs(packed.sparse[i].values - alone.sparse[0].values).max(initial=0) <= 1e-5
        assert np.abs(packed.multi[i] - alone.multi[0]).max() <= 1e-6


def test_subsets_and_refusals(m3):
    async def calls(engine):
        only_sparse = await engine.embed_hybrid(["a fox"], dense=False, multi=False)
        with pytest.raises(InvalidInput) as none:
            await engine.embed_hybrid(["a fox"], dense=False, sparse=False, multi=False)
        with pytest.raises(Unsupported, match="multi-vectors"):
            await engine.embed_tokens(["a fox"])
        with pytest.raises(InvalidInput) as pruned:
            await engine.embed_hybrid(["a fox"], max_active_dims=0)
        return only_sparse, none.value, pruned.value, engine.capabilities

    only_sparse, none, pruned, caps = run(m3, calls)
    assert only_sparse.dense is None and only_sparse.multi is None and only_sparse.sparse
    assert none.field == "dense" and pruned.field == "max_active_dims"
    offered = {a for a in Ability if caps.offers(a)}
    assert {
        Ability.EMBED,
        Ability.EMBED_SPARSE,
        Ability.EMBED_MULTI,
        Ability.EMBED_HYBRID,
    } <= offered
    assert Ability.SCORE not in offered and Ability.EMBED_TOKENS not in offered


def test_other_models_refuse_hybrid_outputs(minilm):
    async def calls(engine):
        for call in (engine.embed_multi, engine.embed_hybrid):
            with pytest.raises(Unsupported, match="not a multi-vector or hybrid embedder"):
                await call(["a"])

    run(minilm, calls)


def test_rerank_is_flag_embeddings_compute_score(m3):
    query, documents = CORPUS[0], [*CORPUS[1:7], "a", "Zürich—São Paulo"]
    weights = (0.4, 0.2, 0.4)

    async def main():
        engine_config = msgspec.structs.replace(config(m3), hybrid_weights=weights)
        async with open_engine(engine_config) as engine:
            return await engine.rerank(query, documents)

    result = trio.run(main)
    colbert_dim = read_state_dict(m3 / "colbert_linear.pt")["weight"].shape[0]
    model = BGEM3FlagModel(str(m3), use_fp16=False, devices="cpu", colbert_dim=colbert_dim)
    want = [  # one pair a call: no padding, which would count as a zero vector in MaxSim
        model.compute_score(
            [(query, d)],
            batch_size=1,
            max_query_length=MAX_LENGTH,
            max_passage_length=MAX_LENGTH,
            weights_for_different_modes=list(weights),
        )["colbert+sparse+dense"][0]
        for d in documents
    ]
    got = {h.index: h.relevance_score for h in result.results}
    assert np.abs(np.array([got[i] for i in range(len(documents))]) - want).max() < 1e-5
    assert [h.index for h in result.results] == np.argsort(-np.array(want), kind="stable").tolist()


def test_rerank_errors_name_the_field(m3):
    async def main():
        async with open_engine(config(m3)) as engine:
            errors = []
            for query, docs, options in [
                ("q", ["fine", "word " * 200], {}),
                ("word " * 200, ["fine"], {}),
                ("q", [], {}),
            ]:
                with pytest.raises(InvalidInput) as e:
                    await engine.rerank(query, docs, **options)
                errors.append(e.value.field)
            cut = await engine.rerank("q", ["fine", "word " * 200], max_tokens_per_doc=8)
            return errors, cut

    errors, cut = trio.run(main)
    assert errors == ["documents[1]", "query", "documents"]
    assert cut.truncated_tokens > 0 and len(cut.results) == 2


@pytest.fixture(scope="module")
def served(m3):
    yield from serving(create_app(settings_from_env(tiny_env(m3))), "asyncio")


def test_the_routes_answer_the_engines_vectors(m3, served):
    texts = CORPUS[:3]
    want = run(m3, lambda e: e.embed_hybrid(texts))
    r = served.post("/embed_hybrid", json={"inputs": texts, "max_active_dims": 5})
    assert r.status_code == 200, r.text
    for i, answer in enumerate(r.json()):
        np.testing.assert_array_equal(np.float32(answer["dense"]), want.dense[i])
        np.testing.assert_array_equal(np.float32(answer["multi"]), want.multi[i])
        values = np.float32([e["value"] for e in answer["sparse"]])
        assert len(values) == min(5, len(want.sparse[i].values))
        assert set(values) <= set(want.sparse[i].values)
    only = served.post("/embed_hybrid", json={"inputs": texts[0], "dense": False, "multi": False})
    assert only.status_code == 200 and list(only.json()[0]) == ["sparse"], only.text
    r = served.post("/pooling", json={"input": texts, "task": "token_embed"})
    assert r.status_code == 200, r.text
    for d, vectors in zip(r.json()["data"], want.multi, strict=True):
        np.testing.assert_array_equal(np.float32(d["data"]), vectors)
    r = served.post("/embed_sparse", json={"inputs": texts})
    assert [[e["index"] for e in v] for v in r.json()] == [v.indices.tolist() for v in want.sparse]
    r = served.post("/v1/embeddings", json={"input": texts})
    got = np.float32([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_array_equal(got, want.dense)
    endpoints = served.get("/get_model_info").json()["endpoints"]
    assert {"/embed_hybrid", "/embed_sparse", "/v1/embeddings", "/v1/rerank"} <= set(endpoints)


def test_every_rerank_route_ranks_by_the_hybrid_score(m3, served):
    query, documents = CORPUS[0], CORPUS[1:5]
    want = run(m3, lambda e: e.rerank(query, documents))
    r = served.post("/v1/rerank", json={"query": query, "documents": documents})
    assert r.status_code == 200, r.text
    got = [(h["index"], h["relevance_score"]) for h in r.json()["results"]]
    assert [i for i, _ in got] == [h.index for h in want.results]
    # the server's token budget batches otherwise: f32 sums in another order
    assert np.allclose([s for _, s in got], [h.relevance_score for h in want.results], atol=1e-6)
    r = served.post("/rerank", json={"query": query, "texts": documents})  # TEI's
    assert r.status_code == 200 and [h["index"] for h in r.json()] == [i for i, _ in got]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"inputs": ["a"], "dense": False, "sparse": False, "multi": False}, "dense"),
        ({"inputs": ["a"], "max_active_dims": 0}, "max_active_dims"),
        ({"inputs": ["a"], "colbert": True}, "colbert"),
        ({"inputs": ["a", "word " * 200], "truncate": False}, "inputs[1]"),
    ],
)
def test_embed_hybrid_errors_name_the_field(served, body, field):
    r = served.post("/embed_hybrid", json=body)
    assert r.status_code == 422 and r.json()["error_type"] == "Validation", r.text
    assert field in r.json()["error"], r.text


def test_the_bound_on_returned_vectors_covers_multi_vectors(m3):
    bounded = msgspec.structs.replace(config(m3), max_token_vectors_per_request=20)

    async def main():
        async with open_engine(bounded) as engine:
            fits = await engine.embed_multi(["a fox"])
            with pytest.raises(InputTooLarge) as e:  # each text fits the model, not all three
                await engine.embed_hybrid(CORPUS[:3])
            return fits, e.value

    fits, error = trio.run(main)
    assert len(fits.embeddings) == 1
    assert error.field == "input" and "vectors exceed the limit of 20" in str(error)


def test_vllm_score_pairs_each_query_with_its_document(m3, served):
    queries, documents = [CORPUS[0], CORPUS[0], CORPUS[2]], CORPUS[3:6]
    r = served.post("/score", json={"queries": queries, "documents": documents})
    assert r.status_code == 200, r.text
    got = [d["score"] for d in r.json()["data"]]
    want = [
        {h.index: h.relevance_score for h in run(m3, lambda e, q=q: e.rerank(q, documents)).results}
        for q in (CORPUS[0], CORPUS[2])
    ]
    expected = [want[0][0], want[0][1], want[1][2]]  # pair i: queries[i] with documents[i]
    assert np.allclose(got, expected, atol=1e-6), (got, expected)
