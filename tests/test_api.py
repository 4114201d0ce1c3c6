"""The HTTP service in process, through Starlette's TestClient on asyncio (engine in a trio
thread behind the bridge) and on trio (engine in the server's loop): every endpoint, every error."""

import itertools
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

import anyio
import msgspec
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from api import schemas
from api.app import create_app
from api.routes import ROUTES
from api.settings import Settings, settings_from_env
from score_kernels import cpu
from tests.test_api_support import (
    DOCS,
    NO,
    YES,
    asgi_post,
    assert_rerank,
    assert_scores,
    device_faults,
    error_body,
    expected_scores,
    ids,
    rerank_cases,
    rerank_references,
    score_cases,
    serving,
    settled,
    tables_empty,
    tiny_env,
    wait_until,
)

BACKENDS = ["asyncio", "trio"]


@pytest.fixture(scope="module")
def rerank_expected(tiny_path):
    return rerank_references(tiny_path)


@pytest.fixture(scope="module", params=BACKENDS)
def client(request, tiny_path):
    """A ready service with default limits and no API key."""
    yield from serving(create_app(settings_from_env(tiny_env(tiny_path))), request.param)


def host_of(client):
    return client.app.state.service.host


def engine_of(client):
    return host_of(client).engine


error = error_body


def invalid(message: str, param: str | None = None) -> dict:
    return error(message, "BadRequestError", param)


# -- settings --------------------------------------------------------------------------------


def test_settings_from_env_cover_engine_and_server(tiny_path):
    s = settings_from_env(
        tiny_env(
            tiny_path,
            SCORING_TOKEN_BUCKETS="128, 256,512",
            SCORING_LABEL_WIDTHS="4",
            SCORING_API_KEY="k",
            SCORING_CORS_ORIGINS="http://a.example,http://b.example",
            SCORING_MODEL_NAME="tiny",
        )
    )
    assert s.engine.model == str(tiny_path) and s.engine.dtype == "float32"
    assert s.engine.token_budget == 512 and s.engine.token_buckets == (128, 256, 512)
    assert s.engine.label_widths == (4,) and s.engine.precompile is False
    assert s.engine.compile_cache_dir is None and s.engine.progress is False
    assert s.server.api_key == "k" and s.model_name == "tiny"
    assert s.server.cors_origins == ("http://a.example", "http://b.example")


def test_settings_defaults():
    s = settings_from_env({})
    assert s == Settings() and s.model_name in ("SmolLM2-135M-Instruct.Q4_1", "default")
    assert s.server.api_key is None and s.server.max_body_bytes == 16 * 2**20
    assert s.server.cors_origins == () and s.engine.precompile is True
    assert settings_from_env({"SCORING_MODEL": "/m/SmolLM2.Q8_0.gguf"}).model_name == "SmolLM2.Q8_0"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SCORING_TOKEN_BUDGET", "lots", "SCORING_TOKEN_BUDGET: Expected `int`, got `str`"),
        ("SCORING_TOKEN_BUCKETS", "128,x", "SCORING_TOKEN_BUCKETS: Expected `int`, got `str`"),
        ("SCORING_PRECOMPILE", "maybe", "SCORING_PRECOMPILE: Expected `bool`, got `str`"),
        ("SCORING_MAX_BODY_BYTES", "1.5", "SCORING_MAX_BODY_BYTES: Expected `int`, got `str`"),
    ],
)
def test_settings_name_the_bad_variable(name, value, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        settings_from_env({name: value})


def test_unknown_setting_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="api"):
        settings_from_env({"SCORING_TOKEN_BUDGTE": "1"})
    assert "ignoring unknown setting SCORING_TOKEN_BUDGTE" in caplog.text


