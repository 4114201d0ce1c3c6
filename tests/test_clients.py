"""The clients people already run, unchanged, against a real hypercorn server on 127.0.0.1: the
Cohere SDK (v1 and v2 clients), the Voyage SDK, and the `rerankers` library's API rankers for
every provider whose wire format is served (Cohere, Jina, Voyage, Mixedbread, TEI). Each call's
ranking and scores equal `Engine.rerank` on the same model, a decoder and a cross-encoder. And
the embedding clients (the OpenAI, Voyage and Cohere SDKs, `huggingface_hub`'s TEI client) on the
real all-MiniLM-L6-v2, equal to `Engine.embed`."""

import cohere
import msgspec
import numpy as np
import openai
import pytest
import trio
import voyageai
from huggingface_hub import InferenceClient
from rerankers.models import api_rankers

from bench.encoders import write_encoder
from engine import EngineConfig, open_engine
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import DOCS, hypercorn_server, tiny_config, tiny_env

QUERY = "Where does the fox jump?"
KEY = "secret-key"


@pytest.fixture(scope="module", params=["decoder", "cross-encoder"])
def model(request, tiny_checkpoints, tmp_path_factory):
    """The tiny Llama, and a tiny BERT cross-encoder: the clients see the same API."""
    if request.param == "decoder":
        return tiny_checkpoints["llama-untied"]
    path = tmp_path_factory.mktemp("clients") / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    write_encoder(path, "BertConfig", fields, "bert", seed=5, corpus=CORPUS, model_max_length=96)
    return path


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("clients") / "hypercorn.log"
    env = tiny_env(model, SCORING_API_KEY=KEY)
    with hypercorn_server("asyncio", env, log) as server:
        yield server


@pytest.fixture(scope="module")
def expected(model):
    """`Engine.rerank` of QUERY over DOCS, and of the same with raw scores: index -> score."""
    config = tiny_config(model)

    async def main():
        async with open_engine(config) as engine:
            soft = await engine.rerank(QUERY, DOCS)
            raw = await engine.rerank(QUERY, DOCS, raw_scores=True)
            fields = await engine.rerank(
                QUERY, [f"title: t{i}\ntext: {d}" for i, d in enumerate(DOCS)]
            )
            return soft, raw, fields

    return [{h.index: h.relevance_score for h in r.results} for r in trio.run(main)]


def assert_ranked(pairs: list[tuple[int, float]], want: dict[int, float], n: int | None = None):
    """(index, score) pairs, best first, are the engine's order and scores."""
    order = sorted(want, key=lambda i: -want[i])[:n]
    assert [i for i, _ in pairs] == order
    np.testing.assert_allclose([s for _, s in pairs], [want[i] for i in order], rtol=1e-5)


def test_cohere_v1_client(server, expected):
    client = cohere.Client(api_key=KEY, base_url=server.url, max_retries=0)
    res = client.rerank(query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    assert_ranked([(r.index, r.relevance_score) for r in res.results], expected[0], 3)
    assert [r.document.text for r in res.results] == [DOCS[r.index] for r in res.results]
    assert res.meta.billed_units.search_units == 1 and res.meta.tokens.input_tokens > 0
    docs = [{"title": f"t{i}", "text": d} for i, d in enumerate(DOCS)]
    res = client.rerank(query=QUERY, documents=docs, rank_fields=["title", "text"])
    assert_ranked([(r.index, r.relevance_score) for r in res.results], expected[2])
    top = res.results[0]  # the object given comes back whole
    assert (top.document.text, top.document.title) == (DOCS[top.index], f"t{top.index}")


def test_cohere_v2_client(server, expected):
    client = cohere.ClientV2(api_key=KEY, base_url=server.url, max_retries=0)
    res = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2)
    assert_ranked([(r.index, r.relevance_score) for r in res.results], expected[0], 2)
    assert res.meta.tokens.input_tokens > 0 and res.meta.api_version.version == "2"


def test_cohere_client_errors_are_typed(server):
    client = cohere.ClientV2(api_key=KEY, base_url=server.url, max_retries=0)
    with pytest.raises(cohere.errors.BadRequestError) as bad:
        client.rerank(model="m", query=QUERY, documents=[])
    assert bad.value.body["error"]["param"] == "documents"
    wrong = cohere.ClientV2(api_key="wrong", base_url=server.url, max_retries=0)
    with pytest.raises(cohere.errors.UnauthorizedError):
        wrong.rerank(model="m", query=QUERY, documents=DOCS)


def test_voyage_client(server, expected):
    client = voyageai.Client(api_key=KEY, base_url=f"{server.url}/v1", max_retries=0)
    res = client.rerank(QUERY, DOCS, model="rerank-2", top_k=3)
    assert_ranked([(r.index, r.relevance_score) for r in res.results], expected[0], 3)
    assert [r.document for r in res.results] == [DOCS[r.index] for r in res.results]
    assert res.total_tokens > 0


