"""ColBERT (`Engine.embed_multi` with `input_type`, and MaxSim reranks) against PyLate on the same
directories: tiny random ColBERT models of `bench.colbert_models` in PyLate's format (with and
without query expansion, attending to the expansion or not, a projection with a bias) and in
colbert-ir's, whose PyLate encodings and scores `tests/reference/pylate_colbert.py` wrote to
`pylate_colbert.json` (PyLate cannot share this environment). Packed equals alone; the routes
answer what the engine does."""

import json
from pathlib import Path

import numpy as np
import pytest

from api.app import create_app
from api.settings import settings_from_env
from bench.colbert_models import write_colbert
from engine import InputTooLarge, InvalidInput, Unsupported
from engine.capabilities import Ability
from tests.reference.pylate_colbert import DOCUMENTS, QUERIES, VARIANTS
from tests.test_api_support import on_engine, serving, tiny_env

REFERENCE = json.loads((Path(__file__).parent / "reference" / "pylate_colbert.json").read_text())


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory) -> tuple[str, Path]:
    name = request.param
    return name, write_colbert(tmp_path_factory.mktemp("colbert") / name, **VARIANTS[name])


@pytest.fixture(scope="module")
def colbert(tmp_path_factory) -> Path:
    return write_colbert(tmp_path_factory.mktemp("colbert") / "pylate", **VARIANTS["pylate"])


def close(got: list[np.ndarray], want: list[list], atol: float = 1e-5) -> None:
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w, np.float32), atol=atol, rtol=0)


def test_encodings_and_maxsim_equal_pylate(variant):
    name, path = variant
    want = REFERENCE[name]

    async def calls(engine):
        queries = await engine.embed_multi(QUERIES, input_type="query", truncate=True)
        documents = await engine.embed_multi(DOCUMENTS, input_type="document", truncate=True)
        ranked = [await engine.rerank(q, DOCUMENTS) for q in QUERIES]
        return queries, documents, ranked

    queries, documents, ranked = on_engine(path, calls)
    close(queries.embeddings, want["queries"])
    close(documents.embeddings, want["documents"])
    assert queries.truncated_tokens > 0 and documents.truncated_tokens > 0  # the long ones
    for hits, scores in zip(ranked, want["scores"], strict=True):
        got = [h.relevance_score for h in sorted(hits.results, key=lambda h: h.index)]
        np.testing.assert_allclose(got, scores, atol=1e-4, rtol=1e-6)
        assert [h.index for h in hits.results] == list(np.argsort(-np.array(got), kind="stable"))


def test_expansion_is_hidden_from_the_query_unless_the_model_attends_to_it(tmp_path):
    """The same weights with and without attention to the expansion give the same vectors at
    a query's own tokens only where its pads are seen by none: the pads change nothing."""
    options = dict(seed=5, query_length=16)
    hidden = write_colbert(tmp_path / "hidden", **options)
    shown = write_colbert(tmp_path / "shown", attend_expansion=True, **options)
    bare = write_colbert(tmp_path / "bare", expand=False, **options)
    query = ["the quick brown fox"]  # 7 tokens with [CLS], [Q] and [SEP]: 9 pads
    embed = lambda e: e.embed_multi(query, input_type="query")
    hidden_v, shown_v, bare_v = (on_engine(p, embed).embeddings[0] for p in (hidden, shown, bare))
    assert hidden_v.shape == shown_v.shape == (16, 16) and bare_v.shape == (7, 16)
    np.testing.assert_allclose(hidden_v[:7], bare_v, atol=1e-6)
    assert np.abs(shown_v[:7] - bare_v).max() > 1e-3


def test_packed_equals_alone_and_queries_differ_from_documents(colbert):
    texts = QUERIES + DOCUMENTS

    async def calls(engine):
        together = await engine.embed_multi(texts, truncate=True)
        alone = [await engine.embed_multi([t], truncate=True) for t in texts]
        as_query = await engine.embed_multi(texts[:1], input_type="query", truncate=True)
        return together, alone, as_query

    together, alone, as_query = on_engine(colbert, calls)
    close(together.embeddings, [a.embeddings[0] for a in alone], atol=1e-6)
    assert len(as_query.embeddings[0]) == 12 != len(together.embeddings[0])


def test_token_ids_are_encoded_as_given(colbert):
    ids = [[2, 30, 40, 3]]

    async def calls(engine):
        return await engine.embed_multi(ids), await engine.embed_multi(ids, input_type="query")

    document, query = on_engine(colbert, calls)
    assert document.embeddings[0].shape == query.embeddings[0].shape == (4, 16)
    np.testing.assert_allclose(document.embeddings[0], query.embeddings[0], atol=1e-6)


def test_refusals_name_the_field(colbert):
    long_document = " ".join(["dog"] * 40)

    async def calls(engine):
        caps = engine.capabilities
        assert caps.offers(Ability.EMBED_MULTI) and caps.offers(Ability.RERANK)
        for verb in (engine.embed, engine.embed_tokens, engine.embed_sparse, engine.embed_hybrid):
            with pytest.raises(Unsupported, match="late-interaction model"):
                await verb(["a dog"])
        with pytest.raises(InvalidInput) as bad_type:
            await engine.embed_multi(["a dog"], input_type="passage")
        with pytest.raises(InputTooLarge) as too_long:
            await engine.embed_multi(["a dog", long_document])
        with pytest.raises(InputTooLarge) as long_query:
            await engine.embed_multi([long_document], input_type="query")
        return bad_type.value, too_long.value, long_query.value

    bad_type, too_long, long_query = on_engine(colbert, calls)
    assert bad_type.field == "input_type"
    assert too_long.field == "input[1]" and "23" in str(too_long)  # 24 less the marker
    assert long_query.field == "input[0]"


@pytest.fixture(scope="module")
def served(colbert):
    yield from serving(create_app(settings_from_env(tiny_env(colbert))), "asyncio")


def test_routes_answer_the_engines_vectors_and_scores(served):
    want, client = REFERENCE["pylate"], served
    body = {"input": QUERIES[:2], "task": "token_embed", "embedding_mode": "query"}
    pooled = client.post("/pooling", json=body)
    assert pooled.status_code == 200, pooled.text
    close([np.array(d["data"]) for d in pooled.json()["data"]], want["queries"][:2])
    documents = client.post("/pooling", json={"input": DOCUMENTS[:3], "task": "token_embed"})
    close([np.array(d["data"]) for d in documents.json()["data"]], want["documents"][:3])
    body = {"query": QUERIES[0], "documents": DOCUMENTS}
    reranked = client.post("/v1/rerank", json=body)
    assert reranked.status_code == 200, reranked.text
    got = {r["index"]: r["relevance_score"] for r in reranked.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(5)], want["scores"][0], atol=1e-4)
    misplaced = client.post("/pooling", json={"input": "a dog", "embedding_mode": "query"})
    assert misplaced.status_code == 400 and "embedding_mode" in misplaced.text
    dense = client.post("/v1/embeddings", json={"input": "a dog"})
    assert dense.status_code == 400 and "late-interaction model" in dense.text, dense.text
    # vLLM's /score pairs queries[i] with documents[i]
    pairs = client.post("/score", json={"queries": QUERIES[:2], "documents": DOCUMENTS[:2]})
    assert pairs.status_code == 200, pairs.text
    got = [d["score"] for d in pairs.json()["data"]]
    np.testing.assert_allclose(got, [want["scores"][0][0], want["scores"][1][1]], atol=1e-4)
