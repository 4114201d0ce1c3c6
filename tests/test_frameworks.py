"""The retrieval frameworks, as their users use them, against a live hypercorn server on
127.0.0.1 that serves two models (docs/frameworks.md): the real all-MiniLM-L6-v2, and a tiny
BERT cross-encoder listed second with `default_for = ["rerank"]`, so that rerank clients that
send no `model` reach it rather than the embedder's cosine similarity. LangChain
(`OpenAIEmbeddings`, `CohereRerank`), LlamaIndex (`TextEmbeddingsInference`, the TEI rerank
postprocessor), Haystack (`HuggingFaceAPITextEmbedder`/`DocumentEmbedder`, `HuggingFaceTEIRanker`)
and Qdrant's in-memory client fed with the server's vectors: each gets the vectors of
`Engine.embed` and the scores of `Engine.rerank` on the same directories."""

from typing import NamedTuple

import cohere
import msgspec
import numpy as np
import openai
import pytest
import trio
from haystack import Document as HaystackDocument
from haystack.utils import Secret
from haystack_integrations.components.embedders.huggingface_api import (
    HuggingFaceAPIDocumentEmbedder,
    HuggingFaceAPITextEmbedder,
)
from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker
from langchain_classic.retrievers.document_compressors import CohereRerank
from langchain_core.documents import Document
from langchain_openai import OpenAIEmbeddings
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference
from qdrant_client import QdrantClient, models
from tokenizers import Tokenizer

from bench.encoders import write_encoder
from engine import open_engine
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import BASE_ENV, DOCS, hypercorn_server, tiny_config

KEY = "secret-key"
RERANKER, EMBEDDER = "reranker", "all-MiniLM-L6-v2"  # the served names
QUERY = "Where does the fox jump?"
PASSAGES = [
    *DOCS,
    "A red fox crossed the river at dawn.",
    "Zürich—São Paulo 🙂",
    "The dog sleeps in the sun all afternoon.",
    "Stock prices fell sharply on Monday.",
]
LONG = "The fox jumps over the dog again. " * 60  # over MiniLM's 256 tokens
TOP = 3
# a cl100k_base id (what LangChain's default tiktoken path sends) past MiniLM's 30,522 tokens
CL100K_ID = 100255


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """A tiny random BERT cross-encoder (test_clients.py's)."""
    path = tmp_path_factory.mktemp("frameworks") / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    write_encoder(path, "BertConfig", fields, "bert", seed=5, corpus=CORPUS, model_max_length=96)
    return path


@pytest.fixture(scope="module")
def server(reranker, minilm, tmp_path_factory):
    """Both models behind one key. The dense strategy is fixed, here and in `expected`: a process
    that timed them for itself could pick another, equal only within the f32 bound."""
    root = tmp_path_factory.mktemp("frameworks")
    entries = [(EMBEDDER, minilm, "[]"), (RERANKER, reranker, '["rerank"]')]
    toml = "".join(
        f'[[models]]\nname = "{n}"\nmodel = "{p}"\ndtype = "float32"\ndefault_for = {d}\n'
        for n, p, d in entries
    )
    (root / "models.toml").write_text(toml)
    env = BASE_ENV | {
        "SCORING_MODELS": str(root / "models.toml"),
        "SCORING_API_KEY": KEY,
        "SCORING_DENSE": "cpu",
    }
    with hypercorn_server("asyncio", env, root / "hypercorn.log") as server:
        yield server


class Expected(NamedTuple):
    vectors: np.ndarray  # f32[P, 384]: Engine.embed(PASSAGES)
    raw: np.ndarray  # f32[P, 384]: the same before the directory's Normalize module
    query: np.ndarray  # f32[384]: Engine.embed([QUERY])[0]
    long: np.ndarray  # f32[384]: Engine.embed([LONG], truncate=True)[0]
    ids: list[list[int]]  # each passage's MiniLM token ids, no special tokens
    id_vectors: np.ndarray  # f32[P, 384]: Engine.embed(ids)
    scores: dict[int, float]  # Engine.rerank(QUERY, PASSAGES): index -> relevance
    raw_scores: dict[int, float]  # the same with raw_scores=True
    hits: list[int]  # the TOP passages nearest QUERY by cosine, nearest first
    hit_scores: dict[int, float]  # Engine.rerank(QUERY, those passages): position -> relevance


def config(path):
    return msgspec.structs.replace(tiny_config(path), dense="cpu")


