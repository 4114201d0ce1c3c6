"""RunnerState: compiling the grid, counting compiles, turning a failing step into an error."""

import numpy as np
import pytest

from engine import load_model, packing
from engine.buckets import default_buckets
from engine.messages import Batch
from engine.packing import empty_batch
from engine.runner import RunnerState, batch_shape


@pytest.fixture(scope="module")
def model(tiny_checkpoints):
    return load_model(tiny_checkpoints["qwen2"], dtype="float32")


def test_empty_batch_has_the_shape_asked_for():
    b = empty_batch(128, 16, 4, 64)
    assert batch_shape(b) == (128, 16, 4)
    assert b.meta.block_kv.shape == (2, 2)


def test_warm_up_compiles_each_shape_once(model):
    runner = RunnerState(model.program, block_size=64)
    runner.warm_up([(128, 4, 4), (128, 16, 4)], progress=False)
    assert runner.stats.compiles == 2
    seqs, labels = [[1, 2, 3]], [[5, 6]]
    buckets = default_buckets(512)
    inputs, *_ = packing.pack(seqs, labels, packing.group_by_prefix(seqs), buckets)
    assert batch_shape(inputs) == (128, 4, 4)
    done = runner.execute(Batch(id=7, inputs=inputs, rows=[(0, 0)], real_tokens=3, build_s=0.0))
    assert runner.stats.compiles == 2 and runner.stats.batches == 1
    np.testing.assert_allclose(
        done.outputs[0, :2], model.label_logprobs(seqs, labels)[0], atol=1e-6
    )


def test_a_raising_step_becomes_the_batch_error(model, monkeypatch):
    runner = RunnerState(model.program, block_size=64)
    monkeypatch.setattr(model.program, "run", lambda inputs: 1 / 0)
    done = runner.execute(
        Batch(id=1, inputs=empty_batch(128, 4, 4, 64), rows=[], real_tokens=0, build_s=0.0)
    )
    assert done.error == "ZeroDivisionError: division by zero" and done.outputs is None
    assert runner.stats.failed == 1
