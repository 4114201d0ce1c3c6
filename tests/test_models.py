"""Each model family against transformers on tiny random checkpoints (f32, one by one)."""

import jax.numpy as jnp
import numpy as np
import pytest

from bench.baseline import hf_label_logprobs
from engine import load_model
from engine.models.decoder import HEAD_ROWS, _by_row_chunks
from kernels import devices
from tests.conftest import FAMILY_CONFIGS


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_family_matches_transformers(name, tiny_checkpoints, rng):
    import torch
    import transformers

    path = tiny_checkpoints[name]
    # eager: the attention that applies Gemma 2's score soft-capping
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = load_model(path, dtype="float32")
    lengths = [1, 2, 7, 33, 64, 150, 300]  # 300 > llama3-scaled's original context of 64
    seqs = [rng.integers(0, 384, n).tolist() for n in lengths]
    labels = [5, 17, 383]
    ours = model.label_logprobs(seqs, [labels] * len(seqs))
    ref = hf_label_logprobs(hf, seqs, labels)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_many_score_rows_equal_one_by_one(reference, rng):
    """More score rows than one head step (`HEAD_ROWS`, not a multiple of it) in one packed batch
    give each row's log-probs as scoring it alone does."""
    prompt = rng.integers(0, 384, 40).tolist()
    seqs = [prompt + rng.integers(0, 384, 3).tolist() for _ in range(HEAD_ROWS + 37)]
    labels = [[5, 17, 383]] * len(seqs)
    packed = reference.label_logprobs(seqs, labels)
    alone = np.concatenate([reference.label_logprobs([s], labels[:1]) for s in seqs])
    # a GPU's matmuls of another shape sum f32 in another order: 2 of 495 log-probs 1.1e-5 (20
    # ulps) apart at -5.9 on an H100
    rtol = 0 if devices.backend() == "cpu" else 4e-6
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=rtol)


@pytest.mark.parametrize("rows", [3, HEAD_ROWS, 2 * HEAD_ROWS + 5])
def test_head_row_chunks_keep_row_order(rows, rng):
    h = jnp.asarray(rng.standard_normal((rows, 8)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 8, (rows, 3)), jnp.int32)
    f = lambda h, labels: jnp.take_along_axis(h, labels, axis=1) * 2.0
    np.testing.assert_array_equal(_by_row_chunks(f, h, labels), f(h, labels))


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_sliding_windows_packed_equal_one_by_one(name, tiny_checkpoints, rng):
    """Sequences sharing a prefix longer than the 16-key window, packed into one batch, score as
    each does alone: the window cuts into the shared prefix or past it, per token."""
    model = load_model(tiny_checkpoints[name], dtype="float32", progress=False)
    assert model.config.window == 16
    prefix = rng.integers(0, 384, 40).tolist()
    seqs = [prefix + rng.integers(0, 384, n).tolist() for n in (1, 5, 15, 16, 17, 40)]
    seqs += [rng.integers(0, 384, 70).tolist()]
    labels = [[5, 17, 383]] * len(seqs)
    packed = model.label_logprobs(seqs, labels)
    alone = np.concatenate([model.label_logprobs([s], labels[:1]) for s in seqs])
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)