# -- health and readiness --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_health_is_503_until_the_engine_is_ready(tiny_path, backend):
    app = create_app(settings_from_env(tiny_env(tiny_path)))
    client = TestClient(app, backend=backend)  # no lifespan yet: nothing is loaded
    r = client.get("/health")
    assert (r.status_code, r.json()) == (503, {"status": "loading", "message": None})
    assert r.headers["retry-after"] == "1"
    r = client.post("/v1/score", json=score_cases()[0])
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == error("the engine is loading", "ServiceUnavailableError")
    (card,) = client.get("/v1/models").json()["data"]  # no key needed, the facts unknown yet
    assert card["id"] == "llama-untied" and card["max_model_len"] is None
    assert all(card[fact] is None for fact in MODEL_FACTS)
    info = client.get("/get_server_info").json()
    assert info["status"] == "loading" and info["engine_config"]["model"] == str(tiny_path)
    assert info["buckets"] is info["stats"] is info["max_sequence_tokens"] is None
    with client:
        assert wait_until(lambda: client.get("/health").status_code == 200)
        assert client.get("/health").json() == {"status": "ok", "message": None}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_that_fails_to_load_leaves_health_503(tmp_path, backend):
    app = create_app(settings_from_env(tiny_env(tmp_path / "missing")))
    with TestClient(app, backend=backend) as client:
        assert wait_until(lambda: client.get("/health").json()["status"] == "failed")
        reason = (
            f"CheckpointError: {tmp_path / 'missing'}: "
            "not a Hugging Face model directory or an existing .gguf file"
        )
        r = client.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "failed", "message": reason})
        r = client.post("/v1/score", json=score_cases()[0])
        assert r.status_code == 503
        assert r.json() == error(f"the engine is not running: {reason}", "ServiceUnavailableError")


