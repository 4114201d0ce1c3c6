"""Security of the HTTP service, in process on asyncio and trio: the API key on every route but
`/health` and `/ping`, compared in constant time; error bodies without tracebacks or server
paths; body and item-count limits; the profile directory confined to its root; CORS off unless
configured; and room by default for 512 requests in flight."""

import hmac
import json
import logging
import sysconfig
from pathlib import Path

import anyio
import pytest
from starlette.testclient import TestClient

import api
from api.app import create_app
from api.routes import ROUTES
from api.settings import settings_from_env
from engine import EngineConfig, load_model
from tests.conftest import FaultyProgram
from tests.test_api_support import (
    YES,
    asgi_post,
    assert_scores,
    error_body,
    expected_scores,
    score_cases,
    serving,
    tiny_env,
)

BACKENDS = ["asyncio", "trio"]
KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPEN = {"/health", "/ping"}  # health checks: load balancers and SageMaker send no key
REPO = str(Path(api.__file__).resolve().parents[1])
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
BURST = 512
RERANK = {"query": "q", "documents": ["a", "b"]}


@pytest.fixture(scope="module")
def tiny_path(tiny_checkpoints):
    return tiny_checkpoints["llama-untied"]


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("profiles").resolve()


@pytest.fixture(scope="module", params=BACKENDS)
def secured(request, tiny_path, profile_root):
    """A ready service with an API key, small limits and its own profile directory."""
    env = tiny_env(
        tiny_path,
        SCORING_API_KEY=KEY,
        SCORING_MAX_BODY_BYTES="65536",
        SCORING_MAX_ITEMS_PER_REQUEST="64",
        SCORING_PROFILE_DIR=str(profile_root),
    )
    yield from serving(create_app(settings_from_env(env)), request.param)


@pytest.fixture(scope="module")
def reference(tiny_path):
    return load_model(str(tiny_path), dtype="float32")


error = error_body


UNAUTHORIZED = error(
    "missing or wrong API key: send `Authorization: Bearer <key>`", "AuthenticationError"
)


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, HEAD included."""
    return [(m, r.path) for r in ROUTES for m in sorted(r.methods)]


# -- the API key -----------------------------------------------------------------------------


BAD_KEYS = [None, "Bearer wrong", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer ", f"Bearer{KEY}"]
BAD_KEYS += [f"Basic {KEY}", "Basic czNjcmV0", f"Token {KEY}", KEY]


@pytest.mark.parametrize("header", BAD_KEYS)
def test_every_route_but_the_health_checks_needs_the_key(secured, header):
    headers = {"Authorization": header} if header is not None else {}
    for method, path in every_route():
        r = secured.request(method, path, headers=headers, json={})
        if path in OPEN:
            assert r.status_code == 200, (method, path)
            continue
        assert r.status_code == 401, (method, path)
        assert r.headers["www-authenticate"] == "Bearer"
        if method != "HEAD":
            assert r.json() == UNAUTHORIZED


def test_the_right_key_opens_every_read_route(secured):
    for method, path in every_route():
        if method == "GET":
            r = secured.get(path, headers=AUTH)
            assert r.status_code == 200, (path, r.text)
            assert KEY not in r.text


def test_the_right_key_is_accepted_and_never_shown(secured, reference):
    body = score_cases()[0]
    r = secured.post("/v1/score", json=body, headers=AUTH)
    assert r.status_code == 200
    assert_scores(r.json()["scores"], expected_scores(reference, body))
    r = secured.get("/get_server_info", headers=AUTH)
    assert r.status_code == 200 and KEY not in r.text
    assert r.json()["auth"] is True and r.json()["server_config"]["api_key"] is None


def test_the_key_is_compared_with_compare_digest(secured, monkeypatch):
    calls = []

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert secured.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert secured.get("/v1/models", headers=AUTH).status_code == 200
    assert calls == [(b"wrong", KEY.encode()), (KEY.encode(), KEY.encode())]
    # its answer alone decides
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert secured.get("/v1/models", headers=AUTH).status_code == 401
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: True)
    assert secured.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code == 200


# -- error bodies ----------------------------------------------------------------------------


class LeakyError(Exception):
    """An exception of a module the client must not learn about."""


def leaky_text() -> str:
    """An exception text naming files of the repository and of site-packages, with a traceback."""
    return (
        f"cannot open {REPO}/api/routes.py (see {SITE_PACKAGES}/jax/_src/x.py)\n"
        "Traceback (most recent call last):\n"
        f'  File "{REPO}/engine/engine.py", line 1, in score'
    )


def assert_nothing_leaks(r) -> None:
    assert r.status_code == 500, r.text
    body = r.json()
    assert body["error"]["type"] == body["type"] == "InternalServerError"
    text = r.text
    for secret in ("Traceback", 'File "', REPO, SITE_PACKAGES, "tests.", "api.", "engine."):
        assert secret not in text, (secret, text)
    assert "/" not in body["error"]["message"]


def raising(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


def failing(name: str, error: BaseException):
    """A failure to plant: the engine's `name` raises `error`."""
    return lambda engine, monkeypatch: monkeypatch.setattr(engine, name, raising(error))


