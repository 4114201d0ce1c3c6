"""Shared by the HTTP tests (no tests here): the tiny model's settings, request cases, their
reference answers, a raw ASGI caller for what TestClient cannot do (disconnects, bursts), and
a real hypercorn server in a subprocess."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import numpy as np
import pytest
import trio
from starlette.testclient import TestClient

from api.errors import TYPES
from bench.soak import process_sample, serving_pid
from engine import Engine, EngineConfig, RerankResult, open_engine
from tests.conftest import inject_faults

ROOT = Path(__file__).resolve().parents[1]
HELD_START = Path(__file__).resolve().parent / "held_start"  # see its sitecustomize

YES, NO = 264, 265  # " yes" and " no" in the tiny tokenizer

BASE_ENV = {
    "SCORING_DTYPE": "float32",
    "SCORING_TOKEN_BUDGET": "512",
    "SCORING_PRECOMPILE": "0",
    "SCORING_COMPILE_CACHE_DIR": "",
    "SCORING_PROGRESS": "0",
}


def tiny_env(path, **extra: str) -> dict[str, str]:
    """Environment variables for a small, fast service on the tiny checkpoint."""
    return {"SCORING_MODEL": str(path), **BASE_ENV, **extra}


def ids(rng, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 384, n)]


def score_cases() -> list[dict]:
    """`/v1/score` bodies: text and ids, softmax, item_first, a single item, a shared prefix."""
    rng = np.random.default_rng(7)
    query = "Is the river near the house? Answer:"
    items = [" yes it is", " the stone is green", " no", " 東京 🙂"]
    return [
        {"query": query, "items": items, "label_token_ids": [YES, NO]},
        {"query": query, "items": items, "label_token_ids": [YES, NO], "apply_softmax": True},
        {"query": query, "items": items, "label_token_ids": [NO], "item_first": True},
        {"query": " a kitten", "items": " sleeps.", "label_token_ids": [YES, NO, 3]},
        {"query": ids(rng, 30), "items": [ids(rng, n) for n in (1, 5, 17)], "label_token_ids": [7]},
        {
            "query": ids(rng, 60),
            "items": [ids(rng, 8) for _ in range(40)],
            "label_token_ids": [1, 2, 3, 4],
            "apply_softmax": True,
            "model": "anything",
        },
    ]


def expected_scores(reference, body: dict) -> list[list[float]]:
    return reference.score(
        body["query"],
        body["items"],
        body["label_token_ids"],
        apply_softmax=body.get("apply_softmax", False),
        item_first=body.get("item_first", False),
    )


def assert_scores(got, want) -> None:
    """Equal to the one-by-one reference in f32 (log space: scores can be tiny)."""
    np.testing.assert_allclose(np.log(got), np.log(want), atol=1e-5, rtol=0)


DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and 2024-11-22, 3.14159.",
    "def score(query, items):\n    return [len(q) for q in items]\n",
    "Relevant? yes. Relevant? no. Answer: yes no yes no.",
]


def rerank_cases() -> list[tuple[str, dict, tuple]]:
    """(path, body, (query, documents, top_n, instruction, tokens per document or None))."""
    query = "Where does the fox jump?"
    return [
        ("/v1/rerank", {"query": query, "documents": DOCS}, (query, DOCS, None, None, None)),
        (
            "/v1/rerank",
            {
                "query": query,
                "documents": [{"text": d} for d in DOCS],
                "top_n": 2,
                "return_documents": True,
                "instruction": "Find code",
                "model": "rerank-english-v3.0",
            },
            (query, DOCS, 2, "Find code", None),
        ),
        (
            "/rerank",
            {"query": "yes", "texts": DOCS[:3], "return_text": True},
            ("yes", DOCS[:3], None, None, None),
        ),
        (
            "/rerank",
            {"query": query, "documents": DOCS, "max_tokens_per_doc": 5},
            (query, DOCS, None, None, 5),
        ),
    ]


def tiny_config(path) -> EngineConfig:
    """An in-process engine like the service of `tiny_env`: f32, small budget, no precompile."""
    return EngineConfig(
        model=str(path),
        dtype="float32",
        token_budget=512,
        compile_cache_dir=None,
        progress=False,
        precompile=False,
    )


def on_engine(path, calls):
    """`calls(engine)`'s answer on an in-process engine of `path` (`tiny_config`)."""

    async def main():
        async with open_engine(tiny_config(path)) as engine:
            return await calls(engine)

    return trio.run(main)