# -- /v1/score -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(score_cases())))
def test_score_equals_the_reference(client, reference, case):
    body = score_cases()[case]
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert_scores(got["scores"], expected_scores(reference, body))
    seqs = reference.sequences(
        body["query"], body["items"], item_first=body.get("item_first", False)
    )
    tokens = sum(map(len, seqs))
    cached = got["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert got["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    assert 0 <= cached < tokens  # earlier cases may have cached a prefix
    assert got["model"] == body.get("model", "llama-untied") and got["object"] == "scoring"
    assert set(got) == {"scores", "model", "usage", "object"}
    r = client.post("/v1/score", json={**body, "model": "asked-for"})  # echoed, as SGLang does
    assert r.json()["model"] == "asked-for"
    assert_scores(r.json()["scores"], got["scores"])


@pytest.mark.parametrize("path", ["/v1/score", "/v1/rerank"])
def test_usage_counts_prompt_tokens_read_from_the_kv_cache(client, path):
    query = "a long shared prompt " * 8 + path  # its own prompt: nothing cached before
    if path == "/v1/score":
        body = {"query": query, "items": [" one", " two"], "label_token_ids": [1, 2]}
    else:
        body = {"query": query, "documents": ["one", "two"]}
    first, second = (client.post(path, json=body).json()["usage"] for _ in "ab")
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"] == first["prompt_tokens"]


def test_timing_headers_in_milliseconds(client):
    r = client.post("/v1/score", json=score_cases()[0])
    times = {
        stage: float(r.headers[f"x-{stage}-time"])
        for stage in (
            "tokenize",
            "queue",
            "batch-build",
            "plan",
            "pack",
            "device",
            "dispatch",
            "total",
        )
    }
    assert all(t >= 0 for t in times.values())
    assert times["total"] >= times["device"] >= times["dispatch"] > 0
    assert times["batch-build"] >= times["pack"] > 0


# -- /v1/rerank ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(len(rerank_cases())))
def test_rerank_equals_engine_rerank(client, rerank_expected, case):
    path, body, _ = rerank_cases()[case]
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    if isinstance(r.json(), dict):  # the request's model is echoed, else the served one
        assert r.json()["model"] == body.get("model", "llama-untied")
    assert_rerank(r.json(), body, rerank_expected[case], DOCS)
    assert float(r.headers["x-device-time"]) > 0


def test_rerank_truncates_to_fit_the_context_when_asked(client):
    long_doc = "yes no maybe " * 300  # far over the 512-token context
    body = {"query": "q", "documents": [long_doc, "short"]}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("documents[0]: sequence of ") and message.endswith(
        "tokens exceeds the model context of 512. Please reduce the length of the input."
    )
    assert r.json()["error"]["param"] == "documents[0]"
    r = client.post("/v1/rerank", json={**body, "truncate": True, "return_documents": True})
    assert r.status_code == 200, r.text
    assert 512 < r.json()["usage"]["prompt_tokens"] <= 2 * 512
    assert {h["document"]["text"] for h in r.json()["results"]} == {long_doc, "short"}


# -- request errors: 400 ---------------------------------------------------------------------

TYPES = "Expected `str | array`, got `int`"
BAD_SCORES = [
    (b"{", invalid("invalid JSON: Input data was truncated")),
    (b"[]", invalid("Expected `object`, got `array`")),
    (b'{"query": 1}', invalid(f"{TYPES} - at `$.query`", "query")),
    (
        b'{"query": "q", "items": ["a", [1, "b"]], "label_token_ids": [1]}',
        invalid("Expected `int`, got `str` - at `$.items[1][1]`", "items[1][1]"),
    ),
    (
        b'{"query": "q", "items": ["a"], "label_token_ids": [true]}',
        invalid("Expected `int`, got `bool` - at `$.label_token_ids[0]`", "label_token_ids[0]"),
    ),
    (
        b'{"query": "q", "items": ["a"]}',
        invalid("Object missing required field `label_token_ids`", "label_token_ids"),
    ),
    (
        b'{"query": "q", "items": ["a"], "label_token_ids": [1], "temperature": 0}',
        invalid("Object contains unknown field `temperature`", "temperature"),
    ),
    (
        b'{"query": "", "items": ["a", ""], "label_token_ids": [1]}',
        invalid("items[1]: no tokens: the query and the item are both empty", "items[1]"),
    ),
    (
        b'{"query": [], "items": [[2], []], "label_token_ids": [1]}',
        invalid("items[1]: no tokens: the query and the item are both empty", "items[1]"),
    ),
    (
        b'{"query": "q", "items": ["a"], "label_token_ids": []}',
        invalid("label_token_ids: must be a non-empty list of token ids", "label_token_ids"),
    ),
    (
        b'{"query": "q", "items": ["a"], "label_token_ids": [5, 384, -1]}',
        invalid(
            "label_token_ids: Token ID 384 is out of vocabulary range (vocab size: 384); "
            "all outside: [384, -1]",
            "label_token_ids",
        ),
    ),
    (
        b'{"query": [1, 2], "items": [[3], [1000]], "label_token_ids": [1]}',
        invalid("items[1]: token id outside the vocabulary [0, 384)", "items[1]"),
    ),
    (
        b'{"query": "q", "items": [[1, 2]], "label_token_ids": [1]}',
        invalid(
            "query/items: must be all text (str query, list of str items) or all token ids "
            "(list[int] query, list of list[int] items)",
            "query/items",
        ),
    ),
]


@pytest.mark.parametrize(("body", "answer"), BAD_SCORES)
def test_score_rejects_bad_input_with_400(client, body, answer):
    r = client.post("/v1/score", content=body, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (400, answer)


ONE_LIST = "give the documents as one of `documents`, `texts` (TEI) or `input`"
TEXT_REQUIRED = "required (or name the fields to rank with `rank_fields`)"
BAD_RERANKS = [
    ({"query": "q"}, invalid(f"documents: {ONE_LIST}", "documents")),
    ({"query": "q", "documents": ["a"], "texts": ["a"]}, invalid(f"texts: {ONE_LIST}", "texts")),
    ({"query": "q", "documents": ["a"], "input": ["a"]}, invalid(f"input: {ONE_LIST}", "input")),
    (
        {"query": "q", "documents": []},
        invalid("documents: must be a non-empty list of strings", "documents"),
    ),
    (
        {"query": "q", "texts": []},
        invalid("texts: must be a non-empty list of strings", "texts"),
    ),
    (
        {"query": "q", "documents": ["a"], "top_n": -1},
        invalid("Expected `int` >= 0 - at `$.top_n`", "top_n"),
    ),
    (
        {"query": "q", "documents": ["a"], "max_tokens_per_doc": -3},
        invalid("Expected `int` >= 1 - at `$.max_tokens_per_doc`", "max_tokens_per_doc"),
    ),
    (
        {"query": "q", "documents": [{"txt": "a"}]},
        invalid(f"documents[0].text: {TEXT_REQUIRED}", "documents[0].text"),
    ),
    (
        {"query": "q", "documents": ["a", {"text": 7}]},
        invalid("documents[1].text: must be a string", "documents[1].text"),
    ),
    (
        {"query": "q", "documents": [{"title": "a"}], "rank_fields": ["text"]},
        invalid("documents[0]: has none of the rank_fields ['text']", "documents[0]"),
    ),
    (
        {"query": ["q"], "documents": ["a"]},
        invalid("Expected `str`, got `array` - at `$.query`", "query"),
    ),
    (
        {"query": "q", "documents": ["a"], "temperature": 0},
        invalid("Object contains unknown field `temperature`", "temperature"),
    ),
    (
        {"query": "q", "documents": ["a"], "instruction": "x", "instruct": "y"},
        invalid("instruct: give `instruction` or `instruct`, not both", "instruct"),
    ),
    (
        {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 100000},
        invalid(
            "truncate_prompt_tokens: must be an integer from 1 to the model context (512). "
            "Please, select a smaller truncation size.",
            "truncate_prompt_tokens",
        ),
    ),
]


@pytest.mark.parametrize(("body", "answer"), BAD_RERANKS)
def test_rerank_rejects_bad_input_with_400(client, body, answer):
    for path in ("/v1/rerank", "/v2/rerank"):
        r = client.post(path, json=body)
        assert (r.status_code, r.json()) == (400, answer)


def test_unknown_route_and_wrong_method(client):
    r = client.get("/v2/score")
    assert (r.status_code, r.json()) == (404, error("Not Found", "NotFoundError"))
    r = client.get("/v1/score")
    assert (r.status_code, r.json()) == (405, error("Method Not Allowed", "MethodNotAllowedError"))
    assert r.headers["allow"] == "POST"


# -- over a size limit: 400 -----------------------------------------------------------------


def test_sequence_over_the_context_is_400_as_vllm_answers(client):
    r = client.post(
        "/v1/score",
        json={"query": [5] * 500, "items": [[1], [2] * 13], "label_token_ids": [1]},
    )
    assert r.status_code == 400
    assert r.json() == invalid(
        "items[1]: sequence of 513 tokens exceeds the model context of 512. "
        "Please reduce the length of the input.",
        "items[1]",
    )


def test_too_many_labels_is_400(client):
    r = client.post("/v1/score", json={"query": "q", "items": ["a"], "label_token_ids": [1] * 257})
    assert r.status_code == 400
    assert r.json() == invalid(
        "label_token_ids: 257 labels exceed the limit of 256", "label_token_ids"
    )


# -- 499 disconnect, 500 internal (503 overload: tests/test_faults.py) -----------------------


def heavy(rng, items: int, length: int) -> dict:
    return {
        "query": ids(rng, 20),
        "items": [ids(rng, length) for _ in range(items)],
        "label_token_ids": [YES, NO],
    }


def test_disconnect_drops_the_engine_work(client):
    engine = engine_of(client)
    body = heavy(np.random.default_rng(4), 2000, 48)  # ~200 batches of 512 tokens
    begun, released = threading.Event(), threading.Event()
    batches = itertools.count(1)

    def hold_the_second_batch(inputs) -> None:
        if next(batches) == 2:  # tokenised, batching has begun
            begun.set()
            released.wait(120)  # the device waits while the client leaves

    async def leave_early():
        gone = anyio.Event()
        async with anyio.create_task_group() as tasks:
            answer = []
            tasks.start_soon(
                lambda: _append(answer, asgi_post(client.app, "/v1/score", body, disconnect=gone))
            )
            assert await anyio.to_thread.run_sync(begun.wait, 120)
            gone.set()
        return answer[0], engine.stats().batches

    with device_faults(engine, hold_the_second_batch):
        try:
            (status, _, payload), at_disconnect = client.portal.call(leave_early)
        finally:
            released.set()
        client.portal.call(settled, host_of(client))
    assert status == 499
    assert json.loads(payload) == error("client closed the request", "ClientClosedRequestError")
    assert tables_empty(engine)
    assert engine.stats().batches <= at_disconnect + 3  # the rest was dropped, not run
    metrics = client.get("/metrics").text
    assert 'scoring_http_requests_total{route="/v1/score",status="499"} 1.0' in metrics


async def _append(out: list, coroutine) -> None:
    out.append(await coroutine)


def test_engine_failure_is_500_and_the_server_keeps_serving(client, reference, caplog):
    def on_fire(inputs) -> None:
        raise RuntimeError("device on fire")

    with device_faults(engine_of(client), on_fire), caplog.at_level(logging.ERROR, logger="api"):
        r = client.post("/v1/score", json=score_cases()[0])
    assert r.status_code == 500
    assert r.json() == error(
        "engine failure: device step failed: RuntimeError: device on fire", "InternalServerError"
    )
    assert "engine failure: device step failed" in caplog.text
    body = score_cases()[1]
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200
    assert_scores(r.json()["scores"], expected_scores(reference, body))


def test_a_bug_in_the_service_is_500_with_a_log_line(client, caplog, monkeypatch):
    def broken(*args):
        raise KeyError("stage")

    monkeypatch.setattr(client.app.state.service.metrics, "observe", broken)
    with caplog.at_level(logging.ERROR, logger="api"):
        r = client.post("/v1/score", json=score_cases()[0])
    assert r.status_code == 500
    assert r.json() == error("internal error: KeyError: 'stage'", "InternalServerError")
    assert "internal error: KeyError" in caplog.text and "Traceback" in caplog.text
    monkeypatch.undo()
    assert client.post("/v1/score", json=score_cases()[0]).status_code == 200


# -- info, metrics, profile, openapi ---------------------------------------------------------


MODEL_FACTS = ("family", "dtype", "vocab_size", "context_length", "kv_bytes_per_token", "head")
MODEL_FACTS += ("architecture", "num_labels", "rerank_template", "endpoints")


# every scoring route: a language-model head and a recipe whose labels are single tokens
ENDPOINTS = ["/v1/score", "/generative_scoring", "/v1/rerank", "/v2/rerank", "/rerank"]
ENDPOINTS += ["/v1/reranking", "/score"]
ENDPOINTS += ["/invocations", "/"]  # SageMaker's and TEI's root, for each of those bodies


def test_models(client):
    r = client.get("/v1/models")
    assert r.status_code == 200
    assert r.json()["object"] == "list"
    (card,) = r.json()["data"]
    assert abs(card.pop("created") - time.time()) < 3600
    assert card == {
        "id": "llama-untied",
        "object": "model",
        "owned_by": "llm-scoring-engine",
        "max_model_len": 512,
        "family": "llama",
        "dtype": "float32",
        "vocab_size": 384,
        "context_length": 512,
        "kv_bytes_per_token": 2 * 2 * 2 * 16 * 4,  # K and V, layers, kv heads, head dim, f32
        "head": "language-model",
        "architecture": "decoder",
        "num_labels": 0,
        "rerank_template": "plain",
        "endpoints": ENDPOINTS,
        "default_endpoints": ENDPOINTS,  # the only model answers them all
    }
    info = client.get("/get_model_info").json()
    assert {fact: card[fact] for fact in MODEL_FACTS} == {fact: info[fact] for fact in MODEL_FACTS}


def test_model_info(client, tiny_path):
    r = client.get("/get_model_info")
    assert msgspec.json.decode(r.content, type=schemas.ModelInfo)  # the documented schema
    assert r.json() == {
        "model_path": str(tiny_path),
        "tokenizer_path": str(tiny_path),
        "is_generation": False,
        "model_name": "llama-untied",
        "family": "llama",
        "dtype": "float32",
        "vocab_size": 384,
        "context_length": 512,
        "max_sequence_tokens": 512,
        "kv_bytes_per_token": 2 * 2 * 2 * 16 * 4,  # K and V, layers, kv heads, head dim, f32
        "head": "language-model",
        "architecture": "decoder",
        "num_labels": 0,
        "rerank_template": "plain",
        "endpoints": ENDPOINTS,
    }


def test_server_info(client, tiny_path):
    r = client.get("/get_server_info")
    assert msgspec.json.decode(r.content, type=schemas.ServerInfo)  # the documented schema
    info = r.json()
    assert list(info) == [
        "version",
        "model",
        "status",
        "async_library",
        "auth",
        "engine_config",
        "server_config",
        "buckets",
        "kv_bytes_per_token",
        "kv_pool",
        "dense",
        "plan",
        "roofline",
        "max_sequence_tokens",
        "stats",
        "profiling",
    ]
    assert info["status"] == "ready" and info["model"] == "llama-untied"
    assert info["async_library"] == client.async_backend["backend"]
    assert info["auth"] is False and info["profiling"] is None
    assert info["engine_config"]["model"] == str(tiny_path)
    assert info["engine_config"]["token_budget"] == 512
    assert info["server_config"]["max_body_bytes"] == 16 * 2**20
    assert info["buckets"] == {
        "block_size": 64,
        "tokens": [128, 256, 512],
        "row_divisors": [2],
        "label_widths": [4, 32, 256],
        "contexts": [0, 1024],
        "window": 0,
    }
    assert info["kv_bytes_per_token"] == 512 and info["max_sequence_tokens"] == 512
    # the default pool: what 2^18 tokens need (less than an eighth of this host's memory)
    assert info["kv_pool"] == {
        "pages": 2**18 // 16,
        "page_size": 16,
        "capacity_tokens": 2**18,
        "bytes": 2**18 * 512,
        "prefix_cache": True,
    }
    dense = info["dense"]  # f32: the native f32 kernel timed against XLA's dot, where it runs
    if cpu.F32_AVAILABLE:
        assert dense["mode"] == "float32" and dense["shapes"]
        assert {s["chosen"] for s in dense["shapes"]} <= {"xla", "cpu"}
    else:
        assert dense is None
    weights = engine_of(client).program.weight_bytes
    assert list(info["plan"]) == ["cpu", "h100", "h200", "tpu-v5e", "tpu-v6e"]
    assert info["plan"]["h100"] == {
        "memory_bytes": 80 * 10**9,
        "weight_bytes": weights,
        "kv_bytes_per_token": 512,
        "default_pool_tokens": 2**18,  # an eighth of 80 GB holds more than the cap
        "capacity_tokens": (80 * 10**9 - weights) // 512,
    }
    assert info["plan"]["cpu"]["memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES"
    )
    assert set(info["stats"]) == set(msgspec.structs.asdict(engine_of(client).stats()))
    assert info["roofline"] is None  # it compiles: only when asked


def test_server_info_gives_the_roofline_when_asked(client):
    engine = engine_of(client)
    first = client.get("/get_server_info", params={"roofline": "1"}).json()["roofline"]
    assert list(first["devices"]) == ["cpu", "h100", "h200", "tpu-v5e", "tpu-v6e"]
    assert first["model"]["weight_bytes"] == engine.program.weight_bytes
    assert first["model"]["dtype"] == engine.program.dtype
    # this model's context is 512 tokens: W2's 2,020-token sequences are refused, so skipped
    assert list(first["skipped"]) == ["w2"] and "2020-token" in first["skipped"]["w2"]
    assert "w2" not in first["devices"]["h100"]
    estimate = first["devices"]["h100"]["w1"]
    assert estimate["items_per_s"] == pytest.approx(64 / estimate["seconds"])
    assert all(b["real_tokens"] <= engine.config.token_budget for b in first["batches"]["w1"])
    again = client.get("/get_server_info", params={"roofline": "true"}).json()["roofline"]
    assert again == first  # computed once


def scrape(client) -> dict:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_metrics(client):
    before = scrape(client)
    r = client.post("/v1/score", json=score_cases()[0])
    client.post("/v1/score", content=b"{")
    after = scrape(client)
    stats = engine_of(client).stats()
    ok = ("scoring_http_requests_total", (("route", "/v1/score"), ("status", "200")))
    bad = ("scoring_http_requests_total", (("route", "/v1/score"), ("status", "400")))
    assert after[ok] - before.get(ok, 0) == 1 and after[bad] - before.get(bad, 0) == 1
    for stage in (
        "tokenize",
        "queue",
        "batch_build",
        "plan",
        "pack",
        "device",
        "dispatch",
        "total",
    ):
        key = ("scoring_stage_seconds_count", (("stage", stage),))
        assert after[key] - before.get(key, 0) == 1
    device = after[("scoring_stage_seconds_sum", (("stage", "device"),))]
    assert device >= float(r.headers["x-device-time"]) / 1e3 - 1e-6
    assert after[("scoring_queue_depth", ())] == 0
    assert after[("scoring_queued_tokens", ())] == 0
    assert after[("scoring_requests_in_flight", ())] == 0
    assert after[("scoring_batch_tokens_total", (("kind", "real"),))] == stats.real_tokens
    assert after[("scoring_batch_tokens_total", (("kind", "padded"),))] == stats.padded_tokens
    assert after[("scoring_prefix_tokens_saved_total", ())] == stats.prefix_tokens_saved
    assert after[("scoring_compiles_total", ())] == stats.compiles > 0
    assert after[("scoring_grid_compiled", ())] == 1.0 and stats.grid_compiled
    assert after[("scoring_batches_total", ())] == stats.batches
    assert after[("scoring_runner_batches_total", (("runner", "0"),))] == stats.batches
    assert stats.runner_batches == [stats.batches]
    items = ("scoring_items_total", (("route", "/v1/score"),))
    assert after[items] - before.get(items, 0) == 4
    assert client.get("/metrics").headers["content-type"].startswith("text/plain; version=0.0.4")


def test_profile_start_stop(client, tiny_path):
    root = Path(settings_from_env(tiny_env(tiny_path)).server.profile_dir).resolve()
    out = root / f"trace-{uuid.uuid4().hex}"
    r = client.post("/start_profile", json={"output_dir": out.name})
    assert (r.status_code, r.json()) == (200, {"status": "started", "output_dir": str(out)})
    r = client.post("/start_profile")
    assert r.status_code == 409
    assert r.json() == error(f"a profile is already running into {out}", "ConflictError")
    assert client.get("/get_server_info").json()["profiling"] == str(out)
    assert client.post("/v1/score", json=score_cases()[0]).status_code == 200
    r = client.post("/stop_profile")
    assert (r.status_code, r.json()) == (200, {"status": "stopped", "output_dir": str(out)})
    assert list(out.rglob("*.xplane.pb"))
    r = client.post("/stop_profile")
    assert (r.status_code, r.json()) == (409, error("no profile is running", "ConflictError"))
    r = client.post("/start_profile", json={"dir": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dir"


def test_openapi_is_generated_from_the_route_table(client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    served = {(r.path, m.lower()) for r in ROUTES for m in r.methods if m != "HEAD"}
    assert {(path, m) for path, ops in doc["paths"].items() for m in ops} == served
    assert set(doc["paths"]) == {
        "/v1/score",
        "/generative_scoring",
        "/score",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/reranking",
        "/v1/embeddings",
        "/v2/embed",
        "/embed",
        "/embed_all",
        "/embed_sparse",
        "/embed_hybrid",
        "/similarity",
        "/pooling",
        "/invocations",
        "/",
        "/tokenize",
        "/detokenize",
        "/decode",
        "/info",
        "/ping",
        "/health",
        "/v1/models",
        "/get_model_info",
        "/get_server_info",
        "/metrics",
        "/dashboard",
        "/start_profile",
        "/stop_profile",
        "/openapi.json",
    }
    components = doc["components"]["schemas"]
    score = components["ScoreRequest"]
    assert score["required"] == ["query", "items", "label_token_ids"]
    assert score["additionalProperties"] is False
    assert set(components["RerankRequest"]["properties"]) >= {
        "documents",
        "texts",
        "return_text",
        "top_n",
    }
    body = doc["paths"]["/v1/score"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"oneOf": [ref("ScoreRequest"), ref("VllmScoreRequest")]}

    def answer(path: str, status: str, method: str = "get") -> dict:
        return doc["paths"][path][method]["responses"][status]["content"]["application/json"]

    assert answer("/v1/score", "413", "post")["schema"] == ref("ErrorResponse")
    assert answer("/get_model_info", "200")["schema"] == ref("ModelInfo")
    assert answer("/get_server_info", "200")["schema"] == ref("ServerInfo")
    assert answer("/health", "503")["schema"] == ref("HealthResponse")
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert set(components["ModelCard"]["properties"]) >= {"id", "created", *MODEL_FACTS}
    info = components["ServerInfo"]["properties"]
    assert info["engine_config"] == ref("EngineConfig") and "EngineStats" in components
    profile = doc["paths"]["/start_profile"]["post"]
    assert profile["requestBody"]["required"] is False
    assert set(profile["responses"]) == {"200", "400", "401", "409", "413"}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}
