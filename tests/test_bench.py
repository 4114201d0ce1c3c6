"""The benchmark programs in their quickest form on the tiny checkpoint: each writes a JSON report
with positive throughput figures and a PNG chart. Timings are measured, never asserted."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import msgspec
import numpy as np
import pytest

from bench import __main__ as entry
from bench import bench_attention, common, embed, peak, sides, w1, w2, w3
from bench.colbert_models import write_colbert
from bench.flops import Cost, common_prefix, shared_prefix_flops
from bench.retrieval_models import write_m3, write_splade
from engine.kinds import Output
from engine.models import ModelConfig
from tests.conftest import CORPUS, TINY_ENCODER

QUICK = ["--quick", "--dtype", "float32", "--token-budget", "512", "--no-progress"]


def positive(report: dict, *keys: str) -> None:
    for key in keys:
        value = report[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, value)


@pytest.fixture
def tiny(tiny_checkpoints):
    return str(tiny_checkpoints["llama-untied"])


def run(main, tiny, tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    main(["--model", tiny, *QUICK, "--json", str(out), *extra])
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    positive(report, "engine_items_per_s", "baseline_items_per_s", "ratio")
    peaks = report["peak_gflops"]
    assert peaks["bfloat16"] > 0 and peaks["float32"] > 0
    # the bf16 peak is the fastest path's, named with the CPU it ran on
    assert peaks["bfloat16"] == max(max(by_size.values()) for by_size in peaks["by_path"].values())
    assert peaks["by_path"][peaks["bfloat16_path"]] and peaks["cpu"]
    assert "xla" in peaks["by_path"] and ("torch" in peaks["by_path"])  # torch: a test dependency
    assert report["model"] == "llama-untied"  # the checkpoint's name, not where it lies
    assert report["baseline_device"] == "cpu"  # the default
    recorded = {k: v for k, v in report.items() if k != "argv"}  # argv: the command as typed
    assert not [s for s in strings(recorded) if s.startswith("/") or str(tmp_path) in s]
    return report


def strings(value) -> list[str]:
    """Every string in a JSON value, keys aside."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_w1_rerank_batch(tiny, tmp_path, capsys):
    report = run(w1.main, tiny, tmp_path, "w1")
    assert report["items"] == 8 and report["workload"] == "w1"
    positive(report["engine"], "tokens_per_s", "mfu", "flops")
    positive(report["baseline"], "tokens_per_s", "mfu", "flops")
    assert set(report["baseline"]["per_batch_size"]) == {"1", "4"}
    assert report["max_abs_logprob_diff_vs_baseline"] < 1e-3  # same scores, f32
    # start-up (load + the bucket grid, compiled before the first request) is reported apart
    assert report["engine"]["startup_s"] > 0 and report["engine"]["startup_compiles"] > 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one summary line
    assert "transformers (cpu)" in out and "engine start-up " in out
    png = tmp_path / "w1.png"
    png.unlink()
    entry.main(["chart", str(tmp_path / "w1.json")])  # redrawn from the report alone
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("workload", [w1, w2])
def test_engine_only_times_the_engine_alone(workload, tiny, tmp_path, capsys):
    out = tmp_path / "engine-only.json"
    numbers = workload.main(["--model", tiny, *QUICK, "--engine-only", "--json", str(out)])
    positive(numbers, "items_per_s", "best_s", "mfu")
    assert not out.exists() and "baseline" not in numbers  # no transformers side, no report
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("engine: passes ") and f"{numbers['items_per_s']:.2f} items/s" in line


