"""Faults over real HTTP: a device step that fails, clients that leave, a full queue, SIGTERM
under load and while compiling.

The first three run hypercorn's `serve()` in a thread of this process (asyncio and trio workers),
so a test can reach the engine: wrap its device program in a faulty one, and wait in the server's
loop for the engine to be idle. The shutdown tests run `hypercorn api.app:app` as a subprocess
and signal it."""

import functools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import hypercorn.asyncio
import hypercorn.trio
import numpy as np
import pytest
from anyio.from_thread import BlockingPortal
from hypercorn.config import Config

from api.app import create_app
from api.bridge import EngineHost
from api.settings import settings_from_env
from bench.soak import serving_pid
from bench.w3 import parse_metrics
from engine import Engine
from tests.test_api_support import (
    NO,
    YES,
    assert_scores,
    device_faults,
    error_body,
    expected_scores,
    free_port,
    hypercorn_server,
    launch,
    score_cases,
    settled,
    stop,
    tiny_env,
    wait_until,
)

WORKERS = ["asyncio", "trio"]
LIMIT = 8  # SCORING_MAX_QUEUED_REQUESTS of the in-process servers
MARK = 256  # request i's query starts with token MARK + i; every other token id is below MARK
# --graceful-timeout of the SIGTERM test, seconds: far longer than the drain, so an exit that
# waited for it cannot pass for one that followed the last answer (EXIT_S after it, at most)
GRACE = 120
EXIT_S = 30  # a loaded machine's process teardown, with room; the grace period is 4x it
LEFT_499 = 'scoring_http_requests_total{route="/v1/score",status="499"}'


@dataclass
class InProcess:
    url: str
    engine: Engine
    host: EngineHost  # the app's: call it in the server's loop, through `portal`
    portal: BlockingPortal

    def settle(self) -> None:
        """Return once the engine is idle: every request answered and its work gone."""
        self.portal.call(settled, self.host)


def healthy(url: str) -> bool:
    try:
        return httpx2.get(f"{url}/health", timeout=2).status_code == 200
    except httpx2.TransportError:
        return False


@contextmanager
def serve_in_thread(app, worker: str) -> Iterator[tuple[str, BlockingPortal]]:
    """`app` under hypercorn's `serve()` with `worker`, in a thread, on a free port of
    127.0.0.1: its URL once healthy, and a portal into the server's loop. Shut down gracefully
    on exit."""
    config = Config()
    config.bind = [f"127.0.0.1:{free_port()}"]
    config.backlog = 1024
    serve = hypercorn.trio.serve if worker == "trio" else hypercorn.asyncio.serve
    with anyio.from_thread.start_blocking_portal(worker) as portal:
        stop = portal.call(anyio.Event)
        served = portal.start_task_soon(
            functools.partial(serve, app, config, shutdown_trigger=stop.wait)
        )
        try:
            url = f"http://{config.bind[0]}"
            assert wait_until(lambda: healthy(url))
            yield url, portal
        finally:
            portal.call(stop.set)
            served.result(timeout=60)


@pytest.fixture(scope="module", params=WORKERS)
def server(request, tiny_path) -> Iterator[InProcess]:
    env = tiny_env(tiny_path, SCORING_MAX_QUEUED_REQUESTS=str(LIMIT), SCORING_RETRY_AFTER_S="3")
    app = create_app(settings_from_env(env))
    with serve_in_thread(app, request.param) as (url, portal):
        host = app.state.service.host
        yield InProcess(url, host.engine, host, portal)


def below_mark(rng, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, MARK, n)]


def marked(rng, i: int, items: int = 6, length: int = 30) -> dict:
    """A request whose query starts with its own marker token, MARK + i."""
    return {
        "query": [MARK + i, *below_mark(rng, 10)],
        "items": [below_mark(rng, length) for _ in range(items)],
        "label_token_ids": [YES, NO],
    }


