"""Calibrated int8 for the int8 mode: the Hessians X^T X and channel maxima of each layer
matrix's inputs, recorded from a forward over calibration texts, and the strategy that rounds
each matrix by them (GPTQ, SmoothQuant's smoothing, or both).

`recording(hessians)` is the XLA strategy whose layer products first hand their input's real rows
to `hessians` (an `io_callback`), rounded to bf16 as the int8 kernels see them
(`score_kernels.quant`; the rotation is applied to the sums when rounding). A matrix is known by
the digest of the host stack its `prepare` is given (`digest`): the int8 placement of the same
checkpoint prepares the same stacks, and `rounding_by(dense, hessians)` hands `dense` each one
it has sums for smoothed and rounded (`score_kernels.gptq`, a `quant.Rounded`), the rest as they
are (rounded to nearest there).
Anything that answers `rounded(w)` as `Hessians` does (a `Rounding`: a store of their results
kept between starts) can stand in for them.
"""

import functools
import hashlib
import threading
from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from score_kernels import gptq, quant
from score_kernels.dense import XLA, Dense


class Rounding(Protocol):
    """What rounds layer stacks for an int8 strategy: `Hessians`, or a store of their results."""

    def rounded(self, w):
        """w [L, K, N] (or [K, N]) as a `quant.Rounded`, or w itself to be rounded to nearest."""


class Hessians:
    """Per matrix (its `digest`) and layer, the sum of X^T X (f64[K, K]) over the real rows it
    multiplied (rounded to bf16, before the rotation), the largest magnitude of each of their
    channels (f64[K]), and how many rows that was; and how they round the matrices: by GPTQ
    (`gptq`) or to nearest, after SmoothQuant's smoothing of strength `alpha` (0: none)."""

    def __init__(self, gptq: bool = True, alpha: float = 0.0):
        self.gptq, self.alpha = gptq, alpha
        self.sums: dict[str, dict[int, np.ndarray]] = {}
        self.maxima: dict[str, dict[int, np.ndarray]] = {}
        self.weights: dict[str, np.ndarray] = {}  # f64[L, K]: the largest weight of each row
        self.rows: dict[str, int] = {}
        self._alias: dict[str, str] = {}  # a gated pair's up stack: its gate's inputs
        self._adding = threading.Lock()
        self._rounded: dict[str, quant.Rounded | None] = {}  # by digest; None: not recorded

    def add(self, key: str, layer, x, count) -> None:
        """Add the first `count` rows of x f32[M, K] as inputs of layer `layer` of matrix
        `key`."""
        x = np.asarray(x, np.float64)[: int(count)]
        top = np.abs(x).max(0) if len(x) else np.zeros(x.shape[1])
        with self._adding:
            sums, maxima = self.sums.setdefault(key, {}), self.maxima.setdefault(key, {})
            layer = int(layer)
            sums[layer] = sums.get(layer, 0) + x.T @ x
            maxima[layer] = np.maximum(maxima.get(layer, 0), top)
            self.rows[key] = self.rows.get(key, 0) + len(x)

    def alias(self, key: str, same: str) -> None:
        """Matrix `key` multiplies the inputs matrix `same` does."""
        self._alias[key] = same

    def weigh(self, key: str, *stacks) -> None:
        """The largest weight of each row (input channel) over `stacks` [L, K, N] (or [K, N]),
        every matrix multiplying the inputs of `key`."""
        tops = [np.abs(np.asarray(w, np.float64)).max(-1).reshape(-1, w.shape[-2]) for w in stacks]
        self.weights[key] = np.maximum.reduce(tops)

    def of(self, w) -> list[np.ndarray] | None:
        """The sums f64[K, K] of each layer of the host stack w [L, K, N], or None where w was
        not multiplied (or not in every layer)."""
        return self._layers(self.sums, digest(w), w)

    def rounded(self, w, key: str | None = None):
        """w [L, K, N] (or [K, N]) smoothed and rounded against its inputs, a `quant.Rounded`
        (once per stack: data-parallel runners place the same ones); w itself where its inputs
        were not recorded. `key`: w's `digest`, where the caller has it."""
        key = key or digest(w)
        if key not in self._rounded:
            self._rounded[key] = self._round(w, key)
        rounded = self._rounded[key]
        return w if rounded is None else rounded

    def smoothing(self, w, key: str | None = None) -> np.ndarray | None:
        """The divisors f32[L, K] of w's input channels (`quant.smoothing` of their recorded
        maxima and the largest weights they meet: the same for every matrix of one input), or
        None: no smoothing, or w unseen."""
        key = key or digest(w)
        maxima = self._layers(self.maxima, key, w)
        if not self.alpha or maxima is None:
            return None
        weights = self.weights[self._alias.get(key, key)]  # weighed by `recording` with them
        pairs = zip(maxima, weights, strict=True)
        return np.stack([quant.smoothing(m, top, self.alpha) for m, top in pairs])

    def _layers(self, table: dict, key: str, w) -> list[np.ndarray] | None:
        recorded = table.get(self._alias.get(key, key), {})
        layers = w.shape[0] if w.ndim == 3 else 1
        if sorted(recorded) != list(range(layers)):
            return None
        return [recorded[i] for i in range(layers)]

    def _round(self, w, key: str) -> quant.Rounded | None:
        sums = self._layers(self.sums, key, w)
        if sums is None:
            return None
        stack = np.asarray(w, np.float32).reshape(len(sums), *w.shape[-2:])
        smooth = self.smoothing(w, key)
        parts = []
        for i, (m, h) in enumerate(zip(stack, sums, strict=True)):
            if smooth is not None:
                m, h = m * smooth[i][:, None], h / np.outer(smooth[i], smooth[i])
            m = quant.rotate_weights(m)
            parts.append(
                gptq.round_columns(m, quant.rotate_hessian(h))
                if self.gptq
                else quant.round_columns(m)
            )
        q, scale = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
        if smooth is not None:
            smooth = smooth.reshape(*w.shape[:-2], w.shape[-2])
        return quant.Rounded(q.reshape(w.shape), scale.reshape(*w.shape[:-2], w.shape[-1]), smooth)