def test_tensor_parallel_reaches_the_engine(tiny, tmp_path):
    """On 2 host devices: one runner over both scores W2; over 3, more than there are, the
    engine refuses the field."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    root = Path(common.__file__).resolve().parents[1]

    def w2_over(devices: int) -> subprocess.CompletedProcess:
        argv = ["--model", tiny, *QUICK, "--engine-only", "--tensor-parallel", str(devices)]
        command = [sys.executable, "-m", "bench", "w2", *argv]
        # a loaded 2-core machine compiles slowly
        run = dict(cwd=root, env=env, capture_output=True, text=True, timeout=600)
        return subprocess.run(command, **run)

    two = w2_over(2)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.strip().splitlines()[-1].startswith("engine: passes ")
    three = w2_over(3)
    assert three.returncode != 0 and "tensor_parallel: must be from 1 to the 2" in three.stderr


def test_a_slow_reference_gemm_ends_the_sizes_of_the_peak(monkeypatch):
    # torch's scalar bf16 loop on a CPU without AVX-512 would otherwise take half an hour
    monkeypatch.setattr(peak, "SLOW_CALL_S", 0.0)
    slow = peak.torch_gflops((64, 128), repeats=1)
    assert list(slow) == [64] and slow[64] > 0
    monkeypatch.setattr(peak, "SLOW_CALL_S", 1e9)
    assert list(peak.torch_gflops((64, 128), repeats=1)) == [64, 128]


def test_w2_large_multi_item(tiny, tmp_path):
    report = run(w2.main, tiny, tmp_path, "w2", "--items", "6")
    positive(report, "naive_items_per_s", "ratio_vs_naive")
    positive(report["engine"], "tokens_per_s", "mfu")
    assert report["naive_baseline"]["extrapolated_from_items"] == 2
    check = report["score_check"]  # the prefix-reuse baseline scores what the engine scores
    assert check["ok"] and check["items_compared"] == 6
    assert check["max_abs_logprob_diff_naive_vs_prefix"] < 1e-3
    # the FLOP count follows the engine's own plan: the prompt once, then the items' tokens
    engine = report["engine"]
    assert engine["real_tokens_computed"] == engine["real_tokens_stats"]
    assert 6 * 20 <= engine["real_tokens_computed"] <= 100 + 6 * 20
    assert report["workload_tokens"] == 6 * (100 + 20)


def test_w3_serving(tiny, tmp_path):
    report = run(w3.main, tiny, tmp_path, "w3")
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4]
    for level in report["levels"]:
        assert level["errors"] == 0 and level["lost"] == 0
        assert level["ok"] == level["requests"] > 0
        positive(level, "items_per_s", "tokens_per_s", "p50_ms", "device_busy_fraction")
        positive(level, "vs_offline")
        assert level["p50_ms"] <= level["p95_ms"] <= level["p99_ms"]
    offline = report["offline"]
    assert offline["requests"] == 16  # the --quick pool, every body once per pass
    positive(offline, "items", "items_per_s", "wall_s")


def test_baseline_device_option(monkeypatch, capsys):
    import torch

    assert w1.parse([]).baseline_device == "cpu" == w2.parse(["--quick"]).baseline_device
    assert w2.parse(["--baseline-device", "cpu"]).baseline_device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as refused:
        w2.parse(["--baseline-device", "cuda"])
    assert refused.value.code == 2  # argparse's usage error, before any measurement
    assert "--baseline-device cuda" in capsys.readouterr().err


def test_cuda_baseline_leaves_gpu_memory_for_torch(monkeypatch):
    import torch

    for name in common.JAX_MEMORY_VARS:  # unset for the test, restored after it
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    w1.parse(["--baseline-device", "cpu"])
    assert not [name for name in common.JAX_MEMORY_VARS if name in os.environ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    w1.parse(["--baseline-device", "cuda"])
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    for name in common.JAX_MEMORY_VARS:  # a user's own setting of any of them stands
        env = {name: "0.5"}
        common.share_gpu_memory(env)
        assert env == {name: "0.5"}


def test_a_baseline_batch_size_out_of_memory_is_left_out(capsys):
    """A GPU shared with the engine may not hold the baseline's largest batch: that size is left
    out with a warning, the others are kept; none fitting is an error."""
    import torch

    def run(bs: int) -> dict:
        if bs >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1010.00 MiB")
        return {"best_s": 1.0 / bs}

    assert sides.each_batch_size_that_fits([8, 64, 32, 128], run) == {
        8: {"best_s": 0.125},
        32: {"best_s": 1.0 / 32},
    }
    err = capsys.readouterr().err
    assert "bs=64: out of device memory, left out" in err and "bs=128" in err
    with pytest.raises(RuntimeError, match=r"every batch size \[64, 128\] ran out"):
        sides.each_batch_size_that_fits([64, 128], run)


def test_parsing_starts_no_jax_backend():
    """JAX reads its memory variables when it creates a backend: parsing must come first."""
    code = (
        "import bench.__main__; from bench import w1, w2; w1.parse(['--quick']); w2.parse([]); "
        "from jax._src import xla_bridge; assert not xla_bridge.backends_are_initialized()"
    )
    root = Path(common.__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=120)


def test_report_stands_without_matplotlib(tmp_path, capsys):
    def chart(report, png):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    args = common.parser("x").parse_args(["--json", str(tmp_path / "r.json")])
    path = common.publish({"workload": "w1", "dtype": "float32"}, args, "tiny", chart, "fine")
    assert json.loads(path.read_text()) == {"workload": "w1", "dtype": "float32"}
    out = capsys.readouterr()
    assert out.out == f"w1 tiny float32: fine -> {path}\n" and "matplotlib" in out.err


def test_reports_name_the_model_never_its_path(tmp_path):
    args = common.parser("x").parse_args([])
    gguf = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    env = common.environment(args, gguf, CFG)
    assert env["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert common.report_tag(env) == "SmolLM2-135M-Instruct.Q4_1"
    assert common.environment(args, tmp_path / "qwen3-0.6b-seed0", CFG)["model"] == (
        "qwen3-0.6b-seed0"
    )
    argv = ["--model", "../m/x.gguf", "--repeats", "3", "--python", "/v/bin/python", "--json", "r"]
    assert common.command_line(argv) == [
        "--model", "x.gguf", "--repeats", "3", "--python", "python", "--json", "r"
    ]  # fmt: skip


def test_a_report_names_its_commit_and_whether_the_tree_differs(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    assert common.git_commit(tmp_path) is None  # not a repository
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    git("tag", "v1")  # a tag does not replace the commit's name
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "--short=7", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert common.git_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert common.git_commit(tmp_path) == f"{head}-dirty"


def test_committed_reports_name_their_model():
    reports = sorted((Path(common.__file__).parent / "figures").glob("*.json"))
    assert reports
    for path in reports:
        report = json.loads(path.read_text())
        assert report["model"] and "/" not in report["model"], (path.name, report["model"])
        assert report.get("argv", []) == common.command_line(report.get("argv", [])), path.name


def test_entry_point_dispatches_and_lists_workloads(capsys):
    entry.main([])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in ("w1", "w2", "w3"))
    with pytest.raises(SystemExit, match="unknown workload"):
        entry.main(["w9"])


CFG = ModelConfig(
    family="llama",
    vocab_size=100,
    hidden_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    norm_eps=1e-6,
    rope_theta=1e4,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)


def test_flops_count_params_keys_and_score_rows():
    cost = Cost.of(CFG)
    # per layer: wq 8x8, wk 8x4, wv 8x4, wo 8x8, MLP 3 x 8x16
    assert cost.params == 2 * (64 + 32 + 32 + 64 + 384)
    assert cost.per_key == 4 * 4 * 2 * 2 and cost.per_row == 2 * 8 * 100
    # a 3-token prefix, suffixes of 1 and 2: keys 1+2+3, then 4, then 4+5
    assert cost.chunk(3, [1, 2]) == cost.per_token * 6 + cost.per_key * 19 + cost.per_row * 2
    alone = cost.chunk(0, [4]) + cost.chunk(0, [5])
    assert cost.sequences([[1] * 4, [1] * 5]) == alone
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5, 6]]
    assert common_prefix(seqs) == 3 and common_prefix([[1, 2], [1, 2]]) == 1
    assert shared_prefix_flops(cost, seqs) == (cost.chunk(3, [1, 2]), 6)


def test_metrics_text_is_parsed():
    text = (
        "# HELP scoring_batches_total x\n# TYPE scoring_batches_total counter\n"
        'scoring_batches_total 7.0\nscoring_batch_tokens_total{kind="real"} 1.5e+03\n'
    )
    assert w3.parse_metrics(text) == {
        "scoring_batches_total": 7.0,
        'scoring_batch_tokens_total{kind="real"}': 1500.0,
    }
    assert np.isclose(w3.cpu_seconds(-1), 0.0)


def test_w4_chunked_traffic_cache_on_and_off(tiny, tmp_path):
    from bench import w4

    out = tmp_path / "w4.json"
    w4.main(["--model", tiny, *QUICK, "--json", str(out), "--repeats", "1"])
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    on, off = report["sides"]["on"], report["sides"]["off"]
    for side in (on, off):
        for mode in ("one", "sequential", "parallel", "rerank"):
            positive(side[mode], "items_per_s")
    # requests 2..4 of a pass read the prompt request 1 computed; without the cache none does
    assert on["sequential"]["cache_hit_tokens"] > 0 and on["sequential"]["cached_tokens"] > 0
    assert off["sequential"]["cache_hit_tokens"] == off["sequential"]["cached_tokens"] == 0
    assert report["max_logprob_deviation_on_vs_off"] < 1e-4  # same scores, f32
    positive(report["on_over_off"], "sequential", "parallel", "rerank")


def test_w4_on_ray_serve_with_each_router(tiny, tmp_path):
    from bench import w4_ray

    out = tmp_path / "w4-ray.json"
    w4_ray.main(["--model", tiny, *QUICK, "--json", str(out)])
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    sides = report["sides"]
    assert list(sides) == ["prefix", "hash", "default"]
    for side in sides.values():
        positive(side, "items_per_s", "prompt_tokens_computed", "startup_s")
        assert sum(side["requests_per_replica"]) == 2 * 4  # --quick: 2 users, 4 requests each
    # affinity and hashing keep each user on one replica, whose cache gives its prompt back
    for router in ("prefix", "hash"):
        assert sides[router]["most_replicas_per_user"] == 1 and sides[router]["cached_tokens"] > 0
    assert report["max_logprob_deviation_between_routers"] < 1e-4  # same scores, f32
    positive(report["over_default"]["prefix"], "items_per_s", "prompt_tokens_computed")


def test_int8_beside_bf16_and_f32(tiny, tmp_path):
    from bench import int8

    out = tmp_path / "int8.json"
    report = int8.main(["--model", tiny, *QUICK, "--json", str(out)])
    assert out.with_suffix(".png").stat().st_size > 1000
    assert json.loads(out.read_text())["workloads"].keys() == {"w1", "w2"}
    for workload in report["workloads"].values():
        sides = workload["sides"]
        assert list(sides) == [
            *("float32", "bfloat16", "int8", "int8-gptq", "int8-gptq-down-bf16"),
            "int8-smoothed",
            "transformers-bfloat16",
        ]
        assert sides["float32"]["max_abs_logprob_dev_vs_f32"] == 0
        assert sides["float32"]["spearman_vs_f32"] == pytest.approx(1)
        assert sides["float32"]["kendall_tau_vs_f32"] == 1
        assert all(-1 <= s["kendall_tau_vs_f32"] <= 1 for s in sides.values())
        # int8 approximates f32, more coarsely than bf16 on this random model's scores
        # measured 0.046-0.057 (int8, mean) and 0.038-0.052 (transformers bf16, max) in nats;
        # a wrong scale or layout is whole nats off
        assert 0 < sides["int8"]["mean_abs_logprob_dev_vs_f32"] < 0.25
        gptq = sides["int8-gptq"]["mean_abs_logprob_dev_vs_f32"]
        down_bf16 = sides["int8-gptq-down-bf16"]["mean_abs_logprob_dev_vs_f32"]
        smoothed = sides["int8-smoothed"]["mean_abs_logprob_dev_vs_f32"]
        assert 0 < gptq < 0.25 and 0 < down_bf16 < 0.25 and down_bf16 != gptq
        assert 0 < smoothed < 0.25 and smoothed != sides["int8"]["mean_abs_logprob_dev_vs_f32"]
        assert sides["transformers-bfloat16"]["max_abs_logprob_dev_vs_f32"] < 0.25
        positive(workload, "int8_over_bf16", "int8_gptq_over_bf16", "int8_over_transformers_bf16")
        positive(workload, "int8_gptq_down_bf16_over_bf16", "int8_smoothed_over_bf16")


def test_int8_deviation_splits_the_margins_shift_from_their_spread():
    from bench.int8 import deviation

    reference = np.log([[0.6, 0.3], [0.2, 0.7], [0.4, 0.5], [0.1, 0.8]])  # (yes, no) per item
    shifted = reference + [0.3, -0.1]  # every margin up by 0.4: no item moves past another
    same_order = deviation(shifted, reference)
    assert same_order["margin_shift_vs_f32"] == pytest.approx(0.4)
    assert same_order["margin_spread_vs_f32"] == pytest.approx(0, abs=1e-12)
    assert same_order["kendall_tau_vs_f32"] == 1
    assert same_order["mean_abs_logprob_dev_vs_f32"] == pytest.approx(0.2)
    moved = reference.copy()
    moved[2, 0] += 1  # the third margin, -0.22, now passes the first's 0.69
    apart = deviation(moved, reference)
    assert apart["margin_shift_vs_f32"] == pytest.approx(0.25)
    assert apart["margin_spread_vs_f32"] == pytest.approx(np.std([0, 0, 1, 0]))
    assert apart["kendall_tau_vs_f32"] < 1


def test_dense_paths_side_by_side(tiny, tmp_path):
    from bench import dense_paths
    from score_kernels import cpu, onednn

    out = tmp_path / "dense.json"
    quick = [q for q in QUICK if q not in ("--dtype", "float32")]
    report = dense_paths.main(["--model", tiny, *quick, "--json", str(out)])
    assert out.with_suffix(".png").stat().st_size > 1000
    assert json.loads(out.read_text())["workloads"].keys() == {"w1", "w2"}
    forced = ["xla", *["cpu"] * cpu.DENSE_AVAILABLE, *["onednn"] * onednn.AVAILABLE]
    for workload in report["workloads"].values():
        assert list(workload["paths"]) == ["default", *forced]
        best = max(workload["paths"][p]["items_per_s"] for p in forced)
        for side in workload["paths"].values():
            positive(side, "items_per_s", "over_best_forced")
            assert side["over_best_forced"] == pytest.approx(side["items_per_s"] / best)
            assert side["max_abs_logprob_diff_vs_first"] < 0.1  # all bf16, rounding apart
        if len(forced) > 1:  # the default measured its candidates, and names what it chose
            shapes = workload["choice"]["shapes"]
            # in bf16 the q/k/v is chosen as the q/k/v form (its bias, split and RoPE fused),
            # o and down as the residual form (the add onto the stream fused)
            assert {s["kind"] for s in shapes} == {"gated", "qkv", "residual", "head"}
            assert all(s["chosen"] in forced for s in shapes)


def test_dense_paths_in_f32_agree_to_f32_rounding(tiny, tmp_path):
    from bench import dense_paths
    from score_kernels import cpu

    forced = ["xla", *["cpu"] * cpu.F32_AVAILABLE]
    assert dense_paths.paths("float32") == [None, *forced]
    quick = [q for q in QUICK if q not in ("--dtype", "float32")]
    argv = ["--model", tiny, *quick, "--mode", "float32", "--workloads", "w1"]
    report = dense_paths.main([*argv, "--json", str(tmp_path / "dense.json")])
    paths = report["workloads"]["w1"]["paths"]
    assert list(paths) == ["default", *forced]
    for side in paths.values():
        positive(side, "items_per_s", "over_best_forced")
        assert side["max_abs_logprob_diff_vs_first"] < 1e-4  # f32 on every path


def test_dashboard_screenshot_under_load(tiny, tmp_path):
    from bench import dashboard_shot

    png = tmp_path / "dashboard.png"
    report = dashboard_shot.main(["--model", tiny, *QUICK, "--png", str(png)])
    assert png.stat().st_size > 10_000 and report["requests"] > 0 and report["errors"] == 0


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A tiny BERT cross-encoder (head_dim 64, norms and biases moved off 1 and 0)."""
    from bench.encoders import write_encoder
    from tests.conftest import CORPUS, TINY_ENCODER

    fields = dict(TINY_ENCODER, type_vocab_size=2)
    path = tmp_path_factory.mktemp("cross-encoder") / "bert-tiny"
    return write_encoder(
        path,
        "BertConfig",
        fields,
        "bert",
        seed=3,
        corpus=CORPUS,
        model_max_length=128,
        vocab=300,
        perturb=0.3,
    )


