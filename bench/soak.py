"""Soak: many closed-loop clients post mixed `/v1/score` and `/v1/rerank` requests over HTTP for
a fixed time; every answer is checked and the serving process's memory and descriptors watched.

    python -m bench soak [--clients 256] [--seconds 60] [--url URL [--pid PID] | --model PATH]

Without `--url` it starts `hypercorn api.app:app` on 127.0.0.1 (as `bench w3` does: bucket grid
compiled at start, tokenizer cache off) on `--model`, the default model unless given. The pool is
`--pool` distinct bodies: 1-32 items (log-uniform), queries of `--query-tokens` (5-60) and items
of 3-80 tokens,
as text or token ids, score (with and without softmax, item_first) and rerank (top_n,
return_documents). Their expected answers come from an in-process engine with the server's own
configuration (read from `/get_server_info`), each body scored once. A warm-up phase at full
concurrency (`--warmup` seconds) precedes the measured one (`--seconds`); clients stop issuing
at the deadline and requests in flight then are awaited (each up to `--timeout` seconds).

Per phase: sent, answered (200), correct (a 200 whose scores equal the reference within
`--tolerance` in log space; rerank also in order, top_n and echoed documents), errors by status
or exception, lost = sent - answered - errors (requests cut off by the hard stop; must be 0).
The serving process (hypercorn's worker, or `--pid`) is sampled from /proc after the warm-up
and at the end, each time after the clients' connections have closed and the descriptor count
has settled: VmRSS, VmHWM and open file descriptors, plus the peak VmRSS sampled every 0.5 s
during the run.
"""

import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import anyio
import httpx2
import msgspec
import numpy as np
import trio

from bench import common
from bench.parity import TOLERANCE, label_ids
from bench.w3 import Server
from bench.workloads import text_of_tokens
from engine import EngineConfig, default_model_path, open_engine

WARMUP_ROUNDS = 10
# seconds for /get_server_info while the server may be busy compiling: httpx's default 5 s is
# too short on a loaded machine
INFO_TIMEOUT = 60.0
QUICK = dict(clients=16, seconds=3.0, warmup=1.0, pool=16)


class Request(NamedTuple):
    path: str
    body: dict
    payload: bytes
    items: int


def item_count(rng: np.random.Generator) -> int:
    """1 to 32, log-uniform: many small requests and some large ones."""
    return min(32, int(np.exp(rng.uniform(0, np.log(33)))))


def token_ids(rng: np.random.Generator, vocab: int, low: int, high: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, int(rng.integers(low, high + 1)))]


def text(rng: np.random.Generator, tokenizer, low: int, high: int) -> str:
    return text_of_tokens(rng, tokenizer, int(rng.integers(low, high + 1)))


def score_body(rng: np.random.Generator, tokenizer, vocab: int, labels: list[int], query) -> dict:
    n = item_count(rng)
    if rng.random() < 0.3:
        query = token_ids(rng, vocab, *query)
        items = [token_ids(rng, vocab, 3, 80) for _ in range(n)]
    else:
        query = text(rng, tokenizer, *query)
        items = [text(rng, tokenizer, 3, 80) for _ in range(n)]
    return {
        "query": query,
        "items": items,
        "label_token_ids": labels,
        "apply_softmax": bool(rng.random() < 0.5),
        "item_first": bool(rng.random() < 0.2),
    }


def rerank_body(rng: np.random.Generator, tokenizer, query) -> dict:
    n = item_count(rng)
    body = {
        "query": text(rng, tokenizer, *query),
        "documents": [text(rng, tokenizer, 3, 80) for _ in range(n)],
        "return_documents": bool(rng.random() < 0.5),
    }
    if rng.random() < 0.5:
        body["top_n"] = int(rng.integers(1, n + 1))
    return body


def request_pool(
    tokenizer, vocab: int, count: int, seed: int, query: tuple[int, int] = (5, 60)
) -> list[Request]:
    """`count` distinct requests: three in four scores, one in four reranks; queries of
    `query` tokens (fewest, most)."""
    rng = np.random.default_rng(seed)
    labels = label_ids(tokenizer)
    out = []
    for i in range(count):
        if i % 4 == 3:
            path, body = "/v1/rerank", rerank_body(rng, tokenizer, query)
        else:
            path, body = "/v1/score", score_body(rng, tokenizer, vocab, labels, query)
        n = len(body.get("items") or body["documents"])
        out.append(Request(path, body, json.dumps(body).encode(), n))
    return out


