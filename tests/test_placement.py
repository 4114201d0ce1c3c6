"""Data and tensor parallelism (`engine.device.placement`): how devices split into runners,
and, in a subprocess whose CPU has 8 host devices, the same scores from every data x tensor
layout as from one device, with and without the KV cache; many clients spread over the runners;
a runner whose device step fails fails only its batch. And two processes forming one mesh over
127.0.0.1 (JAX's multi-controller runtime, gloo collectives) score as one process."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import trio

from engine import EngineConfig, open_engine
from engine.device.placement import Placement, device_groups
from engine.device.program import DeviceProgram
from engine.errors import InvalidInput
from engine.loaders import load_checkpoint
from score_kernels import cpu
from tests import multi_device, multi_host
from tests.conftest import write_tiny_checkpoint
from tests.multi_device import CLIENTS, LAYOUTS

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-5  # f32, in log-probability


@pytest.mark.parametrize(
    "data,tensor,groups",
    [
        (None, 1, [[0], [1], [2], [3], [4], [5], [6], [7]]),
        (None, 2, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (None, 3, [[0, 1, 2], [3, 4, 5]]),
        (2, 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (1, 8, [list(range(8))]),
        (3, 1, [[0], [1], [2]]),
    ],
)
def test_devices_split_into_runner_groups(data, tensor, groups) -> None:
    assert device_groups(data, tensor, list(range(8))) == groups


@pytest.mark.parametrize(
    "data,tensor,field",
    [(3, 4, "data_parallel"), (0, 1, "data_parallel"), (1, 9, "tensor_parallel"),
     (1, 0, "tensor_parallel"), (True, 1, "data_parallel"), (1, 1.5, "tensor_parallel")],
)  # fmt: skip
def test_layouts_the_devices_cannot_hold_are_refused(data, tensor, field) -> None:
    with pytest.raises(InvalidInput) as e:
        device_groups(data, tensor, list(range(8)))
    assert e.value.field == field


def test_one_device_is_the_default_placement() -> None:
    placement = Placement(jax.local_devices()[:1])
    assert placement.mesh is None and placement.size == 1
    assert device_groups(None, 1) == [jax.local_devices()]


def test_an_engine_asked_for_more_devices_than_there_are_says_which_field(tiny_path) -> None:
    config = EngineConfig(model=tiny_path, data_parallel=len(jax.devices()) + 1, progress=False)

    async def start() -> None:
        async with open_engine(config):
            pass

    with pytest.raises(InvalidInput) as e:
        trio.run(start)
    assert e.value.field == "data_parallel" and "devices" in str(e.value)


def run_probe(model: str, *extra: str) -> list[dict]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "tests.multi_device", model, *extra],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,  # a loaded 2-core machine compiles 8 runners' programs slowly
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def layouts(tiny_checkpoints) -> dict[tuple[int, int, bool], dict]:
    lines = run_probe(str(tiny_checkpoints["qwen3"]))
    return {(d["data"], d["tensor"], d["cache"]): d for d in lines}


def log_scores(scores) -> list[float]:
    return [math.log(p) for request in scores for item in request for p in item]


def test_every_layout_runs(layouts) -> None:
    assert sorted(layouts) == sorted((d, t, c) for d, t in LAYOUTS for c in (True, False))


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no_cache"])
@pytest.mark.parametrize("data,tensor", LAYOUTS[1:])
def test_a_layout_scores_as_one_device(layouts, data: int, tensor: int, cache: bool) -> None:
    one = log_scores(layouts[(1, 1, True)]["scores"])
    got = log_scores(layouts[(data, tensor, cache)]["scores"])
    assert len(got) == len(one) == CLIENTS * 3 * 2
    assert max(abs(a - b) for a, b in zip(got, one, strict=True)) <= TOLERANCE


def test_one_device_equals_transformers(layouts, tiny_checkpoints) -> None:
    """The layouts above are held to one device; one device is held to transformers, each
    prompt + item scored alone."""
    from bench.baseline import hf_label_logprobs, load_transformers

    model = load_transformers(tiny_checkpoints["qwen3"], "float32")
    seqs = [prompt + item for prompt, items in multi_device.requests() for item in items]
    want = hf_label_logprobs(model, seqs, [1, 2]).ravel()
    got = log_scores(layouts[(1, 1, True)]["scores"])
    assert len(got) == len(want) == CLIENTS * 3 * 2
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= TOLERANCE


@pytest.mark.skipif(not cpu.AVAILABLE, reason="the native attention kernel was not built")
def test_a_mesh_runs_the_attention_kernel_on_each_devices_own_heads(tmp_path) -> None:
    """A kernel is opaque to the partitioner: left to it, both devices of a 2-device mesh would
    gather all 4 query heads and compute every one. Split, each computes its own 2, nothing is
    gathered, and the scores (prompts in the KV pool, read back by the kernel) are one
    device's."""
    path = write_tiny_checkpoint(tmp_path, "qwen3", head_dim=64)  # 4 heads, 2 kv heads
    lines = run_probe(str(path), "--heads")
    runs = {d["tensor"]: d for d in lines if "tensor" in d}
    assert (runs[1]["heads"], runs[2]["heads"]) == (4, 2)
    assert runs[2]["all_gathers"] == 0
    one, two = (log_scores(runs[t]["scores"]) for t in (1, 2))
    assert len(two) == len(one) == CLIENTS * 3 * 2
    assert max(abs(a - b) for a, b in zip(two, one, strict=True)) <= TOLERANCE

    # the Mosaic GPU form's interpreter cannot serve two devices at once (it fails, then hangs)
    refused = lines[-1]
    assert refused["mosaic_on_a_mesh"] == "attention" and "one device" in refused["detail"]


