"""GPTQ rounding: the int8 grid of quant.round_columns, with less output error on correlated
inputs, and plain rounding where the inputs are uncorrelated."""

import numpy as np

from score_kernels import gptq, quant


def correlated(rng, n=512, k=64) -> np.ndarray:
    return rng.standard_normal((n, k)) @ rng.standard_normal((k, k))


def test_the_grid_is_plain_roundings_with_less_output_error():
    rng = np.random.default_rng(2)
    x, w = correlated(rng), rng.standard_normal((64, 24))
    q, scale = gptq.round_columns(w, x.T @ x)
    plain_q, plain_scale = quant.round_columns(w)
    np.testing.assert_array_equal(scale, plain_scale)
    assert q.dtype == np.int8 and np.abs(q).max() <= 127
    assert (q != plain_q).mean() > 0.1  # it rounds otherwise, and better:
    error = lambda q: np.linalg.norm(x @ (q * scale.astype(np.float64) - w))
    assert error(q) < 0.8 * error(plain_q)  # measured 0.70


def test_uncorrelated_inputs_round_to_nearest():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 16))
    hessian = np.diag(rng.uniform(1, 2, 40))  # no channel tells about another
    np.testing.assert_array_equal(gptq.round_columns(w, hessian)[0], quant.round_columns(w)[0])


def test_blocks_do_not_change_the_result():
    rng = np.random.default_rng(4)
    x, w = correlated(rng, k=48), rng.standard_normal((48, 8))
    whole = gptq.round_columns(w, x.T @ x, block=48)[0]
    assert (gptq.round_columns(w, x.T @ x, block=16)[0] == whole).mean() > 0.99
