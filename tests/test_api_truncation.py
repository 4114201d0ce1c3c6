"""Truncation as each peer API defines it (`api.truncation.PEER_FIELDS`), over HTTP: the tokens
kept are exactly the peer's (a text's first k or last k token ids, not a cut text tokenised
again), for a decoder's recipe rerank, an encoder cross-encoder and an encoder embedder. Each
answer is checked against the same model run on the token ids the peer keeps."""

import numpy as np
import pytest
import tokenizers
import torch
import transformers

from api.app import create_app
from api.settings import settings_from_env
from bench.encoders import write_encoder
from engine.templates import PLAIN
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import serving, tiny_env
from tests.test_embed import tiny_embedder

QUERY = "Where does the fox jump?"
LONG = " ".join(CORPUS[:6]) * 3  # longer than every limit below
DOCS = [LONG, "short", CORPUS[2]]


def recipe(tok, doc: str, keep: int) -> list[int]:
    """The plain recipe's sequence of `doc` with the document's own tokens past its first
    `keep` dropped (found by their characters in the joined text)."""
    text = PLAIN.query_text(QUERY, None)
    enc = tok.encode(text + PLAIN.document_text(doc))
    start, end = len(text), len(text) + len(doc)
    own = [i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start and b > a]
    return [t for i, t in enumerate(enc.ids) if i not in own[keep:]]


@pytest.fixture(scope="module")
def decoder(tiny_path):
    tok = tokenizers.Tokenizer.from_file(f"{tiny_path}/tokenizer.json")
    for client in serving(create_app(settings_from_env(tiny_env(tiny_path))), "asyncio"):
        yield client, tok


def relevance_of_ids(client, tok, sequences) -> list[float]:
    """The plain recipe's relevance, P(yes) / (P(yes) + P(no)), of each token-id sequence."""
    labels = [tok.encode(t, add_special_tokens=False).ids[0] for t in (PLAIN.yes, PLAIN.no)]
    body = {"query": [], "items": sequences, "label_token_ids": labels, "apply_softmax": True}
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    return [s[0] for s in r.json()["scores"]]


def by_index(results) -> list[float]:
    return [h["relevance_score"] for h in sorted(results, key=lambda h: h["index"])]


def test_cohere_max_tokens_per_doc_keeps_a_decoder_documents_first_tokens(decoder):
    client, tok = decoder
    body = {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 4}
    r = client.post("/v2/rerank", json=body)
    assert r.status_code == 200, r.text
    want = relevance_of_ids(client, tok, [recipe(tok, d, 4) for d in DOCS])
    # the rerank computes the query once for all documents, /v1/score each sequence whole: f32
    # sums in another order (1.5e-6 apart on an AVX512-BF16 Zen 4, whose measured dense choice
    # differs); a document cut at other tokens is far more
    np.testing.assert_allclose(by_index(r.json()["results"]), want, rtol=1e-5, atol=1e-6)