def test_paired_turns_are_refused_for_a_decoder(capsys):
    with pytest.raises(SystemExit):
        w1.main([*QUICK, "--paired", "2"])
    assert "--paired: cross-encoders only" in capsys.readouterr().err


def test_w1_cross_encoder(tiny_cross_encoder, tmp_path, capsys):
    out = tmp_path / "w1.json"
    argv = ["--model", str(tiny_cross_encoder), *QUICK, "--paired", "3", "--json", str(out)]
    w1.main(argv)  # dispatched
    report = json.loads(out.read_text())
    assert (report["workload"], report["kind"], report["family"]) == ("w1", "cross-encoder", "bert")
    paired = report["paired"]
    assert paired["rounds"] == 3 and paired["batch_size"] == report["baseline"]["batch_size"]
    assert len(paired["engine_times_s"]) == len(paired["baseline_times_s"]) == 3
    ratios = np.array(paired["baseline_times_s"]) / np.array(paired["engine_times_s"])
    assert paired["ratio_median"] == pytest.approx(float(np.median(ratios)))
    assert paired["ratio_min"] == pytest.approx(ratios.min()) and ratios.min() > 0
    assert report["items"] == 8 and report["model"] == "bert-tiny"
    positive(report, "engine_items_per_s", "baseline_items_per_s", "ratio")
    positive(report["engine"], "tokens_per_s", "mfu", "flops")
    positive(report["baseline"], "tokens_per_s", "mfu", "flops")
    assert report["engine"]["flops"] == report["baseline"]["flops"]  # the same pairs, whole
    assert set(report["baseline"]["per_batch_size"]) == {"4", "8"}
    low, high = report["engine_score_range"]
    assert high - low > 1e-2  # scores far apart, so that agreeing says something
    # CrossEncoder's raw logits, f32: measured 7.2e-7 (docs/performance-history.md: "within 2e-6")
    assert report["max_abs_score_diff_vs_baseline"] < 2e-6
    recorded = {k: v for k, v in report.items() if k != "argv"}
    assert not [s for s in strings(recorded) if s.startswith("/")]
    assert capsys.readouterr().out.count("\n") == 1  # one summary line
    png = out.with_suffix(".png")
    assert png.stat().st_size > 1000
    png.unlink()
    entry.main(["chart", str(out)])  # redrawn from the report alone
    assert png.stat().st_size > 1000


