"""W4 traffic on Ray Serve: prefix-affinity routing vs rendezvous hashing vs Ray's default router.

    python -m bench w4-ray [--model PATH] [--replicas 2] [--routers prefix hash default] [--quick]

`--clients` users, each with its own long prompt (a fixed header, then text of its own) and its
items, sent as `--requests` chunk requests, `--parallel` in flight per user, all users at once,
through a local Ray Serve application (`api.ray_serve.build_app`, 127.0.0.1 only) of
`--replicas` engine replicas. Each router gets a fresh application (cold caches), a warm-up pass
(compiles), then `--repeats` timed passes of new prompts. Reported per router: items/s (best
pass); prompt tokens read from the replicas' KV caches (`usage.prompt_tokens_details
.cached_tokens`, counted per item) and prompt tokens computed (per request: its prompt once,
less what its items read from the cache); requests per replica; the most replicas one user's
requests went to; and the scores' largest deviation between routers (the same prompts and
items). Prints one summary line; writes the JSON report and a bar chart beside it.
"""

import concurrent.futures
import contextlib
import os
import time
from collections import Counter

import numpy as np

from bench import common
from bench.parity import label_ids
from bench.w2 import ids_of
from engine.loaders import load_checkpoint

QUICK = dict(
    clients=2, prompt_tokens=200, shared_tokens=20, items=8, requests=4, parallel=2, repeats=1
)
APP = "w4-ray"
PROXY_READY_S = 60  # seconds a new Serve proxy has to start (`local_serve`)


def parse(argv):
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--routers", nargs="+", default=["prefix", "hash", "default"])
    p.add_argument("--clients", type=int, default=4, help="users, each with a prompt of its own")
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--shared-tokens", type=int, default=100, help="of each prompt, fixed text")
    p.add_argument("--items", type=int, default=96, help="items per user")
    p.add_argument("--item-tokens", type=int, default=20)
    p.add_argument(
        "--requests", type=int, default=6, help="requests each user's items are split into"
    )
    p.add_argument("--parallel", type=int, default=2, help="requests in flight per user")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cpus", type=float, default=2.0, help="the local Ray instance's CPUs")
    return common.parse_args(p, argv, QUICK)


def traffic(tokenizer, args, seed: int) -> list[dict]:
    """Every request body of one pass: each user's prompt (as token ids) with a chunk of its
    items, users interleaved in arrival order."""
    header = ids_of(tokenizer, np.random.default_rng(12345), args.shared_tokens)
    labels = label_ids(tokenizer)
    users = []
    for user in range(args.clients):
        rng = np.random.default_rng([seed, user])
        prompt = header + ids_of(tokenizer, rng, args.prompt_tokens - args.shared_tokens)
        items = [ids_of(tokenizer, rng, args.item_tokens) for _ in range(args.items)]
        chunks = np.array_split(np.arange(args.items), args.requests)
        users.append(
            [
                {"query": prompt, "items": [items[j] for j in c], "label_token_ids": labels}
                for c in chunks
            ]
        )
    return [body for chunk in zip(*users, strict=True) for body in chunk]


def send_pass(url: str, bodies: list[dict], args) -> dict:
    """All bodies, `parallel` per user in flight; items/s, cache figures, replicas, scores."""
    import httpx2

    with httpx2.Client(base_url=url, timeout=3600) as client:

        def post(body):
            r = client.post("/v1/score", json=body)
            r.raise_for_status()
            return r

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients * args.parallel) as pool:
            answers = list(pool.map(post, bodies))
        seconds = time.perf_counter() - start
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    # a request computes its prompt once for all its items, less what each item read cached
    computed = [len(b["query"]) - c / len(b["items"]) for b, c in zip(bodies, cached, strict=True)]
    replicas = [a.headers["x-scoring-replica"] for a in answers]
    per_user: dict[tuple, set] = {}
    for body, replica in zip(bodies, replicas, strict=True):
        per_user.setdefault(tuple(body["query"]), set()).add(replica)
    return {
        "seconds": seconds,
        "items_per_s": sum(len(b["items"]) for b in bodies) / seconds,
        "cached_tokens": sum(cached),
        "prompt_tokens": sum(len(b["query"]) for b in bodies),
        "prompt_tokens_computed": round(sum(computed)),
        "requests_per_replica": sorted(Counter(replicas).values()),
        "most_replicas_per_user": max(map(len, per_user.values())),
        "scores": [s for a in answers for s in a.json()["scores"]],
    }