async def post_all(url: str, bodies: list[dict]) -> list[httpx2.Response]:
    """Every body posted to /v1/score at once, each on its own connection."""
    answers: list = [None] * len(bodies)
    limits = httpx2.Limits(max_connections=len(bodies))
    async with httpx2.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(i: int) -> None:
            answers[i] = await client.post("/v1/score", json=bodies[i])

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tasks:
                for i in range(len(bodies)):
                    tasks.start_soon(one, i)
    return answers


def stats(url: str) -> dict:
    return httpx2.get(f"{url}/get_server_info", timeout=60).json()["stats"]


error = error_body


# -- a failing device step -------------------------------------------------------------------


def test_a_failing_device_step_fails_only_its_batch(server, reference):
    rng = np.random.default_rng(11)
    bodies = [marked(rng, i) for i in range(LIMIT)]  # ~190 tokens each: 2-3 to a batch
    poison, failed, batches = MARK + 3, set(), []

    def fault(inputs) -> None:
        marks = {int(t) for t in np.unique(inputs.tokens) if t >= MARK}
        batches.append(marks)
        if poison in marks:
            failed.update(marks)
            raise RuntimeError("injected device fault")

    before = server.engine.stats().failed_batches
    with device_faults(server.engine, fault):
        answers = anyio.run(post_all, server.url, bodies)
    assert poison in failed and len(failed) < LIMIT  # some requests ran in other batches
    for i, (answer, body) in enumerate(zip(answers, bodies, strict=True)):
        if MARK + i in failed:
            assert (answer.status_code, answer.json()) == (
                500,
                error(
                    "engine failure: device step failed: RuntimeError: injected device fault",
                    "InternalServerError",
                ),
            )
        else:
            assert answer.status_code == 200, answer.text
            assert_scores(answer.json()["scores"], expected_scores(reference, body))
    failures = sum(poison in marks for marks in batches)
    assert server.engine.stats().failed_batches - before == failures >= 1
    server.settle()
    again = httpx2.post(f"{server.url}/v1/score", json=bodies[3], timeout=60)
    assert again.status_code == 200  # the server keeps serving, the same request included
    assert_scores(again.json()["scores"], expected_scores(reference, bodies[3]))


# -- clients that leave ----------------------------------------------------------------------


def left(url: str) -> float:
    return parse_metrics(httpx2.get(f"{url}/metrics", timeout=60).text).get(LEFT_499, 0.0)


