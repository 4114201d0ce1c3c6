"""The dense matmul paths side by side: W1 and W2 through the engine with the measured default
and with each strategy forced, back to back, in one compute mode.

    python -m bench dense [--model PATH | --shape smollm2-135m] [--mode bfloat16|float32|int8]
                          [--workloads w1 w2] [--paths default cpu ...] [--repeats 3]

Each workload is one `Engine.score` request timed as `python -m bench w1` / `w2` time it
(warm-up, then the best of `--repeats` passes with the KV cache flushed), once per path: the
default (each weight shape by the strategy measured fastest on this machine) and every strategy
that runs here ("xla", "cpu", "onednn"; in float32: "xla", "cpu"; in int8: "int8",
"int8-xla"), or those `--paths` names.
Reported per path: items/s and the ratio to the best forced strategy, the label log-probs'
largest |d log-prob| from the first path's (`max_abs_logprob_diff_vs_first`), and what the
default chose per shape with each candidate's GFLOP/s. Prints one line per workload; writes the
JSON report and a chart.
"""

from functools import partial

from bench import common, sides, w1, w2
from bench.int8 import QUICK
from score_kernels import INT8_DENSE, dense_choice, dense_runs, devices


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="bfloat16", choices=["bfloat16", "float32", "int8"])
    common.w1_w2_options(p, [1])  # no baseline runs here
    p.add_argument(
        "--paths",
        nargs="+",
        default=None,
        help="the paths to time (default: the measured default and every forced one that runs)",
    )
    return common.parse_args(p, argv, QUICK)


def paths(mode: str) -> list[str | None]:
    """The default (None) and every strategy of `mode` that runs on this backend."""
    names = INT8_DENSE if mode == "int8" else ("xla", "cpu", "onednn")
    backend, int8 = devices.backend(), mode == "int8"
    dtype = dense_choice.input_dtype(mode)
    return [None, *(n for n in names if dense_runs(n, backend, dtype=dtype, int8=int8))]


def main(argv=None) -> dict:
    args = parse(argv)
    description = "W1 and W2 through each dense path: the measured default and each forced"
    return common.per_workload(args, "dense", description, run_workload, chart, summary)


def run_workload(args, path, name: str) -> tuple[dict, object]:
    """The workload's report through every path, and the model's config."""
    build = partial(w1.build if name == "w1" else w2.build, args)
    args.dtype = args.mode
    runs = {}
    chosen = [None if p == "default" else p for p in args.paths] if args.paths else None
    for dense in chosen or paths(args.mode):
        args.dense = dense
        runs[dense or "default"] = sides.run_engine(
            sides.engine_config(args, path), build, args.repeats
        )
    first_run = next(iter(runs.values()))
    items, first = len(first_run["request"][1]), first_run["logprobs"]
    out = {
        label: {
            "items_per_s": items / run["best_s"],
            "times_s": run["times_s"],
            "max_abs_logprob_diff_vs_first": float(abs(run["logprobs"] - first).max()),
        }
        for label, run in runs.items()
    }
    forced = [v for k, v in out.items() if k != "default"] or list(out.values())
    best = max(v["items_per_s"] for v in forced)
    for side in out.values():
        side["over_best_forced"] = side["items_per_s"] / best
    choice = runs["default"]["dense_choice"] if "default" in runs else None
    return {"items": items, "paths": out, "choice": choice}, first_run["config"]


def summary(report: dict) -> str:
    return "; ".join(
        f"{name}: "
        + ", ".join(
            f"{p} {s['items_per_s']:.2f} items/s ({s['over_best_forced']:.3f}x the best forced)"
            for p, s in r["paths"].items()
        )
        for name, r in report["workloads"].items()
    )


def chart(report: dict, png) -> None:
    bars = {
        f"{p} {name.upper()}": s["items_per_s"]
        for name, r in report["workloads"].items()
        for p, s in r["paths"].items()
    }
    notes = "; ".join(
        f"{name}: default {r['paths']['default']['over_best_forced']:.3f}x the best forced path"
        for name, r in report["workloads"].items()
        if "default" in r["paths"]
    )
    title = f"dense paths ({report['dtype']}), {common.report_tag(report)}, {report['cores']} cores"
    common.bar_chart(png, title, bars, "items/s", notes)