@pytest.fixture(scope="module")
def expected(reranker, minilm) -> Expected:
    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_padding()  # its file pads every text to 128 ids
    ids = [tokenizer.encode(p, add_special_tokens=False).ids for p in PASSAGES]

    async def main():
        async with open_engine(config(minilm)) as engine:
            vectors = (await engine.embed(PASSAGES)).embeddings
            raw = (await engine.embed(PASSAGES, normalize=False)).embeddings
            query = (await engine.embed([QUERY])).embeddings[0]
            long = (await engine.embed([LONG], truncate=True)).embeddings[0]
            id_vectors = (await engine.embed(ids)).embeddings
        hits = [int(i) for i in np.argsort(-(vectors @ query))[:TOP]]
        async with open_engine(config(reranker)) as engine:
            ranks = [
                await engine.rerank(QUERY, PASSAGES),
                await engine.rerank(QUERY, PASSAGES, raw_scores=True),
                await engine.rerank(QUERY, [PASSAGES[i] for i in hits]),
            ]
        scores = [{h.index: h.relevance_score for h in r.results} for r in ranks]
        return Expected(
            vectors, raw, query, long, ids, id_vectors, scores[0], scores[1], hits, scores[2]
        )

    return trio.run(main)


def assert_vectors(got, want: np.ndarray) -> None:
    """The engine's vectors, to rtol 1e-5 (components near 0: to 1e-6 of the largest; a batch
    the client splits packs differently from the reference's, and rounds differently)."""
    want = np.asarray(want)
    atol = 1e-6 * np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-5, atol=atol)


def assert_ranked(pairs: list[tuple[int, float]], want: dict[int, float], n: int | None = None):
    """(index, score) pairs, best first, are the engine's top `n` in its order, its scores."""
    order = sorted(want, key=lambda i: -want[i])[:n]
    assert [i for i, _ in pairs] == order
    np.testing.assert_allclose([s for _, s in pairs], [want[i] for i in order], rtol=1e-5)


# -- LangChain ----------------------------------------------------------------------------------


def langchain_embeddings(server, **options) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(
        base_url=f"{server.url}/v1", model=EMBEDDER, api_key=KEY, max_retries=0, **options
    )


def test_langchain_openai_embeddings(server, expected):
    """`check_embedding_ctx_length=False` sends the texts (docs/frameworks.md); `chunk_size` 3
    makes three requests. A text over the model's limit is refused unless the body asks for
    truncation (`extra_body`, through `model_kwargs`)."""
    embeddings = langchain_embeddings(server, check_embedding_ctx_length=False, chunk_size=3)
    assert_vectors(embeddings.embed_documents(PASSAGES), expected.vectors)
    assert_vectors(embeddings.embed_query(QUERY), expected.query)
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: \d+ tokens exceed"):
        embeddings.embed_documents([LONG])
    cut = langchain_embeddings(
        server, check_embedding_ctx_length=False, model_kwargs={"extra_body": {"truncate": True}}
    )
    assert_vectors(cut.embed_documents([LONG]), expected.long[None])


def test_langchain_openai_embeddings_tokenized_by_transformers(server, expected, minilm):
    """`tiktoken_enabled=False`: LangChain cuts each text with the model's own tokenizer (a
    local directory: nothing downloaded) and sends the pieces decoded back to text."""
    embeddings = langchain_embeddings(
        server, tiktoken_enabled=False, tiktoken_model_name=str(minilm)
    )
    assert_vectors(embeddings.embed_documents(PASSAGES), expected.vectors)


def test_token_id_inputs_as_langchain_sends_them(server, expected):
    """LangChain's default (`check_embedding_ctx_length=True`) sends token-id lists through the
    OpenAI SDK. The server embeds ids as the served model's, as given (no special tokens added),
    and refuses an id outside its vocabulary, such as most of tiktoken's."""
    client = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", max_retries=0)
    res = client.embeddings.create(model=EMBEDDER, input=expected.ids)
    assert_vectors([d.embedding for d in res.data], expected.id_vectors)
    framed = [[101, *ids, 102] for ids in expected.ids]  # [CLS] ... [SEP]: the texts' own ids
    res = client.embeddings.create(model=EMBEDDER, input=framed)
    assert_vectors([d.embedding for d in res.data], expected.vectors)
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]: token id outside"):
        client.embeddings.create(model=EMBEDDER, input=[expected.ids[0], [CL100K_ID]])


@pytest.mark.filterwarnings("ignore:The class `CohereRerank` was deprecated")
def test_langchain_cohere_rerank(server, expected):
    """langchain-classic's CohereRerank with a Cohere client of the server's URL
    (langchain-cohere's takes `base_url=`, but pins cohere<6)."""
    client = cohere.Client(api_key=KEY, base_url=server.url, max_retries=0)
    compressor = CohereRerank(client=client, model=RERANKER, top_n=TOP)
    docs = compressor.compress_documents([Document(page_content=p) for p in PASSAGES], QUERY)
    pairs = [(PASSAGES.index(d.page_content), d.metadata["relevance_score"]) for d in docs]
    assert_ranked(pairs, expected.scores, TOP)