def test_one_device_with_and_without_the_cache_agree(layouts) -> None:
    with_cache, without = (log_scores(layouts[(1, 1, c)]["scores"]) for c in (True, False))
    assert max(abs(a - b) for a, b in zip(with_cache, without, strict=True)) <= TOLERANCE


@pytest.mark.parametrize("data,tensor", [(8, 1), (4, 2), (2, 4)])
def test_many_clients_spread_over_the_runners(layouts, data: int, tensor: int) -> None:
    batches = layouts[(data, tensor, False)]["runner_batches"]
    assert len(batches) == data
    # the first batch is held on its runner until another runner takes one (tests.multi_device)
    assert sum(n > 0 for n in batches) >= 2


def test_a_failing_runner_fails_only_its_batch(tiny_checkpoints, layouts) -> None:
    (run,) = run_probe(str(tiny_checkpoints["qwen3"]), "--fault")
    assert run["failed_batches"] == 1
    errors = [s for s in run["scores"] if isinstance(s, str)]
    assert errors and all("injected device fault" in e for e in errors)
    ok = [(i, s) for i, s in enumerate(run["scores"]) if not isinstance(s, str)]
    assert len(ok) >= CLIENTS // 2
    one = layouts[(1, 1, True)]["scores"]
    for i, scores in ok:
        got, want = log_scores([scores]), log_scores([one[i]])
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= TOLERANCE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_form_one_mesh_and_score_as_one(tiny_checkpoints, tmp_path) -> None:
    model = str(tiny_checkpoints["qwen3"])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.multi_host", str(i), port, model, str(tmp_path)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=2 * multi_host.BARRIER_S) for p in procs]
    finally:  # neither outlives the test, whatever failed
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    got = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    program = DeviceProgram(load_checkpoint(model), dtype="float32", kv_cache_bytes=0)
    inputs, n = multi_host.batch()
    want = np.asarray(program.run(inputs))[:n, :2]
    for logprobs in got:
        np.testing.assert_allclose(np.asarray(logprobs), want, atol=TOLERANCE, rtol=0)