def test_encoder_flops_see_the_whole_pair_or_the_window():
    from bench.flops import encoder_flops, window_keys

    bert = msgspec.structs.replace(
        CFG, family="bert", num_kv_heads=2, num_labels=1, encoder=True, gated_mlp=False
    )
    # per layer: wq, wk, wv, wo 8x8, MLP up and down 8x16; attention 4 x 8 per (token, key)
    assert Cost.of(bert).params == 2 * (4 * 64 + 2 * 128)
    head = 2 * 8 * (8 + 1)  # pooler dense and classifier, once per pair
    assert encoder_flops(bert, [3]) == 2 * 1024 * 3 + 32 * 2 * 9 + head
    assert encoder_flops(bert, [3, 2]) == encoder_flops(bert, [3]) + encoder_flops(bert, [2])
    assert window_keys(5, 1) == 2 + 3 + 3 + 3 + 2 and window_keys(3, 8) == 9
    local = msgspec.structs.replace(bert, sliding_window=2, sliding_layers=(True, False))
    assert encoder_flops(local, [3]) == 2 * 1024 * 3 + 32 * (9 + 7) + head


def test_snapshot_records_every_path_and_finds_a_changed_score(tiny, tmp_path, capsys):
    from bench import snapshot

    out = tmp_path / "scores.npz"
    scores = snapshot.main([str(out), "--model", tiny, "--quick", "--no-progress"])
    assert f"{len(scores)} arrays" in capsys.readouterr().out
    kinds = ("w1", "w2", "rerank", "minilm-l6-rerank", "minilm-l6-pairs", "minilm-l6-offline")
    kinds += ("qwen3-cls-tiny-rerank", "qwen3-cls-tiny-pairs", "qwen3-cls-tiny-offline")
    kinds += ("embed", "embed-cut", "embed-tokens", "embed-offline", "embed-tokens-offline")
    assert sorted(scores) == sorted(f"{k}-{d}" for k in kinds for d in ("float32", "bfloat16"))
    assert scores["w1-float32"].shape == (8, 2) and scores["w2-bfloat16"].shape == (8, 2)
    assert np.isfinite(scores["qwen3-cls-tiny-offline-float32"]).all()
    saved = dict(np.load(out))
    assert snapshot.compare(saved, scores) == []
    changed = {**saved, "w2-float32": np.nextafter(saved["w2-float32"], 2.0)}  # one ulp
    assert snapshot.compare(saved, changed) == ["w2-float32"]
    assert snapshot.compare(saved, {k: v for k, v in saved.items() if k != "w1-float32"}) == [
        "w1-float32"
    ]