@contextlib.contextmanager
def local_serve(cpus: float):
    """A local Ray instance of `cpus` CPUs on 127.0.0.1, Serve's proxy on a free port: its URL.
    Stopped on exit."""
    import ray
    from ray import serve

    from bench.w3 import free_port

    # Serve restarts a proxy not ready within 5 s (its default), and a proxy restarted while
    # `serve.start` waits on it fails the start: on a busy 2-core machine a new worker process
    # importing Serve took longer. Ray's processes take this process's environment.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_S))
    ray.init(
        num_cpus=cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def run_router(url: str, router: str, tokenizer, args) -> dict:
    """A fresh application with `router`: warm-up, then the timed passes (the best kept)."""
    from ray import serve

    from api.ray_serve import build_app

    options = {
        "replicas": args.replicas,
        "router": router,
        "replica_cpus": args.cpus / args.replicas,
    }
    start = time.perf_counter()
    serve.run(build_app(options), name=APP, route_prefix="/")
    startup = time.perf_counter() - start
    try:
        send_pass(url, traffic(tokenizer, args, seed=1), args)
        runs = [
            send_pass(url, traffic(tokenizer, args, seed=10 + r), args) for r in range(args.repeats)
        ]
    finally:
        serve.delete(APP)
    best = max(runs, key=lambda run: run["items_per_s"])
    best["scores"] = runs[0]["scores"]  # the same traffic under every router
    return {"startup_s": startup, **best}


def main(argv=None) -> dict:
    args = parse(argv)
    path = common.model_path(args)
    checkpoint = load_checkpoint(path, progress=not args.no_progress)
    tokenizer, model_config = checkpoint.tokenizer, checkpoint.config
    del checkpoint
    os.environ.update(  # what the application is built from
        SCORING_MODEL=str(path),
        SCORING_DTYPE=args.dtype,
        SCORING_TOKEN_BUDGET=str(args.token_budget),
        SCORING_PRECOMPILE="0",
        SCORING_PROGRESS="0",
    )
    with local_serve(args.cpus) as url:
        sides = {router: run_router(url, router, tokenizer, args) for router in args.routers}
    report = make_report(args, path, sides, model_config)
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def make_report(args, path, sides: dict, model_config) -> dict:
    first = next(iter(sides.values()))["scores"]
    deviation = max(
        float(np.max(np.abs(np.log(side["scores"]) - np.log(first)))) for side in sides.values()
    )
    for side in sides.values():
        side.pop("scores")
    base = sides.get("default")
    return {
        "workload": "w4-ray",
        "description": (
            f"{args.clients} users at once, each a {args.prompt_tokens}-token prompt "
            f"({args.shared_tokens} shared) + {args.items} items of {args.item_tokens} tokens "
            f"in {args.requests} requests, {args.parallel} in flight; Ray Serve, "
            f"{args.replicas} replicas on {args.cpus:g} CPUs"
        ),
        **common.environment(args, path, model_config),
        "sides": sides,
        "over_default": {
            r: {
                "items_per_s": s["items_per_s"] / base["items_per_s"],
                "prompt_tokens_computed": s["prompt_tokens_computed"]
                / base["prompt_tokens_computed"],
            }
            for r, s in sides.items()
        }
        if base
        else {},
        "max_logprob_deviation_between_routers": deviation,
    }


def summary(report: dict) -> str:
    parts = [
        f"{r}: {s['items_per_s']:.1f} items/s, {s['prompt_tokens_computed']} prompt tokens computed"
        for r, s in report["sides"].items()
    ]
    return "; ".join(parts)


def chart(report: dict, png) -> None:
    sides = report["sides"]
    bars = {f"{r} items/s": s["items_per_s"] for r, s in sides.items()}
    computed = ", ".join(f"{r} {s['prompt_tokens_computed']}" for r, s in sides.items())
    title = f"W4 on Ray Serve, {common.report_tag(report)} {report['dtype']}"
    common.bar_chart(png, title, bars, "items/s", f"prompt tokens computed: {computed}")