def rerank_references(path) -> list[RerankResult]:
    """`Engine.rerank` on each case, from an engine of its own; documents over a token limit
    are cut to their first tokens (decoded) first."""
    config = tiny_config(path)

    async def main():
        async with open_engine(config) as engine:
            tok = engine.tokenizer
            results = []
            for _, _, (q, docs, top_n, instruction, n) in rerank_cases():
                if n is not None:
                    docs = [
                        tok.decode(tok.encode(d, add_special_tokens=False).ids[:n]) for d in docs
                    ]
                results.append(await engine.rerank(q, docs, top_n=top_n, instruction=instruction))
            return results

    return trio.run(main)


def assert_rerank(body, request: dict, expected: RerankResult, documents: list[str]) -> None:
    """The HTTP answer is `Engine.rerank`'s order and scores, with documents echoed unless told
    not to (TEI's bare list: only when asked)."""
    if isinstance(body, list):  # TEI's answer to `texts`
        assert [r["index"] for r in body] == [h.index for h in expected.results]
        scores = [r["score"] for r in body]
        echo = request.get("return_text", False)
        assert all(r.get("text") == (documents[r["index"]] if echo else None) for r in body)
        assert all(set(r) <= {"index", "score", "text"} for r in body)
    else:
        assert [r["index"] for r in body["results"]] == [h.index for h in expected.results]
        scores = [r["relevance_score"] for r in body["results"]]
        echo = request.get("return_documents", True)
        for r in body["results"]:
            assert r.get("document") == ({"text": documents[r["index"]]} if echo else None)
        _assert_usage(body, expected)
    np.testing.assert_allclose(scores, [h.relevance_score for h in expected.results], rtol=1e-5)


def _assert_usage(body: dict, expected: RerankResult) -> None:
    cached = body["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert 0 <= cached < expected.prompt_tokens  # what earlier requests cached
    assert body["usage"] == {
        "prompt_tokens": expected.prompt_tokens,
        "total_tokens": expected.prompt_tokens,
    }
    assert body["meta"]["tokens"] == {"input_tokens": expected.prompt_tokens, "output_tokens": 0}
    assert body["meta"]["billed_units"] == {"search_units": 1}
    assert len(body["id"]) == 32


def error_body(message: str, type: str, param: str | None = None) -> dict:
    """An error answer's body: OpenAI's `error` object, SGLang's flat fields beside it, and
    Voyage's `detail`."""
    fields = {"message": message, "type": type, "param": param, "code": STATUS_OF[type]}
    return {"error": fields, "object": "error", **fields, "detail": message}


STATUS_OF = {kind: status for status, kind in TYPES.items()}


def tables_empty(engine) -> bool:
    """Nothing of any request is left in the engine (see tests/test_engine.py)."""
    return engine.idle() and engine.scheduler.queued_tokens == 0


def wait_until(condition, timeout: float = 120.0) -> bool:
    """Whether `condition()` holds within `timeout` seconds: a bounded wait on something only
    an observer can see (a server's answers, a log line, a process). Polls back off to 0.1 s so
    that a loaded machine spends its time on the server, not on asking."""
    deadline, pause = time.monotonic() + timeout, 0.005
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.1)
    return True


async def settled(host, timeout: float = 120.0) -> None:
    """Return once the engine of `host` (an `api.bridge.EngineHost`) is idle: every request
    answered and its work gone (`Engine.wait_idle`). Runs in the loop of the host's server."""
    with anyio.fail_after(timeout):
        await host.call(Engine.wait_idle)


