"""What the workload programs share: flags, the model under test, timing, the JSON + PNG report.

Every program takes `--model PATH` (any supported checkpoint; default: SmolLM2) or `--shape NAME`
(random weights of a real model's shape, see `bench.shapes`), `--dtype`, `--json FILE` (the PNG
goes beside it), `--quick` (the smallest run that still exercises everything) and
`--baseline-device` (where the transformers baseline runs).
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import _native
from bench.flops import Cost
from engine import EngineConfig
from score_kernels import devices

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = Path(__file__).resolve().parents[1]
# what sizes JAX's GPU memory pool; a user who set any of them has made the split already
JAX_MEMORY_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


# options whose value is a path of the machine that ran the bench: a report names the file only
PATH_OPTIONS = ("--model", "--json")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", default=None, help="a .gguf file or HF directory")
    model.add_argument(
        "--shape",
        default=None,
        help="random weights of this shape: qwen3-0.6b, smollm2-135m, the embedder "
        "qwen3-embedding-0.6b, the cross-encoders minilm-l6 and bge-reranker-v2-m3, the "
        "SPLADE model splade-bert-base, bge-m3, or the ColBERT model colbert-bert-base",
    )
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--dense",
        default=None,
        help="force the engine's dense matmul path (xla, cpu, onednn; int8, int8-xla): the "
        "default is the one measured fastest per weight shape",
    )
    p.add_argument(
        "--attention",
        default=None,
        help="force the engine's attention (xla, cpu, pallas, mosaic): the default is the "
        "backend's (docs/configuration.md)",
    )
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        help="devices each engine runner is sharded over (on a CPU, host devices: XLA_FLAGS="
        "--xla_force_host_platform_device_count=N); MFU stays against one device's peak",
    )
    p.add_argument("--json", default=None, help="report file (default: bench/results/...)")
    p.add_argument("--quick", action="store_true", help="the smallest run: for tests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--token-budget",
        type=int,
        default=EngineConfig().token_budget,
        help="engine token budget (default: the engine's)",
    )
    p.add_argument(
        "--gemm", type=int, nargs="+", default=[1024, 2048, 4096], help="GEMM sizes of the peak"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--baseline-device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="the torch device of the transformers baseline (W1, W2, W3, int8); the engine runs "
        "on JAX's default backend either way",
    )
    p.add_argument(
        "--no-precompile",
        action="store_true",
        help="start the engine without compiling its bucket grid (the untimed warm-up request "
        "compiles what the run uses): a quicker start where the grid's compile is not measured",
    )
    p.add_argument(
        "--engine-only",
        action="store_true",
        help="time the engine alone (no baseline, no report): for back-to-back comparisons",
    )
    return p


def model_path(args) -> Path:
    """The checkpoint under test: `--model`, the `--shape` directory, or the default model."""
    if args.shape:
        from bench.shapes import shape_dir

        print(f"building/reusing random-weight checkpoint of shape {args.shape} ...", flush=True)
        return shape_dir(args.shape, seed=args.seed)
    if args.model:
        return Path(args.model)
    from engine.loaders import default_model_path

    return default_model_path()


def model_tag(args, path: Path) -> str:
    if args.shape:
        return args.shape
    return path.stem if path.suffix == ".gguf" else path.name


def report_tag(report: dict) -> str:
    """The model's short name in a report: the shape, or the checkpoint's file/directory name."""
    path = Path(report["model"])
    return report.get("shape") or (path.stem if path.suffix == ".gguf" else path.name)


def output_paths(args, workload: str, tag: str) -> tuple[Path, Path]:
    """(JSON, PNG): `--json FILE` and FILE.png, or `bench/results/<workload>-<tag>-<dtype>.*`."""
    default = RESULTS / f"{workload}-{tag}-{args.dtype}.json"
    json_path = Path(args.json) if args.json else default
    json_path.parent.mkdir(parents=True, exist_ok=True)
    return json_path, json_path.with_suffix(".png")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def git_commit(root: Path = PROJECT) -> str | None:
    """The commit `root` is checked out at, "-dirty" added when its tracked files differ from it
    (a copy of a working tree run elsewhere, say); None outside a repository."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def commit_date(commit: str, root: Path = PROJECT) -> tuple[str, int]:
    """The commit's date (YYYY-MM-DD) and time (s since the epoch), as `root`'s git knows it;
    ("", 0) where it does not."""
    try:
        out = subprocess.run(
            ["git", "show", "-s", "--format=%cs %ct", commit, "--"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "", 0
    date, _, time = out.stdout.strip().partition(" ")
    return (date, int(time)) if out.returncode == 0 and time else ("", 0)


def environment(args, path: Path, cfg) -> dict:
    """Facts every report carries: model, shape, dtype, machine, commit.

    The model is named by its file or directory name: a committed report must not record a path
    of the machine that ran it.
    """

    commit = git_commit()
    date, seconds = commit_date(str(commit).removesuffix("-dirty"))
    return {
        "model": path.resolve().name,
        "shape": args.shape,
        "dtype": args.dtype,
        "family": cfg.family,
        "non_embedding_params": Cost.of(cfg).params,
        "cores": os.cpu_count(),
        "jax_backend": devices.backend(),
        "native_compiled": _native.COMPILED,
        "baseline_device": args.baseline_device,
        "commit": commit,
        # the commit's date: `bench summary` reads it here, needing no git history
        "commit_date": date,
        "commit_time": seconds,
        "seed": args.seed,
        "argv": command_line(sys.argv[1:]),
    }


def command_line(argv: list[str]) -> list[str]:
    """`argv` with each path of the machine it names (an absolute path, or the value of
    `--model` or `--json`) reduced to its file name."""
    return [
        Path(a).name if a.startswith("/") or (i and argv[i - 1] in PATH_OPTIONS) else a
        for i, a in enumerate(argv)
    ]


def per_workload(args, name: str, description: str, run_workload, chart, summary) -> dict:
    """A report of `run_workload(args, path, w) -> (report, model config)` for each of
    `args.workloads`, published with its chart and summary line."""
    path = model_path(args)
    results = {}
    for workload in args.workloads:
        results[workload], cfg = run_workload(args, path, workload)
    report = {
        "workload": name,
        "description": description,
        **environment(args, path, cfg),
        "workloads": results,
    }
    publish(report, args, model_tag(args, path), chart, summary(report))
    return report


def report_head(args, path: Path, cfg, peaks: dict, workload: str, description: str, **facts):
    """The opening of a workload report: what ran, where, then `facts` and the measured peaks."""
    return {
        "workload": workload,
        "description": description,
        **environment(args, path, cfg),
        **facts,
        "peak_gflops": peaks,
    }


def versus(engine: dict, baseline: dict) -> dict:
    """The headline of a report: engine and baseline items/s and their ratio."""
    return {
        "engine_items_per_s": engine["items_per_s"],
        "baseline_items_per_s": baseline["items_per_s"],
        "ratio": engine["items_per_s"] / baseline["items_per_s"],
    }


def publish(report: dict, args, tag: str, chart: Callable, summary: str) -> Path:
    """Write the JSON report, print the one summary line, then draw the chart (left out where
    matplotlib is not installed); returns the JSON."""
    json_path, png = output_paths(args, report["workload"], tag)
    write_report(report, json_path)
    print(f"{report['workload']} {tag} {report['dtype']}: {summary} -> {json_path}", flush=True)
    try:
        chart(report, png)
    except ModuleNotFoundError as e:  # the report stands alone; `python -m bench chart` draws it
        if e.name != "matplotlib":
            raise
        print(f"no chart: matplotlib is not installed ({png} not drawn)", file=sys.stderr)
    return json_path


def write_report(report: dict, json_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=1, default=_jsonable))


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(png: Path, title: str, bars: dict[str, float], ylabel: str, notes: str = "") -> None:
    """One horizontal-label bar chart with the value on each bar."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names, values = list(bars), list(bars.values())
    colors = ["tab:blue" if n.startswith("engine") else "tab:gray" for n in names]
    rects = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(rects, labels=[_short(v) for v in values], padding=2, fontsize=8)
    if max(values) > 20 * min(values) > 0:
        ax.set_yscale("log")
    ax.margins(y=0.12)
    ax.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.fill(line, 100) for line in title.split("\n")), fontsize=9)
    if notes:
        fig.text(0.01, 0.01, notes, fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.06 if notes else 0, 1, 1))
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _short(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def summary_numbers(flops: float, seconds: float, tokens: int, peaks: dict, dtype: str) -> dict:
    """tokens/s, GFLOP/s and MFU against both measured peaks."""
    gflops = flops / seconds / 1e9
    return {
        "tokens_per_s": tokens / seconds,
        "gflop_per_s": gflops,
        "mfu": gflops / peaks[dtype],
        "mfu_vs_bf16_peak": gflops / peaks["bfloat16"],
        "mfu_vs_f32_peak": gflops / peaks["float32"],
    }


def fmt_mfu(side: dict, dtype: str) -> str:
    return f"MFU {side['mfu']:.1%} of {dtype} peak"


def fmt_side(side: dict, dtype: str, digits: int = 2) -> str:
    """`N items/s (T tok/s, MFU ...)`: one side's rates in a summary line."""
    return (
        f"{side['items_per_s']:.{digits}f} items/s ({side['tokens_per_s']:.0f} tok/s, "
        f"{fmt_mfu(side, dtype)})"
    )


def fmt_startup(engine: dict) -> str:
    """The engine's start-up (load, then the bucket-grid compile), which no timed pass holds."""
    return (
        f"engine start-up {engine['startup_s']:.1f} s (load + {engine['startup_compiles']}-program "
        "grid compile)"
    )


def fmt_peaks(peaks: dict) -> str:
    return (
        f"peaks bf16 {peaks['bfloat16']:.0f} ({peaks['bfloat16_path']}) / f32 "
        f"{peaks['float32']:.0f} GFLOP/s on {peaks['cpu']} "
        f"({peaks['matrix_isa'] or 'no matrix ISA'})"
    )


def w1_w2_options(p: argparse.ArgumentParser, batch_sizes: list[int]) -> None:
    """`--workloads` (W1, W2 or both) with each one's shape options (W1's baseline batch sizes
    `batch_sizes`), for the benches that run both."""
    p.add_argument("--workloads", nargs="+", default=["w1", "w2"], choices=["w1", "w2"])
    rerank_batch_options(p, batch_sizes)  # W1's
    p.add_argument("--prompt-tokens", type=int, default=2000)  # W2's
    p.add_argument("--shared-tokens", type=int, default=100)
    p.add_argument("--items", type=int, default=500)
    p.add_argument("--item-tokens", type=int, default=20)


def rerank_batch_options(p: argparse.ArgumentParser, batch_sizes: list[int]) -> None:
    """W1's workload options: one query and its documents, the baseline's batch sizes."""
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--query-tokens", type=int, default=25)
    p.add_argument("--doc-tokens", type=int, nargs=2, default=(130, 230))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=batch_sizes)
    p.add_argument("--repeats", type=int, default=3)