def test_vllm_truncate_prompt_tokens_fits_a_decoders_sequences(decoder):
    client, tok = decoder
    k = len(recipe(tok, "", 0)) + 5  # room for five of a document's tokens
    body = {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": k}
    r = client.post("/score", json=body)
    assert r.status_code == 200, r.text
    kept = [recipe(tok, d, 5) for d in DOCS]
    assert max(map(len, kept)) == k
    want = relevance_of_ids(client, tok, kept)
    got = [d["score"] for d in r.json()["data"]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # as the test above


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("peers") / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    options = dict(seed=5, corpus=CORPUS, model_max_length=40, vocab=300, perturb=0.3)
    write_encoder(path, "BertConfig", fields, "bert", **options)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for client in serving(create_app(settings_from_env(tiny_env(path))), "asyncio"):
        yield client, tok, model


def logits_of(model, tok, pairs: list[tokenizers.Encoding]) -> list[float]:
    """transformers' logits of pairs given as token ids and types."""
    scores = []
    for e in pairs:
        with torch.no_grad():
            ids, types = torch.tensor([e.ids]), torch.tensor([e.type_ids])
            scores.append(float(model(input_ids=ids, token_type_ids=types).logits[0, 0]))
    return scores


def test_cohere_max_tokens_per_doc_keeps_a_cross_encoder_documents_first_tokens(cross_encoder):
    client, tok, model = cross_encoder
    r = client.post("/v2/rerank", json={"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 6})
    assert r.status_code == 200, r.text
    q = tok.encode(QUERY, add_special_tokens=False)
    pairs = []
    for doc in DOCS:
        d = tok.encode(doc, add_special_tokens=False)
        d.truncate(6)  # its first six token ids, then the pair as the tokenizer makes it
        pairs.append(tok.post_process(q, d))
    assert len(pairs[0].ids) == len(q.ids) + 6 + 3
    want = 1 / (1 + np.exp(-np.array(logits_of(model, tok, pairs))))
    np.testing.assert_allclose(by_index(r.json()["results"]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direction", ["Right", "Left"])
def test_tei_truncation_direction_cuts_a_pair_to_the_models_limit(cross_encoder, direction):
    client, tok, model = cross_encoder
    body = {"query": QUERY, "texts": DOCS, "truncate": True, "truncation_direction": direction}
    r = client.post("/rerank", json=body)
    assert r.status_code == 200, r.text
    cutter = tokenizers.Tokenizer.from_str(tok.to_str())
    cutter.enable_truncation(40, strategy="longest_first", direction=direction.lower())
    pairs = cutter.encode_batch([(QUERY, d) for d in DOCS])
    assert len(pairs[0].ids) == 40
    want = 1 / (1 + np.exp(-np.array(logits_of(model, tok, pairs))))
    got = [h["score"] for h in sorted(r.json(), key=lambda h: h["index"])]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path = tiny_embedder(tmp_path_factory.mktemp("peers"), "bert-cls-normalised")  # 48 tokens
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for client in serving(create_app(settings_from_env(tiny_env(path))), "asyncio"):
        yield client, tok


def as_given(client, sequences: list[list[int]]) -> np.ndarray:
    """The vectors of token-id sequences, embedded as given."""
    r = client.post("/v1/embeddings", json={"input": sequences})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], np.float32)


def keep(tok, text: str, k: int, side: str) -> list[int]:
    """[CLS] + the text's first (last) k - 2 tokens + [SEP]: what a tokenizer truncating to k
    tokens at `side` gives, its special tokens kept."""
    own = tok.encode(text, add_special_tokens=False).ids
    own = own[: k - 2] if side == "right" else own[-(k - 2) :]
    return [tok.token_to_id("[CLS]"), *own, tok.token_to_id("[SEP]")]


@pytest.mark.parametrize(
    ("route", "body", "k", "side"),
    [
        ("/v1/embeddings", {"truncate_prompt_tokens": 10}, 10, "left"),  # vLLM: the last k
        ("/pooling", {"truncate_prompt_tokens": 10}, 10, "left"),
        ("/v1/embeddings", {"truncation": True}, 48, "right"),  # Voyage: to the model's limit
        ("/v2/embed", {"truncate": "END", "embedding_types": ["float"]}, 48, "right"),  # Cohere
        ("/v2/embed", {"truncate": "START", "embedding_types": ["float"]}, 48, "left"),
        ("/embed", {"truncate": True, "truncation_direction": "Left"}, 48, "left"),  # TEI
        ("/embed", {"truncate": True, "truncation_direction": "Right"}, 48, "right"),
    ],
)
def test_each_peers_embedding_truncation_keeps_its_tokens(embedder, route, body, k, side):
    client, tok = embedder
    texts = [LONG, CORPUS[1] * 4]
    field = {"/embed": "inputs", "/v2/embed": "texts"}.get(route, "input")
    r = client.post(route, json={field: texts, **body})
    assert r.status_code == 200, r.text
    answer = r.json()
    if route == "/v2/embed":
        got = answer["embeddings"]["float"]
    elif route == "/embed":
        got = answer
    else:
        got = [d["embedding"] if "embedding" in d else d["data"] for d in answer["data"]]
    want = as_given(client, [keep(tok, t, k, side) for t in texts])
    np.testing.assert_allclose(np.array(got, np.float32), want, atol=2e-6)
