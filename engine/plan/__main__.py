"""Print a model's plan on each device kind (see `engine.plan`).

python -m engine.plan [--model PATH] [--dtype bfloat16] [--device cpu h100 ...]
                      [--memory 16GiB] [--json FILE]
"""

import argparse
import json
import sys

from engine.device.program import DTYPES
from engine.host.buckets import DEFAULT_TOKEN_BUDGET
from engine.loaders import default_model_path, load_checkpoint
from engine.plan import KINDS, plan

UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_bytes(text: str) -> int:
    """'16GiB', '16G', '512MiB' or a plain number of bytes."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}") from None
    return int(value * UNITS[unit])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.plan", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a .gguf file or HF directory (default: SmolLM2)")
    # the device kinds' peaks are bf16 and f32 figures: the int8 mode is not planned
    p.add_argument("--dtype", default="bfloat16", choices=sorted(set(DTYPES) - {"int8"}))
    p.add_argument("--device", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--memory", type=parse_bytes, help="memory size instead of the device's")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    p.add_argument("--json", help="also write the whole plan here")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    checkpoint = load_checkpoint(args.model or default_model_path())
    say = lambda text: print(text, file=sys.stderr, flush=True)
    report = plan(
        checkpoint, args.device, dtype=args.dtype, token_budget=args.token_budget,
        memory=args.memory, progress=say,
    )  # fmt: skip
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def table(report: dict) -> str:
    m = report["model"]
    lines = [
        f"{m['family']} {m['layers']} layers, hidden {m['hidden_size']}, {m['dtype']}: "
        f"weights {m['weight_bytes'] / 2**20:.0f} MiB, activations "
        f"{report['activation_bytes_per_token'] / 2**10:.0f} KiB/token",
        f"{'device':<10}{'KV B/tok':>10}{'pool tok':>12}{'capacity tok':>14}{'max batch':>11}"
        f"{'W1 items/s':>18}{'W2 items/s':>18}",
    ]
    for kind, d in report["devices"].items():
        lines.append(
            f"{kind:<10}{d['kv_bytes_per_token']:>10}{d['default_pool_tokens']:>12}"
            f"{d['capacity_tokens']:>14}{d['largest_batch_tokens']:>11}"
            f"{_rate(d.get('w1')):>18}{_rate(d.get('w2')):>18}"
        )
    lines.append("items/s: at the roofline (XLA's CPU bytes) - from FLOPs alone")
    lines += [f"{name} skipped: {why}" for name, why in report["skipped"].items()]
    return "\n".join(lines)


def _rate(estimate: dict | None) -> str:
    if estimate is None:
        return "-"
    low, high = estimate["items_per_s"], estimate["compute_only_items_per_s"]
    digits = 1 if high < 100 else 0
    return f"{low:.{digits}f}-{high:.{digits}f}"


if __name__ == "__main__":
    main()