@contextlib.contextmanager
def device_faults(engine, fault) -> Iterator[None]:
    """`fault(inputs)` runs before each batch of `engine` reaches the device, and may raise to
    fail that batch (`tests.conftest.inject_faults`); the engine's own program is back on exit."""
    faulty = inject_faults(engine, fault)
    try:
        yield
    finally:
        engine.runner.program = faulty.program


async def asgi_post(app, path: str, body: dict | bytes, *, disconnect=None, headers=()):
    """POST through the raw ASGI interface: (status, headers, body). With `disconnect` (an
    anyio.Event), the client goes away when it is set."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    pending = [{"type": "http.request", "body": data, "more_body": False}]
    finished = anyio.Event()
    sent = []

    async def receive():
        if pending:
            return pending.pop()
        await (disconnect or finished).wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "state": {},
    }
    await app(scope, receive, send)
    finished.set()
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def serving(app, backend: str):
    """A TestClient running `app` (lifespan included) once its engine is ready."""
    with TestClient(app, backend=backend) as client:
        assert wait_until(lambda: client.get("/health").status_code == 200)
        yield client


@dataclass
class Server:
    worker: str
    url: str
    log: Path
    saw_503: bool  # /health answered 503 before it answered 200
    pid: int  # the hypercorn process (its worker is a child of it)
    process: subprocess.Popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float) -> bool:
    """Wait until /health answers 200; whether a 503 came first. Fails if the process dies."""
    seen: set[int | None] = set()

    def healthy() -> bool:
        seen.add(_health(url, process, log))
        return 200 in seen

    if not wait_until(healthy, timeout):
        pytest.fail(f"/health not 200 after {timeout} s:\n{log.read_text()}")
    return 503 in seen


def launch(worker: str, env: dict[str, str], log: Path, *args: str):
    """Start `hypercorn api.app:app [args]` with `worker` on a free port of 127.0.0.1, configured
    by `env` (instead of this process's `SCORING_*` variables): (process, URL), not yet ready."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("SCORING_")}
    full |= env | {"JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "hypercorn", "api.app:app"]
    command += ["--bind", f"127.0.0.1:{port}", "--backlog", "1024", "-k", worker, *args]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT
        )
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def hypercorn_server(worker: str, env: dict[str, str], log: Path, *args: str) -> Iterator[Server]:
    """A `launch`ed server, healthy before it is yielded; stopped on exit."""
    process, url = launch(worker, env, log, *args)
    try:
        yield Server(worker, url, log, wait_healthy(url, process, log, 120), process.pid, process)
    finally:
        stop(process)


@contextlib.contextmanager
def held_start_server(worker: str, env: dict[str, str], log: Path) -> Iterator[Server]:
    """A `hypercorn_server` whose engine start-up is held (`tests/held_start`) until its
    /health has answered 503, then let go: `saw_503` holds whatever the machine's speed."""
    gate = log.with_suffix(".gate")
    path = os.pathsep.join(filter(None, [str(HELD_START), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = env | {"HELD_START_GATE": str(gate), "PYTHONPATH": path}
    process, url = launch(worker, env, log)
    try:
        starting = lambda: _health(url, process, log) == 503
        if not wait_until(starting, 120):
            pytest.fail(f"/health never answered 503 while the start was held:\n{log.read_text()}")
        gate.touch()
        yield Server(worker, url, log, wait_healthy(url, process, log, 120), process.pid, process)
    finally:
        stop(process)


def _health(url: str, process: subprocess.Popen, log: Path) -> int | None:
    """/health's status (None: not listening yet); fails the test if the server died."""
    if process.poll() is not None:
        pytest.fail(f"hypercorn exited with {process.returncode}:\n{log.read_text()}")
    with contextlib.suppress(httpx2.TransportError):
        return httpx2.get(f"{url}/health", timeout=2).status_code
    return None


def worker_rss_kib(server: Server) -> int:
    """VmRSS of the hypercorn worker process (the child that serves), in KiB."""
    # the worker, not multiprocessing's resource tracker (also a child)
    return round(process_sample(serving_pid(server.pid))["rss_mib"] * 1024)
