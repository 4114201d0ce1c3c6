"""`python -m bench summary [--check]`: the tables at the head of docs/performance.md, written
from the reports in bench/figures.

One table per machine kind, as each report names it: a CPU by the model and matrix
instructions its measured peak recorded (`peak_gflops.cpu`, `.matrix_isa`) and the cores the run
had, with the file name's tag where it has one (`-zen3`); a GPU by its note or that tag (`-h100`;
a report does not name its GPU otherwise), with the host beside it. A row is one workload on one
model in one dtype, the newest report of it (by its commit's date): the engine's items/s beside
each peer measured in the same run, and their ratio. A report that compares the engine with
nothing, or does not name its machine, is left out and listed with why; `--check` exits 1 where
the page differs from what the reports give.
"""

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bench import common

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures"
PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"

CPU_TAGS = {"zen3": ("Zen 3", "AMD"), "zen4": ("Zen 4", "AMD"), "zen5": ("Zen 5", "AMD")}
CPU_TAGS |= {"spr": ("Sapphire Rapids", "Intel"), "emr": ("Emerald Rapids", "Intel")}
GPUS = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "a100": "NVIDIA A100", "l4": "NVIDIA L4"}
ISAS = {"amx": "AMX", "avx512_bf16": "AVX512-BF16", "avx512_vnni": "AVX512-VNNI"}
ISAS |= {"avx_vnni": "AVX-VNNI", "avx2": "AVX2", None: "no matrix ISA"}
DTYPES = {"bfloat16": "bf16", "float32": "f32"}
EMBED_KINDS = {  # `bench embed --kind` -> (row order, workload)
    "dense": (5, "embeddings"),
    "sparse": (6, "sparse embeddings (SPLADE)"),
    "multi": (7, "multi-vectors (ColBERT)"),
    "bge-m3": (8, "BGE-M3: dense, sparse and multi-vector"),
}
TRADEMARKS = re.compile(r"\((R|TM)\)")
ALONE = "the engine alone, beside no peer"


class Skipped(Exception):
    """A report the tables cannot use; the message says why."""


class Row(NamedTuple):
    order: int  # the workload's place in a table
    workload: str
    model: str
    dtype: str
    engine: float  # items/s
    peers: list[tuple[str, float]]  # (the peer as measured, its items/s)


class Measured(NamedTuple):
    machine: tuple[int, str]  # (0 CPU | 1 GPU, the machine as its table is headed)
    row: Row
    commit: str
    date: str  # the commit's, YYYY-MM-DD ("" where git does not know it)
    time: int  # the commit's, for the newest
    report: str  # file name


# -- reading reports ----------------------------------------------------------------------------


def transformers(report: dict, side: dict, how: str = "") -> str:
    device = report.get("baseline_device", "cpu")
    where = "" if device == "cpu" else f" on {device.upper()}"
    return f"transformers{how}{where}, batch {side['batch_size']}"


def vllm(report: dict) -> list[tuple[str, float]]:
    if "peer" not in report:
        return []
    peer = report["peer"]
    name = {"vllm": "vLLM"}.get(peer["name"], peer["name"])
    return [(f"{name} {peer['version']}", peer["items_per_s"])]


def row(r: dict, order: int, workload: str, peers: list, dtype=None, engine=None) -> Row:
    """A row of report `r`: its model and, unless given, its dtype and the engine's items/s."""
    engine = r["engine_items_per_s"] if engine is None else engine
    return Row(order, workload, r["model"], dtype or r["dtype"], engine, peers)


def read_w1(r: dict) -> list[Row]:
    items, baseline = r["items"], r["baseline"]
    if r.get("kind") == "cross-encoder":
        peer = f"{baseline['name']}, batch {baseline['batch_size']}"
        workload = f"W1 cross-encoder rerank: 1 query, {items} documents"
        return [row(r, 1, workload, [(peer, baseline["items_per_s"])])]
    peers = [*vllm(r), (transformers(r, baseline), baseline["items_per_s"])]
    return [row(r, 0, f"W1 rerank: 1 query, {items} documents", peers)]