def digest(w) -> str:
    """A host stack's identity: its shape, dtype and bytes."""
    w = np.ascontiguousarray(w)
    h = hashlib.blake2b(f"{w.shape} {w.dtype}".encode(), digest_size=16)
    h.update(w.view(np.uint8).reshape(-1))
    return h.hexdigest()


@jax.tree_util.register_pytree_node_class
class Recorded:
    """A prepared matrix and the key its inputs are recorded under (static)."""

    def __init__(self, w, key: str):
        self.w, self.key = w, key

    def tree_flatten(self):
        return (self.w,), self.key

    @classmethod
    def tree_unflatten(cls, key, children):
        return cls(children[0], key)


def recording(hessians: Hessians) -> Dense:
    """The XLA strategy, each layer product first adding its input's real rows (bf16-rounded)
    to `hessians` under its matrix's digest. The head is not recorded (int8 leaves it
    in bf16)."""

    def prepared(prepare: Callable) -> Callable:
        def recorded(w, *args):
            key = digest(w)
            hessians.weigh(key, w)
            return Recorded(prepare(w, *args), key)

        return recorded

    def prepare_gated(gate, up, dtype):
        key = digest(gate)
        hessians.alias(digest(up), key)
        hessians.weigh(key, gate, up)
        return Recorded(XLA.prepare_gated(gate, up, dtype), key)

    def record(w: Recorded, x, layer, rows) -> None:
        x = x.astype(jnp.bfloat16).astype(jnp.float32)
        count = x.shape[0] if rows is None else rows
        add = functools.partial(hessians.add, w.key)
        io_callback(add, None, layer, x, jnp.asarray(count, jnp.int32))

    def matmul(x, w, layer, rows=None):
        record(w, x, layer, rows)
        return XLA.matmul(x, w.w, layer, rows)

    def gated(x, w, layer, rows=None, activation="silu"):
        record(w, x, layer, rows)
        return XLA.gated(x, w.w, layer, rows, activation)

    def activated(x, w, layer, bias, activation, rows=None):
        record(w, x, layer, rows)
        return XLA.activated(x, w.w, layer, bias, activation, rows)

    def qkv(x, w, layer, bias, heads, kv_heads, rows=None, rope=None):
        record(w, x, layer, rows)
        return XLA.qkv(x, w.w, layer, bias, heads, kv_heads, rows, rope)

    def residual(x, w, layer, residual, bias=None, rows=None):
        record(w, x, layer, rows)
        return XLA.residual(x, w.w, layer, residual, bias, rows)

    return Dense(
        "recording",
        prepared(XLA.prepare),
        matmul,
        prepare_gated,
        gated,
        prepared(XLA.prepare_activated),
        activated,
        prepared(XLA.prepare_qkv),
        qkv,
        prepared(XLA.prepare_residual),
        residual,
        XLA.prepare_head,
        XLA.head,
    )


def rounding_by(dense: Dense, rounding: Rounding) -> Dense:
    """`dense` (an int8 strategy) preparing each layer stack as `rounding` rounds it (by GPTQ
    where `Hessians` have sums for it)."""
    r = rounding.rounded
    return dense._replace(
        prepare=lambda w, dtype: dense.prepare(r(w), dtype),
        prepare_gated=lambda g, u, dtype: dense.prepare_gated(r(g), r(u), dtype),
        prepare_activated=lambda w, dtype: dense.prepare_activated(r(w), dtype),
        prepare_qkv=lambda w, dtype, h, kv: dense.prepare_qkv(r(w), dtype, h, kv),
        prepare_residual=lambda w, dtype: dense.prepare_residual(r(w), dtype),
    )