def test_host_measures_each_workload_on_a_device_that_computes_nothing(tiny, tmp_path):
    from bench import host

    out = tmp_path / "host.json"
    argv = ["--model", tiny, "--quick", "--no-progress", "--no-precompile", "--json", str(out)]
    results = host.main(argv)
    assert json.loads(out.read_text())["w2"]["tokens"] == results["w2"]["tokens"]
    assert [results[w]["requests"] for w in ("w1", "w2", "w3")] == [1, 1, 4]
    assert results["w2"]["tokens"] == 8 * (100 + 20)  # each item's sequence: prompt + item
    for name in ("w1", "w2", "w3"):
        stages = results[name]["stages_us"]
        assert list(stages) == [*host.STAGES, "rest"]
        assert min(stages[s] for s in host.STAGES if s != "queue") > 0
        assert results[name]["us_per_token"] > 0


def test_startup_in_each_mode(tiny, tmp_path):
    from bench import startup

    out = tmp_path / "startup.json"
    report = startup.main(["--model", tiny, "--quick", "--no-progress", "--json", str(out)])
    assert json.loads(out.read_text())["modes"] == report["modes"]
    assert list(report["modes"]) == ["before", "background"]
    for m in report["modes"].values():
        assert m["programs"] == m["grid_programs"] > 1  # the request's shape is one of the grid's
        assert 0 < m["ready_s"] <= m["grid_compiled_s"]
        assert m["first_request_s"] > 0 and m["warm_request_s"] > 0
    assert report["model"] == "llama-untied" and report["token_budget"] == 512
    assert report["compile_workers"] == 1 and "1 at once" in report["description"]


