"""Soak: many closed-loop clients post a mix of every scoring and embedding route the served
model answers over HTTP for a fixed time; every answer is checked against the same request sent
alone, the serving process's memory and descriptors watched, and device faults injected.

    python -m bench soak [--clients 256] [--seconds 60]
                         [--url URL [--pid PID] | --model PATH | --models FILE|default]
                         [--fault-every N [--fault-seconds 20]]

Without `--url` it starts `hypercorn api.app:app` on 127.0.0.1 (as `bench w3` does: bucket grid
compiled at start, tokenizer cache off) on `--model`, the default model unless given, or on
`--models`: a models file (`SCORING_MODELS`) or `default`, the server's default models
(SmolLM2 and all-MiniLM-L6-v2). With several models each gets `--pool` bodies built with its
tokenizer, over its routes: those whose bodies name a model (`soak_bodies.NAMED`) name it, the
others are the routes its card lists as answered by it when none is named
(`default_endpoints`); each model's bodies are first sent alone to a server of that model alone,
whose answers are the references (so every answer under load must equal the one-model
server's), and the report records each model's KV pool beside the default budget. The pool is
`--pool` distinct bodies spread over the routes of the model's `/v1/models` card that the soak
knows (`bench.soak_bodies`): label scores, reranks (OpenAI-style, Cohere, TEI), embeddings
(OpenAI, Cohere, TEI), token vectors, similarity, sparse vectors, BGE-M3's three outputs; 1-32
items or texts (log-uniform), queries of `--query-tokens` (5-60) and items of 3-80 tokens (token
vectors, sparse and hybrid outputs: 1-8 texts of 3-40 tokens). Each body is first
sent alone, one after another: its answer is the reference. A warm-up phase at full concurrency
(`--warmup` seconds) precedes the measured one (`--seconds`); clients stop issuing at the
deadline and requests in flight then are awaited (each up to `--timeout` seconds).

Per phase, in all and per route: sent, answered (200), correct (a 200 equal to the reference:
label scores within `bench.parity.TOLERANCE` in log space, every other number within
`soak_bodies.ABS_TOLERANCE`, 1e-5 in f32; keys, orders, top_n and echoed texts exactly), errors
by status or exception, lost = sent - answered - errors (requests cut off by the hard stop; must
be 0). The serving process (hypercorn's worker, or `--pid`) is sampled from /proc after the
warm-up and at the end, each time after the clients' connections have closed and the descriptor
count has settled: VmRSS, VmHWM and open file descriptors, plus the peak VmRSS sampled every
0.5 s during the run.

`--fault-every N` serves `bench.faulty_app` instead, and after the measured run adds a phase of
`--fault-seconds` in which every N-th batch fails on the device: the report counts the batches
that failed, the requests they carried, and what the clients saw (only those requests may fail;
every other answer must still equal its reference).
"""

import argparse
import contextlib
import itertools
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import anyio
import httpx2
import jax
import numpy as np

from bench import common
from bench.parity import TOLERANCE
from bench.soak_bodies import ABS_TOLERANCE, NAMED, ROUTES, Request, request_pool
from bench.w3 import Server
from engine import default_model_path
from engine.device.kv_pool import DEFAULT_POOL_SHARE
from engine.loaders import load_checkpoint
from score_kernels import devices

WARMUP_ROUNDS = 10
# seconds for /get_server_info while the server may be busy compiling: httpx's default 5 s is
# too short on a loaded machine
INFO_TIMEOUT = 60.0
QUICK = dict(clients=16, seconds=3.0, warmup=1.0, pool=16)


async def references(url: str, requests: list[Request], timeout: float) -> list:
    """Each body's answer sent alone (the route's `alone` form), one after another."""
    out = []
    async with httpx2.AsyncClient(base_url=url, timeout=timeout) as http:
        for request in requests:
            body = ROUTES[request.path].alone(request.body)
            r = await http.post(request.path, json=body)
            if r.status_code != 200:
                raise SystemExit(f"{request.path} alone answered {r.status_code}: {r.text[:500]}")
            out.append(r.json())
    return out