# -- LlamaIndex ---------------------------------------------------------------------------------


def test_llama_index_tei_embeddings(server, expected):
    embed_model = TextEmbeddingsInference(
        model_name=EMBEDDER, base_url=server.url, auth_token=KEY, embed_batch_size=3
    )
    assert_vectors(embed_model.get_text_embedding_batch(PASSAGES), expected.vectors)
    assert_vectors(embed_model.get_query_embedding(QUERY), expected.query)


def test_llama_index_tei_rerank(server, expected):
    """It sends no `model`: the model whose `default_for` has rerank answers. Its `auth_token` is
    the whole Authorization header (the embedding class adds `Bearer` itself)."""
    postprocessor = TextEmbeddingInference(
        base_url=server.url, top_n=TOP, auth_token=f"Bearer {KEY}"
    )
    nodes = [NodeWithScore(node=TextNode(text=p), score=0.5) for p in PASSAGES]
    ranked = postprocessor.postprocess_nodes(nodes, query_str=QUERY)
    assert_ranked([(PASSAGES.index(n.node.text), n.score) for n in ranked], expected.scores, TOP)


# -- Haystack -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/embed", ""])
def test_haystack_tei_embedders(server, expected, path):
    """The URL names `/embed`, or is the server's root (TEI's `POST /`, as Haystack's docs show
    it): Hugging Face's client posts to the URL itself. Haystack asks for `normalize: false`
    unless told otherwise: the vectors before the model's Normalize module."""
    url, token = f"{server.url}{path}", Secret.from_token(KEY)
    api = "text_embeddings_inference"
    text = HuggingFaceAPITextEmbedder(
        api_type=api, api_params={"url": url}, token=token, normalize=True
    )
    assert_vectors(text.run(QUERY)["embedding"], expected.query)
    documents = HuggingFaceAPIDocumentEmbedder(
        api_type=api, api_params={"url": url}, token=token, batch_size=3, progress_bar=False
    )
    docs = documents.run([HaystackDocument(content=p) for p in PASSAGES])["documents"]
    assert [d.content for d in docs] == PASSAGES
    assert_vectors([d.embedding for d in docs], expected.raw)
    assert not np.allclose(np.linalg.norm(expected.raw, axis=1), 1)


def test_haystack_tei_ranker(server, expected):
    token = Secret.from_token(KEY)
    docs = [HaystackDocument(content=p) for p in PASSAGES]
    ranked = HuggingFaceTEIRanker(url=server.url, top_k=TOP, token=token).run(QUERY, docs)
    pairs = [(PASSAGES.index(d.content), d.score) for d in ranked["documents"]]
    assert_ranked(pairs, expected.scores, TOP)
    raw = HuggingFaceTEIRanker(url=server.url, raw_scores=True, token=token).run(QUERY, docs)
    pairs = [(PASSAGES.index(d.content), d.score) for d in raw["documents"]]
    assert_ranked(pairs, expected.raw_scores)


# -- Qdrant: retrieve, then rerank (docs/frameworks.md's example) --------------------------------


def test_qdrant_retrieve_then_rerank(server, expected):
    embedder = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", max_retries=0)

    def embed(texts: list[str]) -> list[list[float]]:
        return [d.embedding for d in embedder.embeddings.create(model=EMBEDDER, input=texts).data]

    qdrant = QdrantClient(":memory:")
    vectors = embed(PASSAGES)
    params = models.VectorParams(size=len(vectors[0]), distance=models.Distance.COSINE)
    qdrant.create_collection("passages", vectors_config=params)
    points = [
        models.PointStruct(id=i, vector=v, payload={"text": p})
        for i, (v, p) in enumerate(zip(vectors, PASSAGES, strict=True))
    ]
    qdrant.upsert("passages", points=points)
    hits = qdrant.query_points("passages", query=embed([QUERY])[0], limit=TOP).points
    assert [h.id for h in hits] == expected.hits
    cosines = expected.vectors[expected.hits] @ expected.query  # unit vectors
    np.testing.assert_allclose([h.score for h in hits], cosines, rtol=1e-5)

    reranker = cohere.ClientV2(api_key=KEY, base_url=server.url, max_retries=0)
    texts = [h.payload["text"] for h in hits]
    ranked = reranker.rerank(model=RERANKER, query=QUERY, documents=texts)
    assert_ranked([(r.index, r.relevance_score) for r in ranked.results], expected.hit_scores)