def test_startup_shows_the_grid_compiling(capsys):
    from types import SimpleNamespace

    import trio.testing

    from bench import startup

    engine = SimpleNamespace(stats=lambda: SimpleNamespace(compiles=3))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(startup._show_compiles, engine, 7, 0.0, 20.0)
            await trio.sleep(45)  # on the mock clock: two lines, at 20 and 40 s
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("3 of 7 programs compiled at ") for line in lines)


def test_the_null_program_answers_zeros_of_the_batch_shape(tiny):
    from bench import host
    from bench.host import NullProgram
    from engine import load_model
    from engine.host.packing import empty_batch

    program = load_model(tiny, dtype="float32").program
    null = NullProgram(program)
    null.compile((128, 16, 4), 64)  # compiles nothing
    batch = empty_batch(128, 16, 4, 64)
    out = null.run(batch)
    assert out.shape == (16, 4) and out.dtype == np.float32 and not np.asarray(out).any()
    assert null.run(batch, Output.TOKENS).shape == (128, program.config.hidden_size)
    assert null.kv is program.kv  # the rest is the real program's
    # every array of the batch goes in, as in a real step: none is pruned as unused
    (main,) = [
        line for line in host._nothing.lower(batch, None).as_text().splitlines() if "@main(" in line
    ]
    assert main.count("%arg") == len(jax.tree_util.tree_leaves(batch)) > 5