def deviation(request: Request, want, answer, dtype: str) -> float:
    """The answer's gap from the reference, in multiples of its route's tolerance."""
    return ROUTES[request.path].gap(request.body, want, answer, dtype)


@dataclass
class Counts:
    """What one phase of load did on one route (or all of them)."""

    sent: int = 0
    answered: int = 0
    correct: int = 0
    items: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    max_gap: float = 0.0  # multiples of the route's tolerance

    def record(self, status: int | str, seconds: float, request: Request, gap: float) -> None:
        if status != 200:
            self.errors[str(status)] += 1
            return
        self.answered += 1
        self.items += request.items
        self.latencies.append(seconds)
        self.max_gap = max(self.max_gap, gap)
        self.correct += gap <= 1.0

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
            "max_gap": self.max_gap,
        }


class Tally:
    """One phase's counts, in all and by route."""

    def __init__(self):
        self.all = Counts()
        self.routes: dict[str, Counts] = {}

    def sent(self, request: Request) -> None:
        self.all.sent += 1
        self.routes.setdefault(request.path, Counts()).sent += 1

    def record(self, status: int | str, seconds: float, request: Request, gap: float) -> None:
        self.all.record(status, seconds, request, gap)
        self.routes[request.path].record(status, seconds, request, gap)

    def report(self, wall: float) -> dict:
        by_route = {path: c.report(wall) for path, c in sorted(self.routes.items())}
        return {**self.all.report(wall), "routes": by_route}


