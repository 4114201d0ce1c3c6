"""Several models behind one server (`api.served`, `Service.route`): the models file read and
refused naming the field; requests routed by their `model` field, or without one to the first
model that offers what the route does; every model listed, health ready when all are; answers
equal to each model's own."""

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from api.app import create_app
from api.served import ModelsFileError, served_models
from api.settings import settings_from_env
from engine import EngineConfig, load_model
from engine.device.kv_pool import default_kv_cache_bytes
from tests.test_api_support import BASE_ENV, serving, wait_until
from tests.test_embed import tiny_embedder

TEXTS = ["a kitten sleeps on the mat", "stocks fell sharply"]


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_models_file_names_each_model_and_its_engine_fields(tmp_path):
    base = EngineConfig(dtype="float32", token_budget=512)
    toml = write(
        tmp_path / "models.toml",
        '[[models]]\nname = "scorer"\nmodel = "/m/a.gguf"\n\n'
        '[[models]]\nmodel = "/m/embedder"\ntoken_budget = 1024\n',
    )
    scorer, embedder = served_models(toml, base, "ignored")
    assert (scorer.name, scorer.engine.model, scorer.engine.token_budget) == (
        "scorer",
        "/m/a.gguf",
        512,
    )
    assert (embedder.name, embedder.engine.token_budget, embedder.engine.dtype) == (
        "embedder",
        1024,
        "float32",
    )
    assert scorer.engine.kv_pool_share == embedder.engine.kv_pool_share == 2  # memory halved
    as_json = write(tmp_path / "models.json", json.dumps({"models": [{"model": "/m/b.gguf"}]}))
    assert [m.name for m in served_models(as_json, base, None)] == ["b"]
    base = msgspec.structs.replace(base, model="/m/c.gguf")
    (one,) = served_models(None, base, "served-name")
    assert one.name == "served-name" and one.engine == base and base.kv_pool_share == 1


def test_with_no_model_configured_the_packaged_embedder_is_served_beside_the_default(tmp_path):
    base = EngineConfig(dtype="float32")
    smollm2, minilm = served_models(None, base, None)
    assert smollm2.engine.model is None and smollm2.default_for == ()
    assert minilm.name == "all-MiniLM-L6-v2" and minilm.default_for == ("rerank", "embed")
    assert (Path(minilm.engine.model) / "modules.json").is_file()  # unpacked from its zip
    assert minilm.engine.dtype == "float32"
    assert smollm2.engine.kv_pool_share == minilm.engine.kv_pool_share == 2
    toml = write(tmp_path / "m.toml", '[[models]]\nmodel = "/e"\ndefault_for = ["rerank"]\n')
    assert served_models(toml, base, None)[0].default_for == ("rerank",)


@pytest.mark.parametrize(
    "text,why",
    [
        ('[[models]]\nmodel = "/a"\n[[models]]\nmodel = "/b"\ntoken_budgit = 1\n', "models[1]"),
        ('[[models]]\nmodel = "/a"\ndtype = 3\n', "models[0].dtype"),
        ('[[models]]\nname = "x"\n[[models]]\nname = "x"\n', "served twice: x"),
        ("models = []\n", "a non-empty list"),
        ('[[models]]\nmodel = "/a"\ndefault_for = ["dance"]\n', "models[0].default_for"),
        ('[[models]]\nmodel = "/a"\ndefault_for = "rerank"\n', "models[0].default_for"),
        ("[[models]\n", "models.toml"),
    ],
)
def test_a_wrong_models_file_is_refused_naming_the_field(tmp_path, text, why):
    path = write(tmp_path / "models.toml", text)
    with pytest.raises(ModelsFileError, match=r".*" + why.replace("[", r"\[").replace("]", r"\]")):
        served_models(path, EngineConfig(), None)


