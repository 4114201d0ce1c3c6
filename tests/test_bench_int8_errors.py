"""bench int8-errors: its fake int8 is the int8 mode's arithmetic, and its report holds real
measurements of a tiny decoder and of all-MiniLM-L6-v2."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from bench import int8_errors
from bench.parity import kendall_tau
from score_kernels import quant


def test_fake_int8_is_the_int8_arithmetic():
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 40)  # blocks 4 x 128 + 64, all rotated
    x = torch.randn(7, 576) * 3
    x[2, 17] = 200  # an outlier channel
    fake = int8_errors.FakeInt8(linear)(x).detach().numpy()
    q, scale = quant.quantize_columns(linear.weight.detach().numpy().T)
    twin = quant.int8_matmul(jnp.asarray(x.numpy()), jnp.asarray(q), jnp.asarray(scale))
    twin = np.asarray(twin) + linear.bias.detach().numpy()
    # the rotations round differently (a matmul here, butterflies there): a q may differ by one
    assert np.abs(fake - twin).max() < 1e-3 * np.abs(twin).max()
    assert np.abs(fake - twin).mean() < 1e-5 * np.abs(twin).max()


def test_fake_int8_switches_each_source():
    torch.manual_seed(1)
    linear = torch.nn.Linear(256, 32, bias=False)
    x = torch.randn(5, 256)
    exact = (x.to(torch.bfloat16).float() @ linear.weight.T).detach()
    off = int8_errors.FakeInt8(linear, weights=False, acts=False)(x)
    torch.testing.assert_close(off, exact, rtol=1e-5, atol=1e-5)  # the rotations cancel
    errors = {
        name: float((int8_errors.FakeInt8(linear, **opts)(x) - exact).abs().max())
        for name, opts in {
            "weights": dict(acts=False),
            "acts": dict(weights=False),
            "both": {},
        }.items()
    }
    assert all(0 < e < 0.05 for e in errors.values()), errors


def test_smoothing_moves_an_outlier_channel_into_the_weights():
    """SmoothQuant's scales keep the product (but for the bf16 rounding of the smoothed
    activations) and, where a channel carries the activations' outliers, shrink it: the
    activations' int8 error (per column, no rotation) falls."""
    torch.manual_seed(2)
    linear = torch.nn.Linear(256, 32, bias=False)
    x = torch.randn(64, 256)
    x[:, 5] *= 60  # an outlier channel, in every row
    w = linear.weight.detach().double().numpy()
    maxima = x.abs().amax(0).double().numpy()
    smooth = quant.smoothing(maxima, np.abs(w).max(0), alpha=0.5)
    np.testing.assert_allclose(smooth, np.sqrt(maxima) / np.sqrt(np.abs(w).max(0)), rtol=1e-6)
    assert smooth[5] > 5 * np.median(smooth)
    exact = (x.double() @ w.T).float()
    off = int8_errors.FakeInt8(linear, weights=False, acts=False, smooth=smooth)(x)
    torch.testing.assert_close(off, exact, rtol=0, atol=2**-7 * float(exact.abs().max()))
    error = {
        name: float(
            (int8_errors.FakeInt8(linear, weights=False, rotate=False, **opts)(x) - exact)
            .abs()
            .mean()
        )
        for name, opts in {"plain": {}, "smoothed": {"smooth": smooth}}.items()
    }
    assert error["smoothed"] < 0.5 * error["plain"], error
    zero = quant.smoothing(np.zeros(256), np.abs(w).max(0), alpha=0.5)
    np.testing.assert_array_equal(zero, np.ones(256))