def test_embed_beside_sentence_transformers(minilm, tmp_path, capsys):
    out = tmp_path / "embed.json"
    embed.main(["--model", str(minilm), *QUICK, "--json", str(out)])
    report = json.loads(out.read_text())
    assert (report["workload"], report["family"], report["items"]) == ("embed", "bert", 16)
    positive(report, "engine_items_per_s", "baseline_items_per_s", "ratio")
    positive(report["engine"], "tokens_per_s", "mfu", "flops")
    assert report["engine"]["flops"] == report["baseline"]["flops"]  # an encoder: each text whole
    assert set(report["baseline"]["per_batch_size"]) == {"8"}
    assert report["max_abs_component_diff_vs_baseline"] < 1e-5  # f32, unit vectors
    assert capsys.readouterr().out.count("\n") == 1  # one summary line
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.parametrize("kind", ["sparse", "bge-m3"])
def test_embed_kinds_beside_their_reference(kind, tmp_path, capsys):
    if kind == "sparse":
        fields = dict(TINY_ENCODER, type_vocab_size=2)
        options = dict(seed=2, corpus=CORPUS, model_max_length=96, vocab=300)
        model = write_splade(tmp_path / "model", "BertConfig", fields, "bert", **options)
    else:
        fields = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
        options = dict(seed=2, corpus=CORPUS, model_max_length=96, vocab=300)
        model = write_m3(tmp_path / "model", fields, **options)
    out = tmp_path / "embed.json"
    embed.main(["--model", str(model), "--kind", kind, *QUICK, "--json", str(out)])
    report = json.loads(out.read_text())
    assert (report["kind"], report["items"]) == (kind, 16)
    positive(report, "engine_items_per_s", "baseline_items_per_s", "ratio")
    assert report["max_abs_component_diff_vs_baseline"] < 1e-4  # f32
    assert report["support_mismatches"] == 0
    if kind == "bge-m3":
        assert report["max_abs_multi_vector_diff_vs_baseline"] < 1e-5
        assert report["max_abs_sparse_diff_vs_baseline"] < 1e-4
    else:
        assert report["nonzero_terms_median"] > 0
    assert capsys.readouterr().out.count("\n") == 1


