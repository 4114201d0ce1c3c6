"""`torch.save` state dicts read without torch (`engine.loaders.torch_pickle`): every dtype
BGE-M3's heads come in, views with strides and offsets, and files that would run code refused."""

import os

import numpy as np
import pytest
import torch

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.torch_pickle import read_state_dict


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_linear_state_dict_reads_as_its_values(tmp_path, dtype):
    linear = torch.nn.Linear(8, 3).to(dtype)
    torch.save(linear.state_dict(), tmp_path / "linear.pt")
    state = read_state_dict(tmp_path / "linear.pt")
    assert list(state) == ["weight", "bias"]
    for name, tensor in linear.state_dict().items():
        assert state[name].dtype == np.float32
        np.testing.assert_array_equal(state[name], tensor.float().numpy())


def test_views_keep_their_strides_and_offsets(tmp_path):
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    views = {"t": base.t(), "slice": base[2:, 3:7], "row": base[4], "scalar": base[1, 1]}
    torch.save(views, tmp_path / "views.pt")
    state = read_state_dict(tmp_path / "views.pt")
    for name, tensor in views.items():
        np.testing.assert_array_equal(state[name], tensor.numpy())


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo unpickled",))


def test_a_file_that_would_run_code_is_refused(tmp_path):
    torch.save({"x": _Payload()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="refusing to load"):
        read_state_dict(tmp_path / "evil.pt")
    (tmp_path / "text.pt").write_text("not a zip")
    with pytest.raises(CheckpointError, match="not a readable torch state dict"):
        read_state_dict(tmp_path / "text.pt")
