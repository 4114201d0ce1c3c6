"""W3 serving: many small `/v1/score` requests (1-8 items) over real HTTP to a hypercorn server
on 127.0.0.1, at concurrency 1, 8, 64 and 256, beside transformers scoring the same requests.

    python -m bench w3 [--model PATH | --shape qwen3-0.6b] [--dtype bfloat16] [--duration 20]

The server is `hypercorn api.app:app` in a child process (SCORING_* settings, tokenizer cache
off, so a recycled body is tokenised again), started and stopped by this program. Each level runs
closed-loop clients (`--concurrency` of them, each posting its next request when the last one
answers) until `--duration` seconds or `--max-requests` requests, whichever comes first. A level
reports items/s, real tokens/s, P50/P95/P99 latency, errors, and the device-busy fraction: the
growth of the server's `scoring_device_busy_seconds_total` counter (`/metrics`: seconds the
runner spent executing batches) over the level's wall time. Real tokens come from the server's
`scoring_batch_tokens_total{kind="real"}`; FLOPs from the answered requests, each one's items
sharing their common token prefix once. The load generator runs on the same CPU cores as the
server, and its CPU time is reported.

The baseline is transformers (torch on `--baseline-device`, same weights and dtype) scoring the
same request bodies one request at a time, each as one left-padded batch of its items (what a
server without cross-request batching does), for `--baseline-requests` requests or
`--baseline-seconds`.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
import trio
from tqdm import tqdm

from bench import common, sides
from bench.baseline import hf_label_logprobs, load_transformers
from bench.flops import Cost, shared_prefix_flops
from bench.parity import label_ids
from bench.peak import measure_peaks
from bench.workloads import text_of_tokens
from engine import open_engine
from engine.host.inputs import build_sequences
from engine.loaders import load_checkpoint

SUFFIX = " Answer yes or no:"
QUICK = dict(
    concurrency=[1, 4],
    duration=3.0,
    max_requests=12,
    pool=16,
    baseline_requests=4,
    baseline_seconds=10.0,
    gemm=[512],
)


def request_pool(tokenizer, labels: list[int], count: int, seed: int) -> list[dict]:
    """`count` distinct `/v1/score` bodies: a 15-40-token query and 1-8 items of 10-40 tokens."""
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(count):
        query = text_of_tokens(rng, tokenizer, int(rng.integers(15, 41)))
        items = [
            text_of_tokens(rng, tokenizer, int(rng.integers(10, 41))) + SUFFIX
            for _ in range(int(rng.integers(1, 9)))
        ]
        bodies.append(
            {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": True}
        )
    return bodies


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {"name{labels}": value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


METRICS = {
    "device_busy_s": "scoring_device_busy_seconds_total",
    "real_tokens": 'scoring_batch_tokens_total{kind="real"}',
    "padded_tokens": 'scoring_batch_tokens_total{kind="padded"}',
    "batches": "scoring_batches_total",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its descendants (Linux /proc; hypercorn
    serves from a worker child), 0.0 where unavailable."""
    stats = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(stats[p][1] for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


class Server:
    """`hypercorn api.app:app` (or `app`, with `env_added`) on 127.0.0.1 in a child process,
    serving `path` (None: what `env_added` or the defaults configure); stops on exit."""

    def __init__(
        self, path: Path | None, args, app: str = "api.app:app", env_added: dict | None = None
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkdtemp(prefix="bench-w3-")) / "hypercorn.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCORING_")}
        if path is not None:  # None: the server's default models, or `env_added`'s
            env["SCORING_MODEL"] = str(path)
        env |= {
            "SCORING_DTYPE": args.dtype,
            "SCORING_TOKEN_BUDGET": str(args.token_budget),
            "SCORING_TOKENIZER_CACHE_SIZE": "0",
            "SCORING_PROGRESS": "0",
            "JAX_PLATFORMS": "cpu",
        }
        if getattr(args, "kv_cache_bytes", None) is not None:
            env["SCORING_KV_CACHE_BYTES"] = str(args.kv_cache_bytes)
        env |= env_added or {}
        command = [sys.executable, "-m", "hypercorn", app]
        command += ["--bind", f"127.0.0.1:{self.port}", "--backlog", "2048"]
        if args.worker == "trio":
            command += ["-k", "trio"]
        self.command = command
        self.env = env

    def __enter__(self) -> "Server":
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command, cwd=common.PROJECT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answered 200; RuntimeError with the log if it never did."""
        import httpx2

        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx2.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx2.TransportError:
                pass  # not listening yet
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def metrics(self) -> dict[str, float]:
        import httpx2

        values = parse_metrics(httpx2.get(f"{self.url}/metrics", timeout=30).text)
        return {k: values.get(name, 0.0) for k, name in METRICS.items()}


async def load_level(
    url: str, payloads: list[bytes], concurrency: int, duration: float, limit: int
):
    """Closed-loop load: `concurrency` clients until `duration` s or `limit` requests.

    Returns ([(body index, status or error name, seconds)], wall seconds, requests issued);
    an issued request without a result was lost (cut off by the hard stop).
    """
    import httpx2

    results: list[tuple[int, int | str, float]] = []
    issued = 0
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    start = time.perf_counter()
    deadline = start + duration
    async with httpx2.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            nonlocal issued
            while issued < limit and time.perf_counter() < deadline:
                i = issued % len(payloads)
                issued += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/score", content=payloads[i], headers=headers)
                    status: int | str = r.status_code
                except httpx2.HTTPError as e:
                    status = type(e).__name__
                results.append((i, status, time.perf_counter() - t0))

        with anyio.move_on_after(duration + 90):  # a hard stop even if requests hang
            async with anyio.create_task_group() as tasks:
                for _ in range(concurrency):
                    tasks.start_soon(worker)
    return results, time.perf_counter() - start, issued


def level_report(
    results, wall, issued, before, after, client_cpu, server_cpu, bodies, flops, peaks, dtype
):
    ok = [(i, s) for i, st, s in results if st == 200]
    errors: dict[str, int] = {}
    for _, st, _ in results:
        if st != 200:
            errors[str(st)] = errors.get(str(st), 0) + 1
    latencies = np.array([s for _, s in ok]) * 1e3 if ok else np.array([np.nan])
    items = sum(len(bodies[i]["items"]) for i, _ in ok)
    delta = {k: after[k] - before[k] for k in METRICS}
    done_flops = sum(flops[i] for i, _ in ok)
    gflops = done_flops / wall / 1e9
    return {
        "requests": len(results),
        "lost": issued - len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "wall_s": wall,
        "items": items,
        "items_per_s": items / wall,
        "requests_per_s": len(ok) / wall,
        "tokens_per_s": delta["real_tokens"] / wall,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p95_ms": float(np.percentile(latencies, 95)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "device_busy_fraction": delta["device_busy_s"] / wall,
        "batches": delta["batches"],
        "real_tokens": delta["real_tokens"],
        "padded_tokens": delta["padded_tokens"],
        "gflop_per_s": gflops,
        "mfu": gflops / peaks[dtype],
        "mfu_vs_bf16_peak": gflops / peaks["bfloat16"],
        "mfu_vs_f32_peak": gflops / peaks["float32"],
        "client_cpu_fraction": client_cpu / wall,
        "server_cpu_fraction": server_cpu / wall,
    }


async def run_offline(config, bodies: list[dict]) -> dict:
    """The in-process engine on the same bodies, all submitted at once: the offline rate a
    server level is compared with. Best of two passes after a warm-up pass."""
    async with open_engine(config) as engine:

        async def one(body: dict) -> None:
            await engine.score(
                body["query"], body["items"], body["label_token_ids"], apply_softmax=True
            )

        walls = []
        for _ in range(3):
            engine.flush_cache()  # each pass computes the bodies as new traffic would
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for body in bodies:
                    nursery.start_soon(one, body)
            walls.append(time.perf_counter() - start)
    items = sum(len(b["items"]) for b in bodies)
    wall = min(walls[1:])
    return {"requests": len(bodies), "items": items, "wall_s": wall, "items_per_s": items / wall}


def run_baseline(args, path, seqs_per_body, labels):
    """transformers, one request at a time, its items one left-padded batch, for
    `--baseline-requests` requests or `--baseline-seconds`."""
    max_requests, max_seconds = args.baseline_requests, args.baseline_seconds
    hf = load_transformers(path, args.dtype, args.baseline_device)
    hf_label_logprobs(hf, seqs_per_body[0], labels, len(seqs_per_body[0]))  # warm-up
    items = 0
    start = time.perf_counter()
    bar = tqdm(total=max_requests, desc="transformers", disable=args.no_progress)
    done = 0
    for seqs in seqs_per_body[:max_requests]:
        hf_label_logprobs(hf, seqs, labels, len(seqs))
        items += len(seqs)
        done += 1
        bar.update()
        if time.perf_counter() - start > max_seconds:
            break
    bar.close()
    wall = time.perf_counter() - start
    tokens = sum(sum(map(len, s)) for s in seqs_per_body[:done])
    return {"requests": done, "items": items, "wall_s": wall, "tokens": tokens}


def main(argv=None) -> dict:
    args = parse(argv)
    path, peaks = common.model_path(args), measure_peaks(args.gemm)
    cfg, labels, bodies, seqs = workload(args, path)
    cost = Cost.of(cfg)
    flops = [shared_prefix_flops(cost, s)[0] for s in seqs]
    startup_s, levels = run_levels(args, path, bodies, flops, peaks)
    offline = trio.run(run_offline, sides.engine_config(args, path), bodies)
    for level in levels:
        level["vs_offline"] = level["items_per_s"] / offline["items_per_s"]
    base = run_baseline(args, path, seqs, labels)
    baseline = baseline_side(base, cost, seqs, peaks, args.dtype)
    best = max(levels, key=lambda lv: lv["items_per_s"])
    description = (
        f"{args.pool} distinct /v1/score bodies (15-40-token query, 1-8 items of 10-40 "
        f"tokens), closed loop over HTTP, concurrency {args.concurrency}"
    )
    head = common.report_head(
        args, path, cfg, peaks, "w3", description, worker=args.worker, server_startup_s=startup_s
    )
    report = {
        **head,
        "device_busy_source": "delta of scoring_device_busy_seconds_total (/metrics) / wall",
        "offline": offline,
        **common.versus(best, baseline),
        "engine_best_concurrency": best["concurrency"],
        "levels": levels,
        "baseline": baseline,
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--duration", type=float, default=20.0, help="seconds per level, at most")
    p.add_argument("--max-requests", type=int, default=4000, help="requests per level, at most")
    p.add_argument("--pool", type=int, default=512, help="distinct request bodies, cycled")
    p.add_argument("--worker", choices=["asyncio", "trio"], default="asyncio")
    p.add_argument("--baseline-requests", type=int, default=96)
    p.add_argument("--baseline-seconds", type=float, default=60.0)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    return common.parse_args(p, argv, QUICK)


def workload(args, path):
    """(model config, label ids, request bodies, each body's token sequences)."""
    checkpoint = load_checkpoint(path, progress=not args.no_progress)
    cfg, tokenizer = checkpoint.config, checkpoint.tokenizer
    del checkpoint  # only the tokenizer and config are needed here
    labels = label_ids(tokenizer)
    bodies = request_pool(tokenizer, labels, args.pool, args.seed)
    seqs = [build_sequences(tokenizer, b["query"], b["items"], item_first=False) for b in bodies]
    return cfg, labels, bodies, seqs


def run_levels(args, path, bodies, flops, peaks) -> tuple[float, list[dict]]:
    """(server startup seconds, one report per concurrency level) from a server of our own."""
    payloads = [json.dumps(b).encode() for b in bodies]
    levels = []
    with Server(path, args) as server:
        startup_s = server.wait_ready(args.startup_timeout)
        anyio.run(load_level, server.url, payloads, 4, 60.0, 16)  # warm-up, excluded
        for c in tqdm(args.concurrency, desc="concurrency levels", disable=args.no_progress):
            measured = measure_level(server, payloads, c, args)
            level = level_report(*measured, bodies, flops, peaks, args.dtype)
            levels.append({"concurrency": c, **level})
    return startup_s, levels


def measure_level(server: Server, payloads: list[bytes], concurrency: int, args) -> tuple:
    """One level's load: (results, wall, issued, metrics before, after, client and server CPU
    seconds), as `level_report` takes them."""
    before, cpu0 = server.metrics(), time.process_time()
    srv0 = cpu_seconds(server.process.pid)
    results, wall, issued = anyio.run(
        load_level, server.url, payloads, concurrency, args.duration, args.max_requests
    )
    after = server.metrics()
    client_cpu = time.process_time() - cpu0
    server_cpu = cpu_seconds(server.process.pid) - srv0
    return results, wall, issued, before, after, client_cpu, server_cpu


def baseline_side(base: dict, cost: Cost, seqs, peaks: dict, dtype: str) -> dict:
    """The transformers side from `run_baseline`'s measurement."""
    flops = sum(cost.sequences(s) for s in seqs[: base["requests"]])
    return {
        "kind": "transformers, one request at a time, its items one left-padded batch",
        "items_per_s": base["items"] / base["wall_s"],
        **common.summary_numbers(flops, base["wall_s"], base["tokens"], peaks, dtype),
        **base,
    }


def summary(report: dict) -> str:
    levels, baseline, dtype = report["levels"], report["baseline"], report["dtype"]
    best = max(levels, key=lambda lv: lv["items_per_s"])
    line = ", ".join(
        f"c={lv['concurrency']}: {lv['items_per_s']:.1f} items/s P50/P95/P99 "
        f"{lv['p50_ms']:.0f}/{lv['p95_ms']:.0f}/{lv['p99_ms']:.0f} ms busy "
        f"{lv['device_busy_fraction']:.0%} err {lv['errors']} lost {lv['lost']} "
        f"{lv['vs_offline']:.0%} of offline"
        for lv in levels
    )
    return (
        f"{line}; best {common.fmt_side(best, dtype, 1)} vs transformers "
        f"{baseline['items_per_s']:.1f} items/s ({common.fmt_mfu(baseline, dtype)}), "
        f"ratio {report['ratio']:.2f}x; offline engine {report['offline']['items_per_s']:.1f} "
        "items/s"
    )


def chart(report: dict, png) -> None:
    """Items/s per concurrency level (with the device-busy fraction) and latency percentiles."""
    tag, dtype = common.report_tag(report), report["dtype"]
    plt = common.pyplot()
    levels = report["levels"]
    cs = [str(lv["concurrency"]) for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    rects = left.bar(cs, [lv["items_per_s"] for lv in levels], color="tab:blue", label="engine")
    left.bar_label(
        rects,
        labels=[f"{lv['items_per_s']:.0f}\nbusy {lv['device_busy_fraction']:.0%}" for lv in levels],
        fontsize=8,
    )
    left.axhline(
        report["baseline_items_per_s"],
        color="tab:gray",
        ls="--",
        label="transformers (1 req/batch)",
    )
    left.set_xlabel("concurrent clients")
    left.set_ylabel("items/s")
    left.legend(fontsize=8, loc="upper left")
    left.margins(y=0.2)
    for q in ("p50", "p95", "p99"):
        right.plot(cs, [lv[f"{q}_ms"] for lv in levels], marker="o", label=q.upper())
    right.set_yscale("log")
    right.set_xlabel("concurrent clients")
    right.set_ylabel("latency (ms)")
    right.legend(fontsize=8)
    fig.suptitle(
        f"W3 serving over HTTP (hypercorn, 127.0.0.1): {tag} {dtype}, {report['cores']} CPU "
        f"cores; engine/transformers = {report['ratio']:.2f}x",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
