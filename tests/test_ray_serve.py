"""The Ray Serve application on a local Ray instance (127.0.0.1 only): two engine replicas of the
tiny model behind the ingress, prefix-affinity routing, a replica killed mid-run, scale-down."""

import concurrent.futures
import contextlib
import os
import re
import threading

import httpx2
import pytest

from api.ray_serve import build_app
from bench.w4_ray import local_serve
from tests.test_api_support import (
    DOCS,
    NO,
    YES,
    assert_rerank,
    assert_scores,
    expected_scores,
    rerank_cases,
    rerank_references,
    score_cases,
    tiny_env,
    wait_until,
)

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

APP = "scoring"
OPTIONS = {"replicas": 2, "replica_cpus": 0.5}


@contextlib.contextmanager
def environment(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def url(tiny_path):
    # replicas push their autoscaling figures every second (Ray's default: 10 s); the router
    # waits up to 10 s for a replica's queue length (Ray's default: 0.1 s, after which it routes
    # to the next rank: on a busy machine a slow answer would move a request off the replica
    # that holds its prefix)
    env = tiny_env(
        tiny_path,
        RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S="1",
        RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S="10",
    )
    with environment(env), local_serve(cpus=2) as url:
        serve.run(build_app(OPTIONS), name=APP, route_prefix="/")
        yield url


@pytest.fixture(scope="module")
def client(url):
    with httpx2.Client(base_url=url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def rerank_expected(tiny_path):
    return rerank_references(tiny_path)


def replica_of(response) -> str:
    return response.headers["x-scoring-replica"]


def running_replicas() -> int:
    status = serve.status().applications[APP].deployments["EngineReplica"]
    return status.replica_states.get("RUNNING", 0)


def test_scores_equal_a_single_engine(client, reference, rerank_expected):
    assert client.get("/health").json() == {"status": "ok", "message": None}
    for body in score_cases():
        r = client.post("/v1/score", json=body)
        assert r.status_code == 200, r.text
        assert_scores(r.json()["scores"], expected_scores(reference, body))
    for (path, body, _), expected in zip(rerank_cases(), rerank_expected, strict=True):
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert_rerank(r.json(), body, expected, DOCS)
    r = client.post("/v1/score", json={"query": "q", "items": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "label_token_ids"


def test_requests_sharing_a_query_go_to_the_replica_that_cached_it(client):
    queries = [f"Query {i}: is this passage about rivers? " * 8 for i in range(6)]
    seen: dict[int, set[str]] = {i: set() for i in range(len(queries))}
    for round_ in range(3):
        for i, query in enumerate(queries):
            body = {"query": query, "items": [f" item {round_}"], "label_token_ids": [YES, NO]}
            r = client.post("/v1/score", json=body)
            assert r.status_code == 200, r.text
            seen[i].add(replica_of(r))
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert (cached > 0) == (round_ > 0), (i, round_, cached)
    assert all(len(replicas) == 1 for replicas in seen.values()), seen


def score_body(i: int) -> dict:
    return {
        "query": f"Stream {i % 5}: does the passage answer the question? " * 4,
        "items": [" yes it does", *(f" no, item {i}.{j}" for j in range(15))],
        "label_token_ids": [YES, NO],
    }


def held_query(name: str) -> str:
    return f"Held {name}: which of these passages answers the question? " * 4


def held_body(name: str, items: int = 4000, query: str | None = None) -> dict:
    """A request that keeps its replica busy for a few seconds."""
    items = [f" passage {j} of {name}" for j in range(items)]
    return {"query": query or held_query(name), "items": items, "label_token_ids": [YES, NO]}


def a_query_on_each_replica(client, name: str) -> list[str]:
    """Queries that two different replicas have served, one each: the router sends any later
    request with one of them to that replica (prefix affinity), whatever the replicas' loads
    look like to it then. New queries spread at random between idle replicas, so this asks
    until it has seen both."""
    by_replica: dict[str, str] = {}
    for i in range(1000):
        query = held_query(f"{name} {i}")
        r = client.post(
            "/v1/score", json={"query": query, "items": [" a"], "label_token_ids": [YES, NO]}
        )
        assert r.status_code == 200, r.text
        by_replica.setdefault(replica_of(r), query)
        if len(by_replica) == 2:
            return list(by_replica.values())
    raise AssertionError(f"1000 new queries all went to {set(by_replica)}")


def in_flight_at(client, query: str) -> tuple[str, int]:
    """(replica, requests in its engine) of the replica holding `query`: a scrape routed by the
    query in its body, as any request with that query would be."""
    r = client.request("GET", "/metrics", json={"query": query})
    value = re.search(r"^scoring_requests_in_flight (\S+)$", r.text, re.M).group(1)
    return replica_of(r), int(float(value))


def wait_in_flight(client, query: str) -> str:
    """Once the replica holding `query` has work in its engine, that replica."""
    seen = []

    def busy() -> bool:
        seen.append(in_flight_at(client, query))
        return seen[-1][1] > 0

    assert wait_until(busy, timeout=300), seen[-3:]
    return seen[-1][0]


def post_all(client, bodies) -> list:
    """Each body posted from 8 threads, all at once; the responses in order."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda body: client.post("/v1/score", json=body), bodies))


def assert_answers(reference, bodies, answers) -> None:
    for body, r in zip(bodies, answers, strict=True):
        assert r.status_code == 200, r.text
        assert_scores(r.json()["scores"], expected_scores(reference, body))


def test_a_killed_replica_loses_no_request(client, reference):
    held = held_body("kill")
    bodies = [score_body(i) for i in range(120)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held_answer = pool.submit(client.post, "/v1/score", json=held)
        victim = wait_in_flight(client, held["query"])
        stream = pool.submit(post_all, client, bodies)
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#EngineReplica#{victim}", namespace="serve"))
        answers = stream.result()
        held_answer = held_answer.result()
    # the request the killed replica held was sent again, to the other; none was lost
    assert held_answer.headers["x-scoring-retries"] == "1"
    assert replica_of(held_answer) != victim
    assert_answers(reference, [held, *bodies], [held_answer, *answers])
    assert victim not in {replica_of(r) for r in answers[-20:]}
    # Ray Serve brings the deployment back to two replicas
    assert wait_until(lambda: running_replicas() == 2, timeout=600)
    assert client.post("/v1/score", json=bodies[0]).status_code == 200


def test_a_redeploy_to_one_replica_drains_the_replicas_it_stops(client, reference):
    # serve.run of a new application object is a new version: Ray Serve replaces both replicas
    # (stopping one drains it like a scale-down or an autoscaler's removal would)
    on_one, on_the_other = a_query_on_each_replica(client, "redeploy")
    first, second = held_body("first", query=on_one), held_body("second", query=on_the_other)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(client.post, "/v1/score", json=first)]
        busy = [wait_in_flight(client, first["query"])]
        answers.append(pool.submit(client.post, "/v1/score", json=second))  # to the other
        busy.append(wait_in_flight(client, second["query"]))
        assert busy[0] != busy[1]  # both replicas hold a request
        serve.run(build_app({**OPTIONS, "replicas": 1}), name=APP, route_prefix="/")
        answers = [a.result() for a in answers]
    # the stopped replicas finished their requests first: nothing was sent again
    assert all("x-scoring-retries" not in r.headers for r in answers)
    assert [replica_of(r) for r in answers] == busy
    assert_answers(reference, [first, second], answers)
    assert wait_until(lambda: running_replicas() == 1, timeout=600)
    last = client.post("/v1/score", json=score_body(0))
    assert last.status_code == 200 and replica_of(last) not in busy


def test_autoscaling_adds_a_replica_when_tokens_queue(client, reference):
    options = {"min_replicas": 1, "max_replicas": 2, "target_queued_tokens": 1}
    options |= {"upscale_delay_s": 0, "look_back_period_s": 2}
    serve.run(build_app({**OPTIONS, **options}), name=APP, route_prefix="/")
    assert running_replicas() == 1
    body, stop = held_body("autoscaled", 1500), threading.Event()  # 4 at once fit the queue

    def load() -> list:
        answers = []
        while not stop.is_set():
            answers.append(client.post("/v1/score", json=body))
        return answers

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(load) for _ in range(4)]
        try:
            assert wait_until(lambda: running_replicas() == 2, timeout=600)
        finally:
            stop.set()
        answers = [r for c in clients for r in c.result()]
    expected = expected_scores(reference, body)
    for r in answers:
        assert r.status_code == 200, r.text
        assert_scores(r.json()["scores"], expected)