def parse_args(parser, argv, quick: dict):
    """Parse `argv`; with `--quick`, again with the workload's short settings as defaults."""
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    if args.baseline_device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--baseline-device cuda: torch {torch.__version__} sees no CUDA device")
        share_gpu_memory(os.environ)
    return args


def share_gpu_memory(env) -> None:
    """Let JAX and a torch baseline share one GPU: JAX allocates as it needs rather than taking
    75% of the device's memory at start, unless the user has sized its pool (`JAX_MEMORY_VARS`).

    JAX reads these variables once, when it first creates its GPU backend; `parse_args` runs
    before anything here asks JAX for a device (importing jax does not), so this takes effect.
    """
    if not any(name in env for name in JAX_MEMORY_VARS):
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


def engine_numbers(eng: dict, items: int, peaks, dtype: str) -> dict:
    """The engine side of a W1/W2 report from its measured run."""
    keys = (
        "best_s",
        "times_s",
        "startup_s",
        "startup_compiles",
        "dense",
        "dense_choice",
        "compiles",
        "flops",
        "padded_tokens",
        "batches",
        "device_busy_s",
    )
    return {
        "items_per_s": items / eng["best_s"],
        **summary_numbers(eng["flops"], eng["best_s"], eng["planned_real_tokens"], peaks, dtype),
        **{k: eng[k] for k in keys},
        "real_tokens_computed": eng["planned_real_tokens"],
        "real_tokens_stats": eng["real_tokens"],
    }


def engine_only(eng: dict, items: int, peaks, dtype: str) -> dict:
    """Print and return the engine side alone (`--engine-only`): its timed passes and rates."""
    numbers = engine_numbers(eng, items, peaks, dtype)
    passes = ", ".join(f"{t:.3f}" for t in eng["times_s"])
    print(
        f"engine: passes {passes} s, best {eng['best_s']:.3f} s, "
        f"{numbers['items_per_s']:.2f} items/s, MFU {numbers['mfu']:.1%} of the {dtype} peak; "
        f"{fmt_startup(numbers)}",
        flush=True,
    )
    return numbers