def read_w2(r: dict) -> list[Row]:
    baseline, naive = r["baseline"], r["naive_baseline"]
    peers = [
        *vllm(r),
        (transformers(r, baseline, " prefix reuse"), baseline["items_per_s"]),
        (transformers(r, naive, " naive"), naive["items_per_s"]),
    ]
    return [row(r, 2, f"W2 multi-item: 2,000-token prompt, {r['items']} items", peers)]


def read_w3(r: dict) -> list[Row]:
    workload = f"W3 HTTP serving, {r['engine_best_concurrency']} clients"
    return [
        row(r, 3, workload, [("transformers, one request at a time", r["baseline"]["items_per_s"])])
    ]


def read_int8(r: dict) -> list[Row]:
    """W1 and W2 in int8 compute beside transformers bf16 (the report's f32 and bf16 sides are
    the engine's own)."""
    rows = []
    for name, w in r["workloads"].items():
        peer = ("transformers bf16", w["sides"]["transformers-bfloat16"]["items_per_s"])
        engine = w["sides"]["int8"]["items_per_s"]
        rows.append(
            row(r, 4, f"{name.upper()} in int8 compute", [peer], dtype="int8", engine=engine)
        )
    return rows


def read_embed(r: dict) -> list[Row]:
    order, what = EMBED_KINDS[r.get("kind", "dense")]
    baseline = r["baseline"]
    peer = (f"{baseline['name']}, batch {baseline['batch_size']}", baseline["items_per_s"])
    return [row(r, order, f"{what}: {r['items']:,} texts", [peer])]


READERS: dict[str, Callable[[dict], list[Row]]] = {
    "w1": read_w1,
    "w2": read_w2,
    "w3": read_w3,
    "int8": read_int8,
    "embed": read_embed,
}


def machine(report: dict, stem: str) -> tuple[int, str]:
    """(0 CPU | 1 GPU, the machine's heading), as the report names it."""
    tag = stem.rsplit("-", 1)[-1]
    peaks = report.get("peak_gflops") or {}
    cpu = peaks.get("cpu")
    if cpu is None:
        raise Skipped("names no CPU (no peak_gflops.cpu: an older report, or one without peaks)")
    isa = peaks.get("matrix_isa")
    host = f"{re.sub(TRADEMARKS, '', cpu)}, {ISAS.get(isa, isa)}, {report.get('cores', '?')} cores"
    if report.get("jax_backend") == "gpu":
        note = report.get("note", "")
        gpus = {k for k in GPUS if re.search(rf"\b{k}\b", note, re.I)} | ({tag} & GPUS.keys())
        if len(gpus) != 1:
            raise Skipped(f"a GPU run naming {len(gpus)} GPUs (its note, its file name's tag)")
        return 1, f"{GPUS[gpus.pop()]} (host: {host})"
    if report.get("jax_backend") != "cpu":
        raise Skipped(f"jax_backend {report.get('jax_backend')!r}: no machine kind for it")
    if tag not in CPU_TAGS:
        return 0, host
    name, vendor = CPU_TAGS[tag]
    if vendor not in cpu:
        raise Skipped(f"its file name says {name}, the report {cpu}")
    return 0, f"{name}: {host}"


