"""`python -m bench summary`: the tables of docs/performance.md, read from the bench reports, and
the committed page kept current with the committed reports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import summary

ROOT = Path(__file__).resolve().parent.parent
DATES = {"aaaaaaa": ("2026-11-01", 1), "bbbbbbb": ("2026-12-01", 2)}  # commit -> (date, time)
ZEN4 = {"cpu": "AMD EPYC", "matrix_isa": "avx512_bf16"}
SPR = {"cpu": "Intel(R) Xeon(R) Processor", "matrix_isa": "amx"}


def head(workload: str, commit: str, peaks: dict | None, backend: str = "cpu", **facts) -> dict:
    return {
        "workload": workload,
        "model": "SmolLM2-135M",
        "dtype": "bfloat16",
        "cores": 2 if backend == "cpu" else 16,
        "jax_backend": backend,
        "baseline_device": "cpu" if backend == "cpu" else "cuda",
        "commit": commit,
        **({"peak_gflops": peaks} if peaks is not None else {}),
        **facts,
    }


def w1(commit: str, engine: float, transformers: float, vllm: float | None = None) -> dict:
    report = head("w1", commit, ZEN4, items=64, engine_items_per_s=engine)
    report["baseline"] = {"batch_size": 16, "items_per_s": transformers}
    if vllm is not None:
        report["peer"] = {"name": "vllm", "version": "0.32.0", "items_per_s": vllm}
    return report


def w2_gpu(commit: str, engine: float, prefix: float, naive: float) -> dict:
    report = head("w2", commit, SPR, "gpu", items=500, engine_items_per_s=engine)
    report["model"] = "qwen3-0.6b-seed0"
    report["baseline"] = {"batch_size": 128, "items_per_s": prefix}
    report["naive_baseline"] = {"batch_size": 16, "items_per_s": naive}
    return report


def write(folder: Path, reports: dict[str, dict]) -> list[Path]:
    for name, report in reports.items():
        (folder / f"{name}.json").write_text(json.dumps(report))
    return sorted(folder.glob("*.json"))


def tables(tmp_path, reports: dict[str, dict]) -> tuple[str, dict[str, str]]:
    measured, skipped = summary.collect(write(tmp_path, reports), dates=DATES.__getitem__)
    return summary.section(measured), skipped


def test_a_machine_kind_gets_one_table_of_the_newest_reports(tmp_path):
    text, skipped = tables(
        tmp_path,
        {
            "w1-old": w1("aaaaaaa", 18.56, 11.17),  # the same workload, model and dtype, older
            "w1-vllm": w1("bbbbbbb", 8.312, 4.662, vllm=6.647),
            "w2-qwen3-h200": w2_gpu("bbbbbbb-dirty", 8399.6, 459.32, 71.067),
        },
    )
    assert skipped == {}
    assert text == "\n".join(
        [
            "### AMD EPYC, AVX512-BF16, 2 cores",
            "",
            "Measured 2026-12-01.",
            "",
            "| " + " | ".join(summary.COLUMNS) + " | commit, date |",
            "| --- | --- | --- | ---: | --- | ---: | ---: | --- |",
            "| W1 rerank: 1 query, 64 documents | SmolLM2-135M | bf16 | 8.31 | vLLM 0.32.0 | 6.65"
            " | 1.25× | `bbbbbbb`, 2026-12-01 |",
            "|  |  |  |  | transformers, batch 16 | 4.66 | 1.78× |  |",
            "",
            "Reports: `w1-vllm.json`.",
            "",
            "### NVIDIA H200 (host: Intel Xeon Processor, AMX, 16 cores)",
            "",
            "Measured 2026-12-01.",
            "",
            "| " + " | ".join(summary.COLUMNS) + " | commit, date |",
            "| --- | --- | --- | ---: | --- | ---: | ---: | --- |",
            "| W2 multi-item: 2,000-token prompt, 500 items | qwen3-0.6b-seed0 | bf16 | 8,400"
            " | transformers prefix reuse on CUDA, batch 128 | 459 | 18.3× |"
            " `bbbbbbb-dirty`, 2026-12-01 |",
            "|  |  |  |  | transformers naive on CUDA, batch 16 | 71.1 | 118× |  |",
            "",
            "Reports: `w2-qwen3-h200.json`.",
        ]
    )


def test_a_report_dated_with_its_commit_needs_no_git(tmp_path):
    dated = w1("ccccccc", 9.0, 4.5) | {"commit_date": "2026-12-06", "commit_time": 3}
    measured, skipped = summary.collect(
        write(tmp_path, {"w1-old": w1("bbbbbbb", 8.312, 4.662), "w1-new": dated}),
        dates=DATES.__getitem__,  # knows no ccccccc: a KeyError if asked
    )
    assert skipped == {} and [(m.commit, m.date, m.time) for m in measured] == [
        ("ccccccc", "2026-12-06", 3)
    ]


def test_a_tag_names_the_cpu_kind_and_each_kind_its_own_table(tmp_path):
    embed = head("embed", "aaaaaaa", {"cpu": "AMD EPYC", "matrix_isa": "avx2"}, kind="sparse")
    embed |= {"items": 300, "engine_items_per_s": 7.947, "dtype": "float32"}
    embed["baseline"] = {"name": "sentence-transformers SparseEncoder.encode", "batch_size": 32}
    embed["baseline"]["items_per_s"] = 6.042
    text, _ = tables(tmp_path, {"embed-splade-zen3": embed, "w1": w1("aaaaaaa", 8.0, 4.0)})
    assert "### Zen 3: AMD EPYC, AVX2, 2 cores" in text
    assert "### AMD EPYC, AVX512-BF16, 2 cores" in text
    assert (
        "| sparse embeddings (SPLADE): 300 texts | SmolLM2-135M | f32 | 7.95 | "
        "sentence-transformers SparseEncoder.encode, batch 32 | 6.04 | 1.32× | "
        "`aaaaaaa`, 2026-11-01 |"
    ) in text


def test_a_report_it_cannot_place_is_left_out_with_why(tmp_path):
    no_cpu = w1("aaaaaaa", 18.56, 11.17)
    del no_cpu["peak_gflops"]
    no_gpu = w2_gpu("aaaaaaa", 3690.4, 416.3, 61.2)
    intel = w1("aaaaaaa", 8.0, 4.0)
    intel["peak_gflops"] = SPR
    _, skipped = tables(
        tmp_path,
        {
            "w1-smollm2-bf16": no_cpu,
            "w2-gpu": no_gpu,
            "w1-intel-zen3": intel,
            "soak-tiny": head("soak", "aaaaaaa", None),
            "plan-qwen3": {"model": {"family": "qwen3"}},
        },
    )
    assert skipped == {
        "plan-qwen3.json": "no 'workload': not a measurement (a plan?)",
        "soak-tiny.json": "soak: the engine alone, beside no peer",
        "w1-intel-zen3.json": "its file name says Zen 3, the report Intel(R) Xeon(R) Processor",
        "w1-smollm2-bf16.json": (
            "names no CPU (no peak_gflops.cpu: an older report, or one without peaks)"
        ),
        "w2-gpu.json": "a GPU run naming 0 GPUs (its note, its file name's tag)",
    }


def test_int8_rows_set_the_int8_engine_beside_transformers_bf16(tmp_path):
    sides = {"int8": {"items_per_s": 13.946}, "transformers-bfloat16": {"items_per_s": 5.744}}
    report = head("int8", "aaaaaaa", ZEN4, workloads={"w1": {"sides": sides}})
    text, _ = tables(tmp_path, {"int8": report})
    assert (
        "| W1 in int8 compute | SmolLM2-135M | int8 | 13.9 | transformers bf16 | 5.74 | 2.43× |"
        in text
    )


def test_the_section_between_the_markers_is_replaced():
    page = f"lead\n{summary.BEGIN}\nold\n{summary.END}\ntail\n"
    assert summary.rewrite(page, "new") == f"lead\n{summary.BEGIN}\n\nnew\n\n{summary.END}\ntail\n"
    with pytest.raises(ValueError, match="summary:begin"):
        summary.rewrite("no markers\n", "new")


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bench", "summary", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_committed_page_is_current_with_the_committed_reports():
    done = run("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left out plan-smollm2-bf16.json" in done.stdout


def test_check_fails_on_a_stale_page_and_writes_nothing(tmp_path):
    page = tmp_path / "performance.md"
    stale = (ROOT / "docs" / "performance.md").read_text().replace("| 8.31 |", "| 9.99 |")
    page.write_text(stale)
    done = run("--check", "--page", str(page))
    assert done.returncode == 1
    assert "is stale: python -m bench summary" in done.stderr
    assert page.read_text() == stale
