"""The service under real hypercorn processes on 127.0.0.1: `hypercorn api.app:app` (asyncio
worker, engine in a trio thread) and `hypercorn -k trio api.app:app` (engine in the server's
loop). One server per worker class, shared by this module's tests."""

import time

import anyio
import httpx2
import numpy as np
import pytest

from tests.test_api_support import (
    DOCS,
    NO,
    YES,
    assert_rerank,
    assert_scores,
    error_body,
    expected_scores,
    held_start_server,
    rerank_cases,
    rerank_references,
    score_cases,
    tiny_env,
)

WORKERS = ["asyncio", "trio"]
BURST = 256
# seconds per request: a hang guard, not a bound (httpx's default 5 s is exceeded on a loaded
# machine, where a request that compiles a program takes longer)
TIMEOUT = 120.0


@pytest.fixture(scope="module", params=WORKERS)
def server(request, tiny_checkpoints, tmp_path_factory):
    log = tmp_path_factory.mktemp("hypercorn") / f"{request.param}.log"
    env = tiny_env(tiny_checkpoints["llama-untied"], SCORING_PRECOMPILE="1", SCORING_PROGRESS="1")
    with held_start_server(request.param, env, log) as server:
        yield server


@pytest.fixture(scope="module")
def rerank_expected(tiny_checkpoints):
    return rerank_references(tiny_checkpoints["llama-untied"])


def test_startup_compiles_with_progress_and_health_turns_ready(server):
    assert server.saw_503
    log = server.log.read_text()
    assert "INFO api: loading " in log and "compiling: 100%" in log
    assert "engine ready in " in log and "(3 programs compiled)" in log
    info = httpx2.get(f"{server.url}/get_server_info", timeout=TIMEOUT).json()
    assert info["async_library"] == server.worker and info["stats"]["compiles"] == 3


def test_score_equals_the_reference(server, reference):
    with httpx2.Client(base_url=server.url, timeout=TIMEOUT) as client:
        for body in score_cases():
            r = client.post("/v1/score", json=body)
            assert r.status_code == 200, r.text
            assert_scores(r.json()["scores"], expected_scores(reference, body))
            assert float(r.headers["x-total-time"]) > 0


def test_rerank_equals_engine_rerank(server, rerank_expected):
    with httpx2.Client(base_url=server.url, timeout=TIMEOUT) as client:
        for (path, body, _), expected in zip(rerank_cases(), rerank_expected, strict=True):
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            assert_rerank(r.json(), body, expected, DOCS)


def test_errors(server):
    with httpx2.Client(base_url=server.url, timeout=TIMEOUT) as client:
        r = client.post("/v1/score", content=b'{"query": ')
        assert (r.status_code, r.json()) == (
            400,
            error_body("invalid JSON: Input data was truncated", "BadRequestError"),
        )
        body = {"query": [5] * 600, "items": [[1]], "label_token_ids": [1]}
        r = client.post("/v1/score", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "items[0]"
        r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"], "top_n": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_n"
        assert client.get("/nowhere").status_code == 404
        assert client.get("/metrics").text.count("scoring_http_requests_total{") >= 4


def burst_bodies() -> list[dict]:
    """32 distinct requests of 4 text items, cycled over the burst."""
    return [
        {
            "query": f"Question {i}: is the river near the house? Answer:",
            "items": [f" yes {i}", " the stone is green", f" no, {i} times", " maybe"],
            "label_token_ids": [YES, NO],
            "apply_softmax": i % 2 == 0,
        }
        for i in range(32)
    ]


async def burst(url: str, bodies: list[dict]) -> tuple[list, float]:
    """Every body posted at once on its own connection: (status, scores, seconds) each, wall."""
    answers = [None] * len(bodies)
    limits = httpx2.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx2.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(i: int) -> None:
            start = time.perf_counter()
            r = await client.post("/v1/score", json=bodies[i])
            scores = r.json()["scores"] if r.status_code == 200 else r.text
            answers[i] = (r.status_code, scores, time.perf_counter() - start)

        start = time.perf_counter()
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tasks:
                for i in range(len(bodies)):
                    tasks.start_soon(one, i)
        return answers, time.perf_counter() - start


def test_burst_of_256_concurrent_requests(server, reference):
    distinct = burst_bodies()
    expected = [expected_scores(reference, body) for body in distinct]
    bodies = [distinct[i % len(distinct)] for i in range(BURST)]
    answers, wall = anyio.run(burst, server.url, bodies)
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * BURST, {s: statuses.count(s) for s in set(statuses)}
    for i, (_, scores, _) in enumerate(answers):
        assert_scores(scores, expected[i % len(distinct)])
    latencies = np.array([seconds for _, _, seconds in answers]) * 1e3
    items = sum(len(body["items"]) for body in bodies)
    print(
        f"\nburst [{server.worker} worker]: {BURST} concurrent requests, {items} items in "
        f"{wall:.2f} s: P50 {np.percentile(latencies, 50):.0f} ms, "
        f"P99 {np.percentile(latencies, 99):.0f} ms, {items / wall:.0f} items/s"
    )