def device_fault(engine, monkeypatch) -> None:
    """The device program of `engine` raises before each batch."""
    program = FaultyProgram(engine.runner.program, raising(OSError(2, "gone", REPO)))
    monkeypatch.setattr(engine.runner, "program", program)


# how each failure is planted in the engine (undone by monkeypatch)
FAILURES = {
    "engine call": failing("outputs", RuntimeError(leaky_text())),  # under score and rerank
    "engine call, own class": failing("outputs", LeakyError(leaky_text())),
    "device step": device_fault,
    "handler": failing("stats", KeyError(SITE_PACKAGES)),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_500_bodies_show_no_traceback_paths_or_modules(secured, monkeypatch, caplog, failure):
    FAILURES[failure](secured.app.state.service.host.engine, monkeypatch)
    with caplog.at_level(logging.ERROR, logger="api"):
        if failure == "handler":
            r = secured.get("/get_server_info", headers=AUTH)
        else:
            r = secured.post("/v1/score", json=score_cases()[0], headers=AUTH)
            assert_nothing_leaks(secured.post("/v1/rerank", json=RERANK, headers=AUTH))
    assert_nothing_leaks(r)
    assert REPO in caplog.text or SITE_PACKAGES in caplog.text  # the log keeps it all
    monkeypatch.undo()
    assert secured.post("/v1/score", json=score_cases()[0], headers=AUTH).status_code == 200


# -- limits ----------------------------------------------------------------------------------


def too_large(message: str, param: str | None = None) -> dict:
    return error(message, "RequestTooLargeError", param)


def test_body_over_the_limit_is_413(secured):
    body = json.dumps({"query": "q", "items": ["x" * 70_000], "label_token_ids": [1]})
    answer = too_large(f"request body of {len(body)} bytes exceeds the limit of 65536 bytes")
    r = secured.post("/v1/score", content=body, headers=AUTH)
    assert (r.status_code, r.json()) == (413, answer)
    assert r.headers["connection"] == "close"  # the unread rest of the body ends the connection

    def chunks():  # no content-length: the limit holds while streaming
        yield body[:40_000].encode()
        yield body[40_000:].encode()

    r = secured.post("/v1/score", content=chunks(), headers=AUTH)
    assert (r.status_code, r.json()) == (413, answer)


def test_too_many_items_is_400(secured):
    body = {"query": "q", "items": ["a"] * 65, "label_token_ids": [1]}
    r = secured.post("/v1/score", json=body, headers=AUTH)
    assert r.status_code == 400
    assert r.json() == error("items: 65 items exceed the limit of 64", "BadRequestError", "items")
    for extra in ({}, {"truncate": True}, {"max_tokens_per_doc": 2}):
        body = {"query": "q", "documents": ["a"] * 65, **extra}
        r = secured.post("/v1/rerank", json=body, headers=AUTH)
        assert r.json() == error(
            "documents: 65 items exceed the limit of 64", "BadRequestError", "documents"
        )


# -- profile directory -----------------------------------------------------------------------


ESCAPES = ["/etc", "../outside", "a/../../outside", "/tmp/x", "nul\x00byte", "link", "link/sub"]


@pytest.mark.parametrize("output_dir", ESCAPES)
def test_profile_directory_stays_inside_the_root(secured, profile_root, output_dir):
    link = profile_root / "link"
    if not link.is_symlink():
        link.symlink_to(profile_root.parent, target_is_directory=True)
    r = secured.post("/start_profile", json={"output_dir": output_dir}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "output_dir"
    assert "inside the profile directory" in r.json()["error"]["message"]
    assert secured.get("/get_server_info", headers=AUTH).json()["profiling"] is None


# -- CORS ------------------------------------------------------------------------------------


@pytest.mark.parametrize("origins", ["", "http://ui.example"])
def test_cors_is_off_unless_configured(tiny_path, origins):
    app = create_app(settings_from_env(tiny_env(tiny_path, SCORING_CORS_ORIGINS=origins)))
    client = TestClient(app)  # no lifespan: CORS answers without the engine
    r = client.options(
        "/v1/score",
        headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"},
    )
    if origins:
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://ui.example"
    else:
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


# -- concurrency -----------------------------------------------------------------------------


def test_defaults_admit_512_requests_in_flight(secured, reference):
    assert EngineConfig().max_queued_requests >= BURST
    assert settings_from_env({}).engine.max_queued_requests >= BURST
    bodies = [
        {"query": [1 + i % 300], "items": [[7], [8 + i % 5]], "label_token_ids": [YES]}
        for i in range(BURST)
    ]
    headers = [(b"authorization", f"Bearer {KEY}".encode())]

    async def burst():
        answers = [None] * BURST

        async def one(i):
            answers[i] = await asgi_post(secured.app, "/v1/score", bodies[i], headers=headers)

        async with anyio.create_task_group() as tasks:
            for i in range(BURST):
                tasks.start_soon(one, i)
        return answers

    answers = secured.portal.call(burst)
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * BURST, {s: statuses.count(s) for s in set(statuses)}
    for i in (0, 1, 255, 511):
        assert_scores(json.loads(answers[i][2])["scores"], expected_scores(reference, bodies[i]))