@pytest.fixture(scope="module")
def paths(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return {
        "scorer": tiny_checkpoints["llama-untied"],
        "embedder": tiny_embedder(root, "bert-mean"),
    }


@pytest.fixture(scope="module")
def client(paths, tmp_path_factory):
    models = tmp_path_factory.mktemp("served-file") / "models.toml"
    models.write_text(
        f'[[models]]\nname = "scorer"\nmodel = "{paths["scorer"]}"\n\n'
        f'[[models]]\nname = "embedder"\nmodel = "{paths["embedder"]}"\n'
        'default_for = ["rerank"]\n'
    )
    env = {**BASE_ENV, "SCORING_MODELS": str(models)}
    yield from serving(create_app(settings_from_env(env)), "asyncio")


def test_every_model_is_listed_with_what_it_serves(client):
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["scorer", "embedder"]
    scorer, embedder = (set(c["endpoints"]) for c in cards)
    assert "/v1/score" in scorer and "/v1/embeddings" not in scorer
    assert "/v1/embeddings" in embedder and "/v1/score" not in embedder
    # where a request naming no model goes: the rerank routes to the embedder, its default_for
    scorer, embedder = (set(c["default_endpoints"]) for c in cards)
    assert {"/v1/score", "/generative_scoring"} <= scorer and "/v1/rerank" not in scorer
    assert {"/v1/rerank", "/rerank", "/score", "/v1/embeddings", "/embed"} <= embedder
    assert not scorer & embedder
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/get_server_info", params={"model": "embedder"}).json()
    assert info["model"] == "embedder" and info["engine_config"]["model"].endswith("bert-mean")
    # the scorer's default pool: half of what it would be alone (the pages round down)
    info = client.get("/get_server_info").json()
    pool, per_token = info["kv_pool"], info["kv_bytes_per_token"]
    page_bytes = pool["page_size"] * per_token
    assert pool["pages"] == default_kv_cache_bytes(per_token) // 2 // page_bytes


def test_requests_go_to_the_model_that_offers_their_route(client, paths):
    with load_model(str(paths["embedder"]), dtype="float32") as embedder:
        want = embedder.embed(TEXTS)
    for body in ({"input": TEXTS}, {"input": TEXTS, "model": "embedder"}):
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "embedder"
        got = np.array([d["embedding"] for d in r.json()["data"]])
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    tei = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
    np.testing.assert_allclose(tei, want, atol=1e-6, rtol=0)

    with load_model(str(paths["scorer"]), dtype="float32") as scorer:
        want = scorer.score("Is it a cat?", TEXTS, [5, 7])
    r = client.post(
        "/v1/score", json={"query": "Is it a cat?", "items": TEXTS, "label_token_ids": [5, 7]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "scorer"
    np.testing.assert_allclose(r.json()["scores"], want, atol=1e-6, rtol=0)


def test_a_model_named_is_the_one_that_answers(client):
    ranked = {}
    for name in ("embedder", "scorer"):
        body = {"model": name, "query": "cats", "documents": TEXTS}
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200 and r.json()["model"] == name
        ranked[name] = {h["index"]: h["relevance_score"] for h in r.json()["results"]}
    r = client.post("/v1/embeddings", json={"model": "embedder", "input": ["cats", *TEXTS]})
    query, *documents = (np.array(d["embedding"]) for d in r.json()["data"])
    cosines = [d @ query / np.linalg.norm(d) / np.linalg.norm(query) for d in documents]
    np.testing.assert_allclose([ranked["embedder"][i] for i in (0, 1)], cosines, atol=1e-6)
    assert abs(ranked["scorer"][0] - cosines[0]) > 1e-3  # the scorer's own relevance


def test_an_unknown_model_is_a_404_naming_the_served_ones(client):
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "gpt-4"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["param"] == "model" and error["type"] == "NotFoundError"
    assert "`gpt-4` does not exist" in error["message"] and "scorer, embedder" in error["message"]


def test_each_engines_metrics_carry_its_model(client):
    assert client.post("/embed", json={"inputs": TEXTS}).status_code == 200
    families = text_string_to_metric_families(client.get("/metrics").text)
    batches = {
        s.labels["model"]: s.value
        for f in families
        for s in f.samples
        if s.name == "scoring_batches_total"
    }
    assert set(batches) == {"scorer", "embedder"} and batches["embedder"] >= 1


def test_a_request_naming_no_model_goes_to_its_verbs_default(client):
    body = {"query": "cats", "documents": TEXTS}
    assert client.post("/v1/rerank", json=body).json()["model"] == "embedder"  # default_for
    assert client.post("/v1/rerank", json=body | {"model": "scorer"}).json()["model"] == "scorer"
    score = {"query": "Is it a cat?", "items": TEXTS, "label_token_ids": [5, 7]}
    assert client.post("/v1/score", json=score).json()["model"] == "scorer"  # the one offering


@pytest.mark.parametrize(
    "route,body,model",
    [
        ("/v1/score", {"query": "q", "items": TEXTS, "label_token_ids": [5, 7]}, "scorer"),
        ("/score", {"queries": "q", "documents": TEXTS}, "embedder"),
        ("/v1/rerank", {"query": "q", "documents": TEXTS}, "embedder"),
        ("/v1/embeddings", {"input": TEXTS}, "embedder"),
        ("/embed", {"inputs": TEXTS}, None),  # TEI's answer names no model
    ],
)
def test_invocations_go_where_their_bodys_route_goes(client, route, body, model):
    direct, via = (client.post(path, json=body) for path in (route, "/invocations"))
    assert direct.status_code == via.status_code == 200, via.text
    if model is not None:
        assert direct.json()["model"] == via.json()["model"] == model
    assert floats(direct.json())
    np.testing.assert_allclose(floats(via.json()), floats(direct.json()), rtol=1e-6)


def floats(answer) -> list[float]:
    """The floats of a JSON answer, in order (its scores or vectors)."""
    if isinstance(answer, dict):
        return [x for v in answer.values() for x in floats(v)]
    if isinstance(answer, list):
        return [x for v in answer for x in floats(v)]
    return [answer] if isinstance(answer, float) else []


def test_a_model_that_does_not_fit_is_refused_at_start_naming_it_and_the_field(paths, tmp_path):
    models = write(
        tmp_path / "models.toml",
        f'[[models]]\nname = "embedder"\nmodel = "{paths["embedder"]}"\n'
        f'[[models]]\nname = "scorer"\nmodel = "{paths["scorer"]}"\n'
        "kv_cache_bytes = 1_000_000_000_000_000\n",  # a petabyte
    )
    app = create_app(settings_from_env({**BASE_ENV, "SCORING_MODELS": models}))
    with TestClient(app, backend="asyncio") as client:
        failed = lambda: client.get("/health").json()["status"] == "failed"
        assert wait_until(failed)
        r = client.get("/health")
        assert r.status_code == 503
        assert r.json()["message"].startswith("scorer: InvalidInput: kv_cache_bytes: a KV pool of")
        r = client.post("/v1/embeddings", json={"input": TEXTS})  # the other one serves
        assert r.status_code == 200 and r.json()["model"] == "embedder"