async def closed_loop(url: str, requests, expected, args, seconds: float) -> dict:
    """`args.clients` closed-loop clients for `seconds`; the phase's report."""
    tally = Tally()
    limits = httpx2.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    headers = {"content-type": "application/json"}
    deadline = time.perf_counter() + seconds
    turn = itertools.count()
    start = time.perf_counter()

    async def client(http: httpx2.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            i = next(turn) % len(requests)
            request, t0 = requests[i], time.perf_counter()
            tally.sent(request)
            try:
                r = await http.post(request.path, content=request.payload, headers=headers)
                status, gap = r.status_code, np.inf
                if status == 200:
                    gap = deviation(request, expected[i], r.json(), args.dtype)
            except httpx2.HTTPError as e:
                status, gap = type(e).__name__, np.inf
            tally.record(status, time.perf_counter() - t0, request, gap)

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
    with anyio.fail_after(timeout):
        while True:
            stats = await server_stats(url)
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
        return (await server_stats(url))["compiles"]

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


async def server_stats(url: str) -> dict:
    """The engine counters of the server at `url`, summed over its models."""
    async with httpx2.AsyncClient(base_url=url, timeout=INFO_TIMEOUT) as http:
        cards = (await http.get("/v1/models")).json()["data"]
        total: Counter = Counter()
        for card in cards:
            info = await http.get("/get_server_info", params={"model": card["id"]})
            stats = info.json()["stats"]
            total.update({k: v for k, v in stats.items() if isinstance(v, int | float)})
        return dict(total)


async def soak(url: str, pid: int | None, requests, expected, args, faults) -> dict:
    """Warm-up, sample, measured run (peak RSS sampled), sample, then with `faults` a phase
    of injected device faults; the phases' reports."""
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
    stats = await server_stats(url)
    report = {
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
    if faults:
        report["faults"] = await fault_phase(url, requests, expected, args, faults, stats)
    return report


async def fault_phase(url: str, requests, expected, args, faults: "Faults", before: dict):
    """`args.fault_seconds` of load with every `args.fault_every`-th batch failing: what the
    clients saw, the batches that failed and the requests they carried."""
    faults.arm.touch()
    try:
        phase = await closed_loop(url, requests, expected, args, args.fault_seconds)
    finally:
        faults.arm.unlink()
    await until_idle(url)
    stats = await server_stats(url)
    log = faults.log.read_text() if faults.log.exists() else ""  # none failed: none written
    failed = [json.loads(line) for line in log.splitlines()]
    return {
        **phase,
        "fault_every": args.fault_every,
        "failed_batches": stats["failed_batches"] - before["failed_batches"],
        "injected": len(failed),
        "requests_in_failed_batches": len({r for f in failed for r in f["requests"]}),
        "server_after": {k: stats[k] for k in ("in_flight", "queue_depth")},
    }


class Faults(NamedTuple):
    """Where `bench.faulty_app` is told to fail batches and where it says which it failed."""

    arm: Path
    log: Path

    @classmethod
    def make(cls) -> "Faults":
        root = Path(tempfile.mkdtemp(prefix="soak-faults-"))
        return cls(root / "armed", root / "failed.jsonl")

    def env(self, every: int) -> dict:
        return {
            "SOAK_FAULT_EVERY": str(every),
            "SOAK_FAULT_ARM": str(self.arm),
            "SOAK_FAULT_LOG": str(self.log),
        }


@contextlib.contextmanager
def target(args, faults: Faults | None):
    """(URL, serving pid or None): `--url` (and `--pid`), or a server of our own on `--model`
    or `--models` (`bench.faulty_app` with `faults`)."""
    if args.url:
        yield args.url.rstrip("/"), serving_pid(args.pid) if args.pid else None
        return
    app, env = (
        ("bench.faulty_app:app", faults.env(args.fault_every)) if faults else ("api.app:app", {})
    )
    path = None if args.models else common.model_path(args)
    if args.models not in (None, "default"):
        env["SCORING_MODELS"] = str(Path(args.models).resolve())
    with Server(path, args, app, env) as server:  # compiles the grid at start
        server.wait_ready(args.startup_timeout)
        yield server.url, serving_pid(server.process.pid)


class Served(NamedTuple):
    """A model of the server under test, as its `/v1/models` card and `/get_server_info` say."""

    name: str
    path: str
    dtype: str
    routes: list[str]  # the soak's routes it answers: named, or its by default
    kv_pool_bytes: int


def served(url: str) -> list[Served]:
    """The models of the server at `url`, in order."""
    cards = httpx2.get(f"{url}/v1/models", timeout=INFO_TIMEOUT).json()["data"]
    out = []
    for card in cards:
        params = {"model": card["id"]}
        info = httpx2.get(f"{url}/get_server_info", params=params, timeout=INFO_TIMEOUT).json()
        config, pool = info["engine_config"], info["kv_pool"]
        routes = [p for p in card["endpoints"] if p in NAMED or p in card["default_endpoints"]]
        path = config["model"] or str(default_model_path())
        out.append(Served(card["id"], path, config["dtype"], routes, pool["bytes"] if pool else 0))
    return out


def model_requests(models: list[Served], args) -> tuple[list[Request], dict]:
    """Each model's `--pool` bodies (naming it where several are served), interleaved, and the
    model config (`common.environment`'s) of the first."""
    pools, first = [], None
    for i, model in enumerate(models):
        checkpoint = load_checkpoint(model.path, progress=False)
        first = first or checkpoint.config
        pools.append(
            request_pool(
                checkpoint.tokenizer,
                checkpoint.config.vocab_size,
                model.routes,
                args.pool,
                args.seed + i,
                model.dtype,
                tuple(args.query_tokens),
                model=model.name if len(models) > 1 else None,
            )
        )
        del checkpoint
    return [r for group in itertools.zip_longest(*pools) for r in group if r], first


def alone_references(url: str, models: list[Served], requests: list[Request], args) -> list:
    """Each body's answer sent alone: to `url` where one model is served, else each model's
    bodies to a server of that model alone (started here, then stopped)."""
    if len(models) == 1:
        return anyio.run(references, url, requests, args.timeout)
    answers = {}
    for model in models:
        mine = [i for i, r in enumerate(requests) if owner(r, models) == model.name]
        single = argparse.Namespace(**{**vars(args), "dtype": model.dtype})
        with Server(Path(model.path), single) as server:
            server.wait_ready(args.startup_timeout)
            got = anyio.run(references, server.url, [requests[i] for i in mine], args.timeout)
        answers |= dict(zip(mine, got, strict=True))
    return [answers[i] for i in range(len(requests))]


def owner(request: Request, models: list[Served]) -> str:
    """The model that answers `request`: the one it names, or its route's default."""
    if "model" in request.body:
        return request.body["model"]
    return next(m.name for m in models if request.path in m.routes)


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
    p.add_argument("--url", default=None, help="a running server instead of one of our own")
    p.add_argument(
        "--models",
        default=None,
        help="a models file (SCORING_MODELS) to serve, or `default`: the server's defaults",
    )
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's process")
    p.add_argument("--worker", choices=["asyncio", "trio"], default="asyncio")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--query-tokens", type=int, nargs=2, default=(5, 60), metavar=("LO", "HI"))
    p.add_argument(
        "--kv-cache-bytes", type=int, default=None, help="the server's KV pool (default: its own)"
    )
    p.add_argument(
        "--fault-every",
        type=int,
        default=0,
        help="after the measured run, a phase failing every N-th batch (0: none; not with --url)",
    )
    p.add_argument("--fault-seconds", type=float, default=20.0, help="the fault phase")
    args = common.parse_args(p, argv, QUICK)
    if args.fault_every and args.url:
        p.error("--fault-every injects faults into a server of its own: not with --url")
    if args.models and (args.url or args.model or args.shape):
        p.error("--models serves its own models: not with --url, --model or --shape")
    faults = Faults.make() if args.fault_every else None
    with target(args, faults) as (url, pid):
        models = served(url)
        args.dtype = models[0].dtype
        requests, cfg = model_requests(models, args)
        expected = alone_references(url, models, requests, args)
        report = anyio.run(soak, url, pid, requests, expected, args, faults)
    path = Path(models[0].path)
    tag = "+".join(common.model_tag(args, Path(m.path)) for m in models)
    report = {
        "workload": "soak",
        **common.environment(args, path, cfg),
        "url": args.url,
        "clients": args.clients,
        "seconds": args.seconds,
        "pool": args.pool,
        "routes": sorted({r.path for r in requests}),
        "models": [
            # by file or directory name: a committed report names no path of the machine
            {"name": m.name, "path": Path(m.path).name, "routes": m.routes}
            | {"kv_pool_bytes": m.kv_pool_bytes}
            for m in models
        ],
        "kv_pool_budget_bytes": devices.memory(jax.devices()[0]) // DEFAULT_POOL_SHARE,
        "tolerance": {"scores_log": TOLERANCE[args.dtype], "values": ABS_TOLERANCE[args.dtype]},
        **report,
    }
    json_path, _ = common.output_paths(args, "soak", tag)
    common.write_report(report, json_path)
    print(summary(report, tag) + f" -> {json_path}")
    return report


def _phase(name: str, phase: dict) -> str:
    return (
        f"{name}: sent {phase['sent']} answered {phase['answered']} correct {phase['correct']} "
        f"lost {phase['lost']} errors {phase['errors']}{_kinds(phase['errors_by_kind'])}"
    )


def summary(report: dict, tag: str) -> str:
    run = report["run"]
    line = (
        f"soak {tag} {report['dtype']}: {report['clients']} clients, {run['wall_s']:.0f} s, "
        f"{len(report['routes'])} routes: {_phase('run', run)}; "
        f"{run['requests_per_s']:.1f} req/s {run['items_per_s']:.1f} items/s "
        f"P50/P99 {run['p50_ms']:.0f}/{run['p99_ms']:.0f} ms"
    )
    before, after = report["process_after_warmup"], report["process_at_end"]
    if before:
        line += (
            f"; RSS {before['rss_mib']:.0f} -> {after['rss_mib']:.0f} MiB "
            f"(peak {report['peak_rss_mib']:.0f}), FDs {before['fds']} -> {after['fds']}"
        )
    pools = sum(m["kv_pool_bytes"] for m in report["models"]) / 2**20
    line += f"; KV pools {pools:.0f} MiB of {report['kv_pool_budget_bytes'] / 2**20:.0f} MiB"
    if faults := report.get("faults"):
        line += (
            f"; {_phase('faults', faults)}, {faults['failed_batches']} batches failed "
            f"carrying {faults['requests_in_failed_batches']} requests"
        )
    return line


def _kinds(errors: dict) -> str:
    return " (" + ", ".join(f"{k}: {v}" for k, v in errors.items()) + ")" if errors else ""


if __name__ == "__main__":
    main()
