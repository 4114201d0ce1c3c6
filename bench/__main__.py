"""`python -m bench WORKLOAD [options]`: one entry point for every benchmark.

python -m bench w1 --dtype bfloat16          # rerank batch, engine vs transformers
python -m bench w2 --shape qwen3-0.6b        # 2000-token prompt + 500 items
python -m bench w1 --peer vllm --peer-python VENV/bin/python  # + vLLM's CPU build (its own venv)
python -m bench w3                           # HTTP serving, concurrency sweep
python -m bench w4                           # W2 in 16 requests: the KV cache on vs off
python -m bench w4-ray                       # W4 users on Ray Serve: routers compared
python -m bench int8                         # W1, W2 in int8 beside bf16, f32, transformers
python -m bench int8-errors                  # int8's error by matrix kind, layer and method
python -m bench dense --mode int8            # W1, W2: the measured dense default vs each path
python -m bench long --shape qwen3-0.6b # one 30,000-token sequence, chunked prefill
python -m bench soak                         # 256 clients for 60 s, every answer checked
python -m bench startup                      # time to serve: grid compiled before vs behind
python -m bench summary                      # docs/performance.md's tables from bench/figures
python -m bench w1 --help                    # a workload's own options
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

WORKLOADS = {
    "w1": ("bench.w1", "rerank batch: 1 query + 64 documents, engine vs transformers"),
    "w2": ("bench.w2", "2000-token prompt + 500 items of 20 tokens, vs two baselines"),
    "w3": ("bench.w3", "HTTP serving, concurrency 1/8/64/256, vs transformers"),
    "w4": ("bench.w4", "W2 as 16 requests, sequential and 4 at a time, KV cache on vs off"),
    "w4-ray": ("bench.w4_ray", "W4 users through Ray Serve: prefix affinity vs hashing vs default"),
    "int8": ("bench.int8", "W1 and W2 in int8 compute beside bf16, f32 and transformers bf16"),
    "int8-errors": ("bench.int8_errors", "where int8's error comes from: by kind, layer, method"),
    "dense": ("bench.dense_paths", "W1 and W2 through the measured dense default and each path"),
    "embed": ("bench.embed", "2,000 texts of 8-256 tokens embedded, vs sentence-transformers"),
    "host": ("bench.host", "host time per request and stage: W1/W2/W3 on a device doing nothing"),
    "startup": ("bench.startup", "time to serve and to a compiled grid: before vs in background"),
    "long": ("bench.long", "one 30,000-token sequence through chunked prefill: time, peak memory"),
    "dashboard": ("bench.dashboard_shot", "a screenshot of /dashboard under W3 load (chromium)"),
    "soak": ("bench.soak", "HTTP soak: 256 clients for 60 s, answers checked, RSS/FD watched"),
    "score-offline": ("bench.score_offline", "ScoringModel.score vs transformers, f32 + bf16"),
    "engine-offline": ("bench.engine_offline", "Engine vs ScoringModel, per-stage timings"),
    "parity": ("bench.parity", "engine vs transformers scores on varied pairs"),
    "snapshot": ("bench.snapshot", "scores of this checkout in f32/bf16, to compare bit for bit"),
    "attention": (
        "bench.bench_attention",
        "packed attention kernels on a W2-like or short-text packing",
    ),
    "native": ("bench.bench_native", "Cython hot paths vs their pure-Python twins"),
    "summary": ("bench.summary", "docs/performance.md's tables from bench/figures (--check)"),
}


def usage() -> str:
    lines = [__doc__.strip(), "", "workloads:"]
    lines += [f"  {name:<15} {doc}" for name, (_, doc) in WORKLOADS.items()]
    return "\n".join(lines)


def redraw(argv: list[str]) -> None:
    """The PNG of each w1/w2/w3 JSON report, drawn again beside it from the report alone."""
    parser = argparse.ArgumentParser(
        prog="python -m bench chart", description=redraw.__doc__.splitlines()[0]
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    for path in parser.parse_args(argv).reports:
        if not path.is_file():
            parser.error(f"no such report: {path}")
        report = json.loads(path.read_text())
        importlib.import_module(WORKLOADS[report["workload"]][0]).chart(
            report, path.with_suffix(".png")
        )
        print(path.with_suffix(".png"))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] == "chart":
        redraw(argv[1:])
        return
    if argv[0] not in WORKLOADS:
        sys.exit(f"unknown workload {argv[0]!r}\n\n{usage()}")
    module = importlib.import_module(WORKLOADS[argv[0]][0])
    sys.argv = [f"python -m bench {argv[0]}", *argv[1:]]
    module.main(argv[1:])


if __name__ == "__main__":
    main()