async def until(condition, timeout: float = 120.0) -> None:
    """Return once `condition()` holds: a bounded wait on what the server shows."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


@pytest.mark.parametrize("leaving", [1, 4])
def test_clients_that_leave_have_their_work_dropped(server, reference, leaving):
    rng = np.random.default_rng(5)
    heavy = [marked(rng, i, items=4000, length=100) for i in range(leaving)]
    staying = score_cases()[:2]
    needed = leaving * 4000 * 110 // 512  # batches the leaving requests would take
    batches, left_before = stats(server.url)["batches"], left(server.url)
    release = threading.Event()  # the device runs no batch until the clients have left

    def held() -> int:  # requests the engine holds
        return server.engine.stats().in_flight

    async def main() -> list[httpx2.Response]:
        answers: list = [None] * len(staying)
        goodbyes = [anyio.CancelScope() for _ in heavy]
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:

            async def leave(body: dict, goodbye: anyio.CancelScope) -> None:
                with goodbye:  # cancelled: the client closes its connection
                    await client.post("/v1/score", content=json.dumps(body))
                assert goodbye.cancelled_caught

            async def stay(i: int) -> None:
                answers[i] = await client.post("/v1/score", json=staying[i])

            def queued() -> int:  # requests the engine holds or has answered
                return held() + sum(answer is not None for answer in answers)

            async with anyio.create_task_group() as tasks:
                for body, goodbye in zip(heavy, goodbyes, strict=True):
                    tasks.start_soon(leave, body, goodbye)
                await until(lambda: queued() == leaving)
                for i in range(len(staying)):
                    tasks.start_soon(stay, i)
                await until(lambda: queued() == leaving + len(staying))  # behind the leaving
                for goodbye in goodbyes:
                    goodbye.cancel()
                await until(lambda: left(server.url) - left_before == leaving)  # each a 499
                release.set()
        return answers

    with device_faults(server.engine, lambda inputs: release.wait(120)):
        try:
            answers = anyio.run(main)
        finally:
            release.set()
    for answer, body in zip(answers, staying, strict=True):
        assert answer.status_code == 200, answer.text
        assert_scores(answer.json()["scores"], expected_scores(reference, body))
    server.settle()
    # what ran: the batch held when they left (and one more the scheduler may have handed over),
    # and the staying requests' own
    ran = stats(server.url)["batches"] - batches  # measured 3, of the 859-3,437 needed
    assert ran <= 2 + len(staying) < needed


# -- a full queue ----------------------------------------------------------------------------


def test_a_full_queue_is_503_with_retry_after_then_recovers(server, reference):
    rng = np.random.default_rng(3)
    distinct = [marked(rng, i, items=64, length=100) for i in range(4)]
    expected = [expected_scores(reference, body) for body in distinct]
    flood = held_flood(server, [distinct[i % 4] for i in range(48)])
    statuses = [answer.status_code for answer in flood]
    # the device held: the first LIMIT requests wait in the engine, every other one is refused
    assert statuses.count(200) == LIMIT and statuses.count(503) == 48 - LIMIT, statuses
    for i, answer in enumerate(flood):
        if answer.status_code == 503:
            assert answer.headers["retry-after"] == "3"
            assert answer.json() == error(
                f"{LIMIT} requests in flight (limit {LIMIT})", "ServiceUnavailableError"
            )
        else:
            assert_scores(answer.json()["scores"], expected[i % 4])
    server.settle()
    after = anyio.run(post_all, server.url, [distinct[i % 4] for i in range(LIMIT)])
    for i, answer in enumerate(after):
        assert answer.status_code == 200, answer.text
        assert_scores(answer.json()["scores"], expected[i % 4])


def held_flood(server: InProcess, bodies: list[dict]) -> list[httpx2.Response]:
    """Every body posted at once, each on its own connection, while the device program is held:
    it is released once every request the engine could not take has been answered."""
    release = threading.Event()
    limits = httpx2.Limits(max_connections=len(bodies))
    answers: list = [None] * len(bodies)

    async def main() -> None:
        async with httpx2.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:

            async def post(i: int) -> None:
                answers[i] = await client.post("/v1/score", json=bodies[i])

            async with anyio.create_task_group() as tasks:
                for i in range(len(bodies)):
                    tasks.start_soon(post, i)
                await until(lambda: sum(a is not None for a in answers) == len(bodies) - LIMIT)
                release.set()

    with device_faults(server.engine, lambda inputs: release.wait(120)):
        try:
            anyio.run(main)
        finally:
            release.set()
    return answers


# -- SIGTERM ---------------------------------------------------------------------------------


async def accepted(url: str, answers: list) -> int:
    """Requests the server holds or has answered."""
    held = (await anyio.to_thread.run_sync(stats, url))["in_flight"]
    return held + sum(answer is not None for answer in answers)


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port` (Linux: /proc). Hypercorn's
    main process keeps its own copy of the socket: only the worker's tells that it accepts."""
    listeners = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        _, local, _, state, *_, inode = line.split()[:10]
        if local.endswith(f":{port:04X}") and state == "0A":  # 0A: LISTEN
            listeners.add(f"socket:[{inode}]")
    return any(_link(fd) in listeners for fd in Path(f"/proc/{pid}/fd").iterdir())


def _link(fd: Path) -> str | None:
    try:
        return os.readlink(fd)
    except FileNotFoundError:  # closed meanwhile
        return None


