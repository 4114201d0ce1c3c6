"""OpenAI's `/v1/embeddings` on the real all-MiniLM-L6-v2: values equal to `Engine.embed`, as
floats and as base64, the model card naming the route, and every refusal naming its field."""

import base64

import numpy as np
import pytest
import trio

from api.app import create_app
from api.settings import settings_from_env
from engine import open_engine
from tests.conftest import CORPUS
from tests.test_api_support import serving, tiny_config, tiny_env

TEXTS = [*CORPUS[:6], "a", "Zürich—São Paulo—Kraków 🙂"]


def engine_embeddings(path, texts) -> np.ndarray:
    async def main():
        async with open_engine(tiny_config(path)) as engine:  # the service's configuration
            return (await engine.embed(texts)).embeddings

    return trio.run(main)


@pytest.fixture(scope="module")
def client(minilm):
    yield from serving(create_app(settings_from_env(tiny_env(minilm))), "asyncio")


def test_floats_and_base64_equal_the_engine(client, minilm):
    want = engine_embeddings(minilm, TEXTS)
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "mini"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["model"]) == ("list", "mini")
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    assert {d["object"] for d in body["data"]} == {"embedding"}
    got = np.array([d["embedding"] for d in body["data"]], np.float32)
    np.testing.assert_array_equal(got, want)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > len(TEXTS) * 2
    assert float(r.headers["x-device-time"]) > 0

    r = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    packed = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
    np.testing.assert_array_equal(np.stack(packed), want)

    r = client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 384})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.float32(r.json()["data"][0]["embedding"]), want[0])


def test_the_model_card_names_the_embedding_route(client):
    info = client.get("/get_model_info").json()
    assert (info["head"], info["architecture"]) == ("embedding", "encoder")
    assert info["endpoints"] == ["/v1/embeddings"]
    assert client.get("/v1/models").json()["data"][0]["endpoints"] == ["/v1/embeddings"]
    assert "/v1/embeddings" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": []}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": ["fine", ""]}, 400, "input[1]"),
        ({"input": ["fine", 3]}, 400, "input[1]"),
        ({"input": ["fine"], "dimensions": 128}, 400, "dimensions"),
        ({"input": ["fine"], "dimensions": 0}, 400, "dimensions"),
        ({"input": ["fine"], "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": ["fine"], "extra": 1}, 400, "extra"),
        ({"input": ["fine", " ".join(CORPUS[:6]) * 8]}, 400, "input[1]"),  # over 256 tokens
    ],
)
def test_bad_bodies_name_their_field(client, body, status, param):
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_truncation_is_asked_for_and_reported(client):
    long = " ".join(CORPUS[:6]) * 8
    r = client.post("/v1/embeddings", json={"input": ["fine", long], "truncate": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["truncated_tokens"] > 0
    assert usage["prompt_tokens"] == 256 + 3  # [CLS] fine [SEP], and the cut text


def test_an_embedder_refuses_scores_and_a_scorer_refuses_embeddings(client, tiny_path):
    r = client.post("/v1/score", json={"query": "q", "items": ["a"], "label_token_ids": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "label_token_ids"
    assert "embedder" in r.json()["error"]["message"]
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and "does not rerank" in r.json()["error"]["message"]
    for scorer in serving(create_app(settings_from_env(tiny_env(tiny_path))), "asyncio"):
        r = scorer.post("/v1/embeddings", json={"input": ["a"]})
        assert r.status_code == 400 and "not an embedder" in r.json()["error"]["message"]
        assert "/v1/embeddings" not in scorer.get("/get_model_info").json()["endpoints"]