PROVIDERS = {  # rerankers' provider name -> the path its requests go to
    "cohere": "/v1/rerank",
    "jina": "/v1/rerank",
    "voyage": "/v1/rerank",
    "mixedbread.ai": "/v1/reranking",
    "text-embeddings-inference": "/rerank",
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_rerankers_api_ranker(server, expected, provider):
    url = server.url + PROVIDERS[provider]
    ranker = api_rankers.APIRanker("any-model", KEY, provider, url=url)
    ranked = ranker.rank(QUERY, DOCS)
    pairs = [(DOCS.index(r.document.text), r.score) for r in ranked.results]
    assert_ranked(pairs, expected[0])
    assert [r.rank for r in ranked.results] == [1, 2, 3, 4]
    # (the library's own `APIRanker.score` fails before it sends anything: it is not used)


# The server's vectors are compared bit for bit with an in-process engine's: each process would
# time the dense strategies for itself and may pick differently (equal within the f32 bound, not
# bit for bit), so both are given the same one.
EMBED_DENSE = "cpu"


def embed_config(minilm) -> EngineConfig:
    return msgspec.structs.replace(tiny_config(minilm), dense=EMBED_DENSE)


@pytest.fixture(scope="module")
def embedder_server(minilm, tmp_path_factory):
    """A server of the real all-MiniLM-L6-v2 embedder."""
    log = tmp_path_factory.mktemp("clients") / "embedder.log"
    with hypercorn_server(
        "asyncio", tiny_env(minilm, SCORING_API_KEY=KEY, SCORING_DENSE=EMBED_DENSE), log
    ) as server:
        yield server


EMBED_TEXTS = [*DOCS, "Zürich—São Paulo 🙂"]


@pytest.fixture(scope="module")
def embedded(minilm) -> np.ndarray:
    """`Engine.embed` of EMBED_TEXTS on the served model."""
    config = embed_config(minilm)

    async def main():
        async with open_engine(config) as engine:
            return (await engine.embed(EMBED_TEXTS)).embeddings

    return trio.run(main)


def test_openai_embeddings_client(embedder_server, embedded):
    texts, want = EMBED_TEXTS, embedded
    client = openai.OpenAI(api_key=KEY, base_url=f"{embedder_server.url}/v1", max_retries=0)
    res = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # base64 on the wire
    np.testing.assert_array_equal(np.array([d.embedding for d in res.data], np.float32), want)
    assert [d.index for d in res.data] == list(range(len(texts)))
    assert res.usage.prompt_tokens == res.usage.total_tokens > len(texts)
    res = client.embeddings.create(model="m", input=texts[0], encoding_format="float")
    np.testing.assert_array_equal(np.float32(res.data[0].embedding), want[0])
    with pytest.raises(openai.BadRequestError, match="input\\[1\\]: must not be empty"):
        client.embeddings.create(model="m", input=["fine", ""])
    wrong = openai.OpenAI(api_key="wrong", base_url=f"{embedder_server.url}/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="m", input="a")


def test_voyage_embeddings_client(embedder_server, embedded):
    client = voyageai.Client(api_key=KEY, base_url=f"{embedder_server.url}/v1", max_retries=0)
    res = client.embed(EMBED_TEXTS, model="voyage-3.5", input_type="query")  # base64 on the wire
    np.testing.assert_array_equal(np.float32(res.embeddings), embedded)
    assert res.total_tokens > len(EMBED_TEXTS)
    res = client.embed(EMBED_TEXTS, model="voyage-3.5", output_dtype="ubinary")
    np.testing.assert_array_equal(np.array(res.embeddings), np.packbits(embedded > 0, axis=1))
    with pytest.raises(voyageai.error.InvalidRequestError, match="output_dimension"):
        client.embed(EMBED_TEXTS, model="voyage-3.5", output_dimension=256)


def test_cohere_embed_client(embedder_server, embedded):
    client = cohere.ClientV2(api_key=KEY, base_url=embedder_server.url, max_retries=0)
    res = client.embed(
        model="embed-v4.0",
        texts=EMBED_TEXTS,
        input_type="search_query",
        embedding_types=["float", "int8"],
    )
    np.testing.assert_array_equal(np.float32(res.embeddings.float_), embedded)
    unit = embedded / np.linalg.norm(embedded, axis=1, keepdims=True)
    np.testing.assert_array_equal(np.array(res.embeddings.int8), np.rint(unit * 127))
    assert res.meta.billed_units.input_tokens > len(EMBED_TEXTS)
    assert res.meta.tokens.input_tokens == res.meta.billed_units.input_tokens
    with pytest.raises(cohere.errors.BadRequestError, match="texts\\[1\\]"):
        client.embed(model="m", texts=["a", "b " * 400], input_type="search_query", truncate="NONE")


def test_huggingface_hub_tei_client(embedder_server, embedded, minilm):
    headers = {"Authorization": f"Bearer {KEY}"}
    tei = InferenceClient(model=f"{embedder_server.url}/embed", headers=headers)
    got = tei.feature_extraction(EMBED_TEXTS[0], truncate=True, truncation_direction="left")
    np.testing.assert_array_equal(got, embedded[:1])
    tokens = InferenceClient(model=f"{embedder_server.url}/embed_all", headers=headers)
    got = tokens.feature_extraction(EMBED_TEXTS[-1])  # f32[1, n, E]: TEI's list per input

    async def token_vectors():
        async with open_engine(embed_config(minilm)) as engine:
            return (await engine.embed_tokens(EMBED_TEXTS[-1:])).embeddings

    np.testing.assert_array_equal(got, trio.run(token_vectors)[0][None])
    similarity = InferenceClient(model=f"{embedder_server.url}/similarity", headers=headers)
    scores = similarity.sentence_similarity(EMBED_TEXTS[0], EMBED_TEXTS[1:])
    np.testing.assert_allclose(scores, embedded[1:] @ embedded[0], atol=1e-6)
