"""GPTQ rounding (Frantar et al., 2022) onto the int8 grid of `score_kernels.quant`: a matrix's
rows (its input channels) rounded one after another, each row's rounding error carried onto the
rows not yet rounded so that the layer's output on the calibration inputs moves least.

With H = X^T X of the layer's inputs (rotated, as the int8 matmul sees them) and U the upper
Cholesky factor of H^-1, row k's error `(w_k - q_k) / U[k, k]` is subtracted, times `U[k, j]`,
from every later row j. The scales are `quant.column_scales` of the matrix as given, so the
result is read by the int8 kernels as any other. Rows are taken in blocks of 128, the updates
past a block applied once per block as one matrix product.
"""

import numpy as np

from score_kernels import quant

DAMP = 0.01  # of the mean diagonal, added to H: keeps it invertible and the updates small


def round_columns(
    w,  # [K, N]
    hessian: np.ndarray,  # f64[K, K]: X^T X of the inputs
    block: int = 128,
) -> tuple[np.ndarray, np.ndarray]:  # i8[K, N], f32[N]
    """`quant.round_columns`'s grid, rounded by GPTQ against `hessian`."""
    w = np.array(w, np.float64)
    scale = quant.column_scales(w)
    u = _inverse_factor(hessian)
    k = w.shape[0]
    q = np.zeros(w.shape, np.int8)
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        errors = np.zeros((b1 - b0, w.shape[1]))
        for i in range(b0, b1):
            q[i] = quant.to_grid(w[i : i + 1], scale)[0]
            errors[i - b0] = (w[i] - q[i] * scale.astype(np.float64)) / u[i, i]
            w[i + 1 : b1] -= np.outer(u[i, i + 1 : b1], errors[i - b0])
        w[b1:] -= u[b0:b1, b1:].T @ errors
    return q, scale


def _inverse_factor(hessian: np.ndarray) -> np.ndarray:  # f64[K, K]
    """The upper Cholesky factor of the damped H's inverse; a channel never seen (zero on the
    diagonal) counts as seen alone, uncorrelated."""
    h = np.array(hessian, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    h += DAMP * np.mean(np.diag(h)) * np.eye(len(h))
    return np.linalg.cholesky(np.linalg.inv(h)).T