class Block(torch.nn.Module):
    """q and k multiply one input, o another."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.o = (torch.nn.Linear(*kn) for kn in ((64, 8), (64, 8), (8, 64)))

    def forward(self, x):
        return self.o(self.q(x) * self.k(x))


class Blocks(int8_errors.Side):
    """Two `Block`s as a measured side (its calibration: 5 random rows)."""

    def __init__(self):
        torch.manual_seed(3)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.calibration = torch.randn(5, 64)

    def _run(self, x):
        for block in self.layers:
            x = block(x)
        return x


def test_matrices_of_one_input_share_its_smoothing():
    """q and k multiply one input (one quantisation of it in the int8 kernels): `recorded` finds
    them together, so `Side.smoothing` gives them one scale; o has its own."""
    side = Blocks()
    layers = side.layers

    def run():
        side._run(side.calibration)

    shares = {}
    maxima = int8_errors.input_maxima(layers, run, shares)
    owners = {(i, k): (i, "o" if k == "o" else "q") for i in (0, 1) for k in "qko"}
    assert shares == owners
    np.testing.assert_array_equal(maxima[(1, "q")], maxima[(1, "k")])
    assert maxima[(0, "o")].shape == (8,)


def test_smoothing_divisor_forms():
    """One divisor per input from the weights of all its matrices; per matrix from each one's
    own; "alone" only where one matrix takes the input (q and k's input left unsmoothed)."""
    side = Blocks()
    shared, own, alone = (side.smoothing(0.5, d) for d in ("input", "matrix", "alone"))
    maxima = int8_errors.input_maxima(side.layers, lambda: side._run(side.calibration))
    weight = lambda i, k: getattr(side.layers[i], k).weight.detach().double().numpy()
    for i in (0, 1):
        both = np.abs(np.concatenate([weight(i, "q"), weight(i, "k")])).max(0)
        expect = quant.smoothing(maxima[(i, "q")], both, 0.5)
        np.testing.assert_array_equal(shared[(i, "q")], expect)
        np.testing.assert_array_equal(shared[(i, "k")], expect)
        for k in "qk":
            mine = quant.smoothing(maxima[(i, k)], np.abs(weight(i, k)).max(0), 0.5)
            np.testing.assert_array_equal(own[(i, k)], mine)
            np.testing.assert_array_equal(alone[(i, k)], np.ones(64))
        assert not np.array_equal(own[(i, "q")], own[(i, "k")])
        np.testing.assert_array_equal(alone[(i, "o")], shared[(i, "o")])
        np.testing.assert_array_equal(own[(i, "o")], shared[(i, "o")])
    with pytest.raises(ValueError, match="divisors"):
        side.smoothing(0.5, "column")


def test_kendall_tau_is_scipys():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(40), rng.standard_normal(40)
    b[:20] = a[:20]
    assert kendall_tau(a, b) == pytest.approx(kendalltau(a, b).statistic, abs=1e-12)
    assert kendall_tau(a, a) == 1 and kendall_tau(a, -a) == -1


def test_a_decoders_report(tiny_path, tmp_path):
    out = tmp_path / "errors.json"
    args = ["--model", tiny_path, "--docs", "6", "--doc-tokens", "12", "24", "--calibration", "2"]
    report = int8_errors.main([*args, "--divisor-forms", "--no-progress", "--json", str(out)])
    assert json.loads(out.read_text())["methods"].keys() == report["methods"].keys()
    assert sum("a divisor per matrix" in m for m in report["methods"]) == 2
    assert sum("where one matrix takes the input" in m for m in report["methods"]) == 1
    kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert [k.rpartition(".")[2] for k in report["matmuls"]] == kinds
    assert list(report["layers"]) == ["0", "1"]
    entries = [
        *report["sources"].values(),
        *report["matmuls"].values(),
        *report["layers"].values(),
        *report["methods"].values(),
    ]
    for m in entries:
        assert 0 < m["mean_abs_logprob_dev"] <= m["max_abs_logprob_dev"] < 1
        assert -1 <= m["kendall_tau"] <= 1
        # a margin moves by at most two log-probs' deviations
        assert 0 < m["margin_spread"] <= 2 * m["max_abs_logprob_dev"]
        assert abs(m["margin_shift"]) <= 2 * m["max_abs_logprob_dev"]
    assert report["model"] == "llama-untied" and "/" not in report["model"]


def test_an_embedders_report(minilm, tmp_path):
    report = int8_errors.main(
        ["--model", str(minilm), "--quick", "--no-progress", "--json", str(tmp_path / "e.json")]
    )
    assert len(report["matmuls"]) == 6 and "layers" not in report  # --quick leaves them out
    for m in report["methods"].values():
        assert 0.99 < m["min_cosine"] <= m["mean_cosine"] < 1
