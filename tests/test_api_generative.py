"""vLLM's generative scoring (`POST /generative_scoring`) on the tiny model: vLLM's own end-to-end
tests of it (tests/entrypoints/openai/generative_scoring) ported, and every score equal to the
one-by-one reference on the token ids vLLM builds (the query with its special tokens, each item
without, joined)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, processors

from api.app import create_app
from api.settings import settings_from_env
from bench.encoders import write_encoder
from engine import load_model
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import NO, YES, serving, tiny_env

QUERY = "Is Paris the capital of France? Answer Yes or No: "
ITEMS = ["Paris is beautiful.", "London is rainy.", "Berlin", "New York", "Tokyo"]


@pytest.fixture(scope="module")
def client(tiny_path):
    yield from serving(create_app(settings_from_env(tiny_env(tiny_path))), "asyncio")


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    return Tokenizer.from_file(str(Path(tiny_path) / "tokenizer.json"))


def expected(
    reference, tokenizer, query, items, labels, *, softmax=True, item_first=False, special=True
):
    """The first label's probability per item, one by one, on the ids vLLM would build."""
    q = (
        query
        if isinstance(query, list)
        else tokenizer.encode(query, add_special_tokens=special).ids
    )
    ids = [
        it if isinstance(it, list) else tokenizer.encode(it, add_special_tokens=False).ids
        for it in items
    ]
    rows = [
        reference.score(q, [item], labels, apply_softmax=softmax, item_first=item_first)[0]
        for item in ids
    ]
    return np.array([row[0] for row in rows]), sum(len(q) + len(i) for i in ids)


def test_basic_score_and_response_structure(client, reference, tokenizer):
    body = {"model": "m", "query": QUERY, "items": ITEMS[:2], "label_token_ids": [YES, NO]}
    r = client.post("/generative_scoring", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["id"].startswith("generative-scoring-")
    assert (data["object"], data["model"]) == ("list", "m")
    assert [(d["index"], d["object"]) for d in data["data"]] == [(0, "score"), (1, "score")]
    want, tokens = expected(reference, tokenizer, QUERY, ITEMS[:2], [YES, NO])
    np.testing.assert_allclose([d["score"] for d in data["data"]], want, rtol=1e-5, atol=0)
    usage = data["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (tokens, 2)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_multiple_items(client):
    body = {"query": "Is this city a capital? ", "items": ITEMS, "label_token_ids": [YES, NO]}
    r = client.post("/generative_scoring", json=body)
    assert r.status_code == 200
    assert len(r.json()["data"]) == 5


@pytest.mark.parametrize(
    "body, param",
    [
        ({"query": "Test query", "items": ["item1", "item2"]}, "label_token_ids"),  # missing
        ({"query": "Test query", "items": [], "label_token_ids": [100, 200]}, "items"),
        ({"query": "Test query", "items": ["item1"], "label_token_ids": []}, "label_token_ids"),
        (
            {"query": "q", "items": ["item1"], "label_token_ids": [9999999999, 9999999998]},
            "label_token_ids",
        ),
        ({"query": "q", "items": ["a", [1, 2]], "label_token_ids": [YES]}, "items[1]"),  # mixed
    ],
    ids=["missing-labels", "empty-items", "empty-labels", "invalid-token-ids", "mixed-items"],
)
def test_validation_errors(client, body, param):
    r = client.post("/generative_scoring", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_score_consistency(client):
    body = {"query": "Is this consistent? ", "items": ["Yes it is."], "label_token_ids": [100, 200]}
    r1, r2 = (client.post("/generative_scoring", json=body) for _ in range(2))
    assert r1.status_code == 200 and r2.status_code == 200
    assert abs(r1.json()["data"][0]["score"] - r2.json()["data"][0]["score"]) < 1e-6


def test_token_ids_item_first_and_full_vocabulary_probabilities(client, reference, tokenizer):
    query, items, labels = [10, 20, 30, 40, 50], [[60, 70], [80, 90, 100]], [1, 2, 3]
    body = {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": False}
    for item_first in (False, True):
        r = client.post("/generative_scoring", json={**body, "item_first": item_first})
        assert r.status_code == 200, r.text
        want, _ = expected(
            reference, tokenizer, query, items, labels, softmax=False, item_first=item_first
        )
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, rtol=1e-5)
        assert all(d["score"] < 1.0 for d in r.json()["data"])  # a share of the whole vocabulary


@pytest.fixture(scope="module")
def bos_path(tiny_path, tmp_path_factory) -> Path:
    """The tiny model with a tokenizer that puts `<|endoftext|>` before every text, as a BOS."""
    path = tmp_path_factory.mktemp("generative") / "bos"
    shutil.copytree(tiny_path, path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    tok.save(str(path / "tokenizer.json"))
    return path


def test_the_query_with_and_without_special_tokens(bos_path):
    reference = load_model(bos_path, dtype="float32", progress=False)
    tokenizer = Tokenizer.from_file(str(bos_path / "tokenizer.json"))
    assert tokenizer.encode(QUERY).ids[0] == 0  # the BOS the query gets, and an item does not
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": [YES], "request_id": "r1"}
    body |= {
        "apply_softmax": False,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "priority": 0,
    }  # accepted
    for client in serving(create_app(settings_from_env(tiny_env(bos_path))), "asyncio"):
        got = {}
        for special in (True, False):
            r = client.post("/generative_scoring", json={**body, "add_special_tokens": special})
            assert r.status_code == 200, r.text
            assert r.json()["id"] == "generative-scoring-r1"
            got[special] = [d["score"] for d in r.json()["data"]]
            want, tokens = expected(
                reference, tokenizer, QUERY, ITEMS, [YES], softmax=False, special=special
            )
            np.testing.assert_allclose(got[special], want, rtol=1e-5)
            assert r.json()["usage"]["prompt_tokens"] == tokens
        assert np.abs(np.array(got[True]) - got[False]).max() > 1e-4  # the BOS changed them


def test_a_prompt_over_the_context_is_refused_not_cut(client):
    """As docs/http.md says: vLLM cuts a prompt over the model's context; the engine refuses
    it, naming the item whose sequence is too long."""
    context = client.get("/v1/models").json()["data"][0]["max_model_len"]
    long = {"query": [YES] * context, "items": [[NO], [NO, NO]], "label_token_ids": [YES]}
    r = client.post("/generative_scoring", json=long)
    assert r.status_code == 400, r.text  # vLLM's status and words for a prompt over it
    error = r.json()["error"]
    assert error["param"] == "items[0]" and "exceeds the model context of" in error["message"]
    fits = long | {"query": [YES] * (context - 2)}
    assert client.post("/generative_scoring", json=fits).status_code == 200


def test_an_embedder_and_a_cross_encoder_refuse_generative_scoring(minilm, tmp_path):
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    options = dict(seed=1, corpus=CORPUS, model_max_length=96, vocab=300)
    cross = write_encoder(tmp_path / "bert", "BertConfig", fields, "bert", **options)
    body = {"query": QUERY, "items": ITEMS[:2], "label_token_ids": [YES]}
    for path in (minilm, cross):
        for client in serving(create_app(settings_from_env(tiny_env(path))), "asyncio"):
            r = client.post("/generative_scoring", json=body)
            assert r.status_code == 400, r.text
            assert "label-token scores" in r.json()["error"]["message"]