async def sigterm_under_load(server, bodies: list[dict]) -> dict:
    """Post every body at once, SIGTERM the server once all are accepted and before they are
    answered, then try a new connection; the answers and when things happened."""
    answers: list = [None] * len(bodies)
    answered_at: list = [None] * len(bodies)
    limits = httpx2.Limits(max_connections=len(bodies))
    async with httpx2.AsyncClient(base_url=server.url, limits=limits, timeout=60) as client:

        async def one(i: int) -> None:
            answers[i] = await client.post("/v1/score", json=bodies[i])
            answered_at[i] = time.monotonic()

        async with anyio.create_task_group() as tasks:
            for i in range(len(bodies)):
                tasks.start_soon(one, i)
            with anyio.fail_after(120):
                while await accepted(server.url, answers) < len(bodies):
                    await anyio.sleep(0.01)
            worker, port = serving_pid(server.pid), int(server.url.rpartition(":")[2])
            assert listening(worker, port)
            signalled_at = time.monotonic()
            os.kill(server.pid, signal.SIGTERM)
            await until(lambda: not listening(worker, port))  # the worker stopped accepting
            async with httpx2.AsyncClient(base_url=server.url, timeout=GRACE + 5) as late:
                with pytest.raises(httpx2.TransportError):
                    await late.post("/v1/score", json=bodies[0])
    code = await anyio.to_thread.run_sync(server.process.wait, GRACE + 5)
    exited_at = time.monotonic()
    return {
        "answers": answers,
        "answered_after_signal": sum(t > signalled_at for t in answered_at),
        "last_answer_s": max(answered_at) - signalled_at,
        "exit": code,
        "exit_s": exited_at - signalled_at,
    }


@pytest.mark.parametrize("worker", WORKERS)
def test_sigterm_drains_the_requests_in_flight_and_exits_0(worker, tiny_path, reference, tmp_path):
    rng = np.random.default_rng(17)
    distinct = [marked(rng, i, items=100, length=60) for i in range(4)]
    expected = [expected_scores(reference, body) for body in distinct]
    bodies = [distinct[i % 4] for i in range(16)]
    log = tmp_path / "hypercorn.log"
    args = ("--graceful-timeout", str(GRACE))
    with hypercorn_server(worker, tiny_env(tiny_path), log, *args) as server:
        result = anyio.run(sigterm_under_load, server, bodies)
    assert result["answered_after_signal"] > 0  # the signal came with requests in flight
    for i, answer in enumerate(result["answers"]):
        assert answer.status_code == 200, answer.text
        assert_scores(answer.json()["scores"], expected[i % 4])
    # exits once the work is done, not when the grace period runs out
    assert result["exit"] == 0 and result["exit_s"] < result["last_answer_s"] + EXIT_S < GRACE
    assert "engine shutting down" in log.read_text()


@pytest.mark.parametrize("worker", WORKERS)
def test_sigterm_while_compiling_exits_at_once(worker, tiny_path, tmp_path):
    # a budget of 4096 tokens makes a grid of 12 programs, each compiled in a second or more
    env = tiny_env(
        tiny_path, SCORING_PRECOMPILE="1", SCORING_PROGRESS="1", SCORING_TOKEN_BUDGET="4096"
    )
    log = tmp_path / "hypercorn.log"
    process, _ = launch(worker, env, log)
    try:
        assert wait_until(lambda: compiled(log) is not None)
        at_signal, programs = compiled(log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0  # a bound on a hang only: the count tells speed
    finally:
        stop(process)
    # at most the program being compiled, and one the log had not shown yet, finish after the
    # signal: the rest of the grid is dropped (counted, not timed, so a loaded machine passes)
    at_exit, _ = compiled(log)
    assert at_exit <= at_signal + 2 < programs, (at_signal, at_exit, programs)


def compiled(log: Path) -> tuple[int, int] | None:
    """The grid compile's last progress in a server's log: (programs compiled, programs)."""
    counts = re.findall(r"compiling:[^\r\n]*?(\d+)/(\d+)", log.read_text(errors="replace"))
    return tuple(map(int, counts[-1])) if counts else None