async def _expected(engine, request: Request) -> list:
    """The reference answer: scores per item (score), relevance per document index (rerank)."""
    b = request.body
    if request.path == "/v1/score":
        result = await engine.score(
            b["query"],
            b["items"],
            b["label_token_ids"],
            apply_softmax=b["apply_softmax"],
            item_first=b["item_first"],
        )
        return result.scores
    relevance = [0.0] * request.items
    for hit in (await engine.rerank(b["query"], b["documents"])).results:
        relevance[hit.index] = hit.relevance_score
    return relevance


async def references(config: EngineConfig, count: int, seed: int, query: tuple[int, int]):
    """(requests, expected answers, model config) from an in-process engine of `config`."""
    async with open_engine(config) as engine:
        model_config = engine.model_config
        requests = request_pool(engine.tokenizer, model_config.vocab_size, count, seed, query)
        expected: list = [None] * count

        async def one(i: int) -> None:
            expected[i] = await _expected(engine, requests[i])

        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(one, i)
    return requests, expected, model_config


def _log_gap(got, want) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(np.log(np.asarray(got, np.float64)) - np.log(np.asarray(want, np.float64)))
    return float(np.max(np.nan_to_num(gap, nan=np.inf, posinf=np.inf), initial=0.0))


def deviation(request: Request, want: list, answer: dict) -> float:
    """Largest |log got - log reference| of an answer; inf when its shape or order is wrong."""
    if request.path == "/v1/score":
        got = answer["scores"]
        shape_ok = np.shape(got) == np.shape(want)
        return _log_gap(got, want) if shape_ok else np.inf
    results = answer["results"]
    n, top_n = request.items, request.body.get("top_n") or request.items
    index = [r["index"] for r in results]
    got = [r["relevance_score"] for r in results]
    echo = request.body["return_documents"]
    documents = [r.get("document") for r in results]
    if len(set(index)) != min(top_n, n) or got != sorted(got, reverse=True):
        return np.inf
    if documents != [{"text": request.body["documents"][i]} if echo else None for i in index]:
        return np.inf
    kept = [want[i] for i in index]
    left_out = [w for i, w in enumerate(want) if i not in set(index)]
    # a left-out document may beat a kept one only in a near tie
    overtaken = _log_gap([max(left_out)], [min(kept)]) if left_out else 0.0
    if not left_out or max(left_out) <= min(kept):
        overtaken = 0.0
    return max(_log_gap(got, kept), overtaken)


@dataclass
class Tally:
    """What one phase of load did."""

    sent: int = 0
    answered: int = 0
    correct: int = 0
    items: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    max_deviation: float = 0.0

    def record(self, status: int | str, seconds: float, request: Request, gap: float, tol):
        if status != 200:
            self.errors[str(status)] += 1
            return
        self.answered += 1
        self.items += request.items
        self.latencies.append(seconds)
        self.max_deviation = max(self.max_deviation, gap)
        self.correct += gap <= tol

    def report(self, wall: float) -> dict:
        ms = np.array(self.latencies or [np.nan]) * 1e3
        errors = sum(self.errors.values())
        return {
            "sent": self.sent,
            "answered": self.answered,
            "correct": self.correct,
            "errors": errors,
            "errors_by_kind": dict(self.errors),
            "errors_5xx": sum(v for k, v in self.errors.items() if k.isdigit() and int(k) >= 500),
            "lost": self.sent - self.answered - errors,
            "wall_s": wall,
            "requests_per_s": self.answered / wall,
            "items_per_s": self.items / wall,
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_log_deviation": self.max_deviation,
        }