def test_the_multi_kind_times_a_colbert_model_and_asks_for_pylate(tmp_path, monkeypatch, capsys):
    """`--kind multi` runs the engine's `embed_multi` of documents; its reference, PyLate, runs
    in an environment of its own, which the run asks for by name."""
    model = write_colbert(tmp_path / "colbert", seed=2)
    monkeypatch.delenv("PYLATE_PYTHON", raising=False)
    args = ["--model", str(model), "--kind", "multi", *QUICK]
    report = embed.main([*args, "--engine-only"])
    assert report["items_per_s"] > 0
    with pytest.raises(SystemExit, match="--pylate-python"):
        embed.main([*args, "--json", str(tmp_path / "multi.json")])


def test_attention_text_packing_is_texts_back_to_back() -> None:
    prefix_start, prefix_end, own_start, own_end = bench_attention.text_spans(4096, seed=3)
    assert all(a.shape == (4096,) and a.dtype == np.int32 for a in (own_start, own_end))
    assert not prefix_start.any() and not prefix_end.any()  # no prefixes
    starts, first = np.unique(own_start, return_index=True)
    np.testing.assert_array_equal(first, starts)  # each text's tokens are contiguous
    ends = own_end[first]
    np.testing.assert_array_equal(starts[1:], ends[:-1])  # back to back from token 0
    assert starts[0] == 0 and ends[-1] == 4096  # the last text cut at T
    lengths = ends - starts
    assert lengths[:-1].min() >= 8 and lengths.max() <= 256 and len(lengths) > 20
    t = np.arange(4096)
    assert ((own_start <= t) & (t < own_end)).all()  # every token inside its own text


@pytest.mark.skipif(not bench_attention.cpu.AVAILABLE, reason="native CPU attention not built")
def test_attention_times_each_native_build_in_its_own_build(tmp_path) -> None:
    builds = bench_attention.cpu.available_isas()
    seen = []

    class Probe(bench_attention.NativeBuild):
        def __call__(self, q, k, v, meta, *, scale):
            seen.append(bench_attention.cpu.isa())  # traced inside `run`, after its set_isa
            return super().__call__(q, k, v, meta, scale=scale)

    qkv = tuple(np.ones((64, h, 64), np.float32) for h in (9, 3, 3))
    spans = bench_attention.w2_spans(64, prompt_len=32, item_len=8)
    meta = bench_attention.make_meta(*spans, block_size=16, width_buckets=(1, 2, 4))
    ms = bench_attention.time_kernel(Probe(builds[0]), qkv, meta, 64, repeats=2)
    assert ms > 0 and seen == [builds[0]]
    assert bench_attention.cpu.isa() == builds[-1]  # the widest again afterwards

    out = tmp_path / "attention.json"
    names = [f"cpu-{builds[0]}", f"cpu-{builds[-1]}"]
    args = ["--tokens", "256", "--repeats", "2", "--kernels", *names, "--json", str(out)]
    bench_attention.main(args)
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["ms"]) == set(names) and all(ms > 0 for ms in row["ms"].values())
