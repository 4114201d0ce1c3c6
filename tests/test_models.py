"""Each model family against transformers on tiny random checkpoints (f32, one by one)."""

import numpy as np
import pytest

from bench.baseline import hf_label_logprobs
from engine import load_model
from tests.conftest import FAMILY_CONFIGS


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_family_matches_transformers(name, tiny_checkpoints, rng):
    import torch
    import transformers

    path = tiny_checkpoints[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = load_model(path, dtype="float32")
    lengths = [1, 2, 7, 33, 64, 150, 300]  # 300 > llama3-scaled's original context of 64
    seqs = [rng.integers(0, 384, n).tolist() for n in lengths]
    labels = [5, 17, 383]
    ours = model.label_logprobs(seqs, [labels] * len(seqs))
    ref = hf_label_logprobs(hf, seqs, labels)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