async def closed_loop(url: str, requests, expected, args, seconds: float) -> dict:
    """`args.clients` closed-loop clients for `seconds`; the phase's report."""
    tally = Tally()
    limits = httpx2.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    headers = {"content-type": "application/json"}
    start = time.perf_counter()
    deadline = start + seconds

    async def client(http: httpx2.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            i = tally.sent % len(requests)
            tally.sent += 1
            request, t0 = requests[i], time.perf_counter()
            try:
                r = await http.post(request.path, content=request.payload, headers=headers)
                status, gap = r.status_code, np.inf
                if status == 200:
                    gap = deviation(request, expected[i], r.json())
            except httpx2.HTTPError as e:
                status, gap = type(e).__name__, np.inf
            tally.record(status, time.perf_counter() - t0, request, gap, args.tolerance)

    async with httpx2.AsyncClient(base_url=url, limits=limits, timeout=args.timeout) as http:
        with anyio.move_on_after(seconds + args.timeout + 30):  # hard stop
            async with anyio.create_task_group() as tasks:
                for _ in range(args.clients):
                    tasks.start_soon(client, http)
    return tally.report(time.perf_counter() - start)


def serving_pid(pid: int) -> int:
    """The process that serves: hypercorn's spawned worker child of `pid`, else `pid` itself."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    return pid


def process_sample(pid: int) -> dict:
    """VmRSS and VmHWM (MiB) and open file descriptors of process `pid`."""
    kib = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            kib[name] = int(value.split()[0])
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return {"rss_mib": kib["VmRSS"] / 1024, "hwm_mib": kib["VmHWM"] / 1024, "fds": fds}


async def sample_peak(pid: int, peak: list[float]) -> None:
    while True:
        peak[0] = max(peak[0], process_sample(pid)["rss_mib"])
        await anyio.sleep(0.5)


async def until_idle(url: str, timeout: float = 120.0) -> None:
    """Wait until the server holds no request (nothing in flight or queued): what is sampled
    then is what the server keeps, not the work of the clients that just stopped."""
    async with httpx2.AsyncClient(base_url=url, timeout=INFO_TIMEOUT) as http:
        with anyio.fail_after(timeout):
            while True:
                stats = (await http.get("/get_server_info")).json()["stats"]
                if stats["in_flight"] == 0 and stats["queue_depth"] == 0:
                    return
                await anyio.sleep(0.05)


async def warm_up(url: str, requests, expected, args) -> dict:
    """Warm-up phases of `args.warmup` s until one compiles no new program (at most
    `WARMUP_ROUNDS`), the server idle after it; the last phase's report. A loaded machine's first
    phase may not reach every batch shape, and a program compiled in the measured run would read
    as memory growth."""

    async def compiles() -> int:
        await until_idle(url)
        async with httpx2.AsyncClient(base_url=url, timeout=INFO_TIMEOUT) as http:
            return (await http.get("/get_server_info")).json()["stats"]["compiles"]

    seen = await compiles()
    for _ in range(WARMUP_ROUNDS):
        report = await closed_loop(url, requests, expected, args, args.warmup)
        now = await compiles()
        if now == seen:
            break
        seen = now
    return report


async def settled_sample(pid: int, timeout: float = 30.0) -> dict:
    """`process_sample` once the descriptor count has stopped moving (the same in three samples
    0.2 s apart, or after `timeout` s): sockets the clients just closed are closed on the
    server's side a little later, and a count taken mid-close is not a leak."""
    last: list[int] = []
    with anyio.move_on_after(timeout):
        while len(last) < 3 or len(set(last[-3:])) > 1:
            last.append(process_sample(pid)["fds"])
            await anyio.sleep(0.2)
    return process_sample(pid)


async def soak(url: str, pid: int | None, requests, expected, args) -> dict:
    """Warm-up, sample, measured run (peak RSS sampled), sample; the phases' reports."""
    warmup = await warm_up(url, requests, expected, args)
    before = await settled_sample(pid) if pid else None
    peak = [before["rss_mib"] if before else 0.0]
    async with anyio.create_task_group() as tasks:
        if pid:
            tasks.start_soon(sample_peak, pid, peak)
        run = await closed_loop(url, requests, expected, args, args.seconds)
        tasks.cancel_scope.cancel()
    await until_idle(url)
    after = await settled_sample(pid) if pid else None
    async with httpx2.AsyncClient(base_url=url, timeout=INFO_TIMEOUT) as http:
        stats = (await http.get("/get_server_info")).json()["stats"]
    return {
        "warmup": warmup,
        "run": run,
        "process_after_warmup": before,
        "process_at_end": after,
        "peak_rss_mib": max(peak[0], after["rss_mib"]) if pid else None,
        "rss_growth_mib": after["rss_mib"] - before["rss_mib"] if pid else None,
        "fd_growth": after["fds"] - before["fds"] if pid else None,
        "server_after": {k: stats[k] for k in ("in_flight", "queue_depth", "failed_batches")},
        "kv_cache": {k: v for k, v in stats.items() if k.startswith(("prefix_cache", "kv_"))},
    }


@contextlib.contextmanager
def target(args):
    """(URL, serving pid or None): `--url` (and `--pid`), or a server of our own on `--model`."""
    if args.url:
        yield args.url.rstrip("/"), serving_pid(args.pid) if args.pid else None
        return
    with Server(common.model_path(args), args) as server:  # compiles the grid at start
        server.wait_ready(args.startup_timeout)
        yield server.url, serving_pid(server.process.pid)


def reference_config(url: str) -> EngineConfig:
    """The server's engine configuration, for an in-process engine that only scores what asks."""
    info = httpx2.get(f"{url}/get_server_info", timeout=30).json()
    config = msgspec.convert(info["engine_config"], EngineConfig)
    model = config.model or str(default_model_path())
    return msgspec.structs.replace(config, model=model, precompile=False, progress=False)


def main(argv=None) -> dict:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=256, help="concurrent closed-loop clients")
    p.add_argument("--seconds", type=float, default=60.0, help="the measured phase")
    p.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="each warm-up phase, seconds: phases repeat until one compiles no new program",
    )
    p.add_argument("--pool", type=int, default=128, help="distinct request bodies, cycled")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request, at most")
    p.add_argument("--tolerance", type=float, default=None, help="log-space; default by dtype")
    p.add_argument("--url", default=None, help="a running server instead of one of our own")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's process")
    p.add_argument("--worker", choices=["asyncio", "trio"], default="asyncio")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--query-tokens", type=int, nargs=2, default=(5, 60), metavar=("LO", "HI"))
    p.add_argument(
        "--kv-cache-bytes", type=int, default=None, help="the server's KV pool (default: its own)"
    )
    args = common.parse_args(p, argv, QUICK)
    with target(args) as (url, pid):
        config = reference_config(url)
        if args.tolerance is None:
            args.tolerance = TOLERANCE[config.dtype]
        requests, expected, model_config = trio.run(
            references, config, args.pool, args.seed, tuple(args.query_tokens)
        )
        report = anyio.run(soak, url, pid, requests, expected, args)
    args.dtype = config.dtype
    path = Path(config.model)
    tag = common.model_tag(args, path)
    report = {
        "workload": "soak",
        **common.environment(args, path, model_config),
        "url": args.url,
        "clients": args.clients,
        "seconds": args.seconds,
        "pool": args.pool,
        "tolerance": args.tolerance,
        **report,
    }
    json_path, _ = common.output_paths(args, "soak", tag)
    common.write_report(report, json_path)
    print(summary(report, tag) + f" -> {json_path}")
    return report


def summary(report: dict, tag: str) -> str:
    run = report["run"]
    line = (
        f"soak {tag} {report['dtype']}: {report['clients']} clients, {run['wall_s']:.0f} s: "
        f"sent {run['sent']} answered {run['answered']} correct {run['correct']} "
        f"lost {run['lost']} errors {run['errors']}{_kinds(run['errors_by_kind'])}; "
        f"{run['requests_per_s']:.1f} req/s {run['items_per_s']:.1f} items/s "
        f"P50/P99 {run['p50_ms']:.0f}/{run['p99_ms']:.0f} ms"
    )
    before, after = report["process_after_warmup"], report["process_at_end"]
    if before:
        line += (
            f"; RSS {before['rss_mib']:.0f} -> {after['rss_mib']:.0f} MiB "
            f"(peak {report['peak_rss_mib']:.0f}), FDs {before['fds']} -> {after['fds']}"
        )
    return line


def _kinds(errors: dict) -> str:
    return " (" + ", ".join(f"{k}: {v}" for k, v in errors.items()) + ")" if errors else ""


if __name__ == "__main__":
    main()