def read(path: Path, dates: Callable[[str], tuple[str, int]]) -> list[Measured]:
    """The rows of one report; `Skipped` where it has none the tables can use."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Skipped(f"not JSON: {e}") from None
    workload = report.get("workload") if isinstance(report, dict) else None
    if workload is None:
        raise Skipped("no 'workload': not a measurement (a plan?)")
    if workload not in READERS:
        raise Skipped(f"{workload}: {ALONE}")
    where = machine(report, path.stem)
    try:
        rows = READERS[workload](report)
    except (KeyError, TypeError) as e:
        raise Skipped(f"{workload}: a field this reader needs is missing ({e})") from None
    commit = report.get("commit") or "?"
    if "commit_time" in report:  # recorded with the report (`common.environment`)
        date, time = report["commit_date"], report["commit_time"]
    else:
        date, time = dates(commit.removesuffix("-dirty"))
    return [Measured(where, row, commit, date, time, path.name) for row in rows]


def collect(paths, dates=common.commit_date) -> tuple[list[Measured], dict[str, str]]:
    """The newest row per (machine, workload, model, dtype), and each report left out, with
    why."""
    newest: dict[tuple, Measured] = {}
    skipped = {}
    for path in sorted(paths):
        try:
            measured = read(path, dates)
        except Skipped as e:
            skipped[path.name] = str(e)
            continue
        for m in measured:
            key = (m.machine, m.row.order, m.row.model, m.row.dtype)  # the newest of each
            if key not in newest or (m.time, m.report) > (newest[key].time, newest[key].report):
                newest[key] = m
    order = lambda m: (m.machine, m.row.order, m.row.model, m.row.dtype)
    return sorted(newest.values(), key=order), skipped


# -- writing tables -----------------------------------------------------------------------------


def rate(x: float) -> str:
    """items/s to about three significant figures."""
    digits = 0 if x >= 100 else 1 if x >= 10 else 2 if x >= 0.1 else 3
    return f"{x:,.{digits}f}"


def ratio(x: float) -> str:
    digits = 0 if x >= 100 else 1 if x >= 10 else 2
    return f"{x:.{digits}f}×"


COLUMNS = ["workload", "model", "dtype", "engine items/s", "peer", "peer items/s", "engine / peer"]
HEAD = [COLUMNS + ["commit, date"], ["---"] * 3 + ["---:", "---", "---:", "---:", "---"]]


def table(rows: list[Measured]) -> str:
    """A machine's table: a line per peer of each row, the engine's side on its first."""
    cells = list(HEAD)
    for m in rows:
        r = m.row
        first = [r.workload, r.model, DTYPES.get(r.dtype, r.dtype), rate(r.engine)]
        for i, (peer, items) in enumerate(r.peers):
            engine_side = first if i == 0 else [""] * len(first)
            when = f"`{m.commit}`, {m.date or 'date unknown'}" if i == 0 else ""
            cells.append([*engine_side, peer, rate(items), ratio(r.engine / items), when])
    reports = ", ".join(f"`{name}`" for name in sorted({m.report for m in rows}))
    return "\n".join("| " + " | ".join(c) + " |" for c in cells) + f"\n\nReports: {reports}."


def section(measured: list[Measured]) -> str:
    """The generated part of the page: a heading and a table per machine kind."""
    parts = []
    for where in sorted({m.machine for m in measured}):
        rows = [m for m in measured if m.machine == where]
        dates = sorted(m.date for m in rows if m.date) or ["date unknown"]
        span = " to ".join(dict.fromkeys([dates[0], dates[-1]]))
        parts.append(f"### {where[1]}\n\nMeasured {span}.\n\n{table(rows)}")
    return "\n\n".join(parts)


def rewrite(page: str, generated: str) -> str:
    """The page with the text between its markers replaced by `generated`."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"the page needs one {BEGIN} and, after it, one {END}")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n\n{generated}\n\n{END}{tail}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench summary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--figures", type=Path, default=FIGURES, help="the reports' folder")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to rewrite")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the page is stale; write nothing"
    )
    args = parser.parse_args(argv)
    measured, skipped = collect(args.figures.glob("*.json"))
    for where in sorted({m.machine for m in measured}):
        print(f"{where[1]}: {sum(m.machine == where for m in measured)} rows")
    for name, why in skipped.items():
        print(f"left out {name}: {why}")
    page = args.page.read_text()
    try:
        new = rewrite(page, section(measured))
    except ValueError as e:
        sys.exit(f"{args.page}: {e}")
    if new == page:
        print(f"{args.page} is current")
    elif args.check:
        diff = difflib.unified_diff(
            page.splitlines(), new.splitlines(), "page", "reports", lineterm="", n=0
        )
        print("\n".join(list(diff)[:40]))
        sys.exit(f"{args.page} is stale: python -m bench summary")
    else:
        args.page.write_text(new)
        print(f"{args.page} rewritten")


if __name__ == "__main__":
    main()
