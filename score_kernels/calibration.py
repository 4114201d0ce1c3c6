"""GPTQ for the int8 mode: the Hessians X^T X of each layer matrix's inputs, recorded from a
forward over calibration texts, and the strategy that rounds each matrix by them.

`recording(hessians)` is the XLA strategy whose layer products first hand their input's real rows
to `hessians` (an `io_callback`), rounded to bf16 and rotated as the int8 kernels see them
(`score_kernels.quant`). A matrix is known by the digest of the host stack its `prepare` is
given (`digest`): the int8 placement of the same checkpoint prepares the same stacks, and
`rounding_by(dense, hessians)` hands `dense` each one it has sums for rounded by GPTQ
(`score_kernels.gptq`, a `quant.Rounded`), the rest as they are (rounded to nearest there).
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
    multiplied, and how many rows that was."""

    def __init__(self):
        self.sums: dict[str, dict[int, np.ndarray]] = {}
        self.rows: dict[str, int] = {}
        self._alias: dict[str, str] = {}  # a gated pair's up stack: its gate's inputs
        self._adding = threading.Lock()
        self._rounded: dict[str, quant.Rounded | None] = {}  # by digest; None: not recorded

    def add(self, key: str, layer, x, count) -> None:
        """Add the first `count` rows of x f32[M, K] as inputs of layer `layer` of matrix
        `key`."""
        x = np.asarray(x, np.float64)[: int(count)]
        with self._adding:
            sums = self.sums.setdefault(key, {})
            layer = int(layer)
            sums[layer] = sums.get(layer, 0) + x.T @ x
            self.rows[key] = self.rows.get(key, 0) + len(x)

    def alias(self, key: str, same: str) -> None:
        """Matrix `key` multiplies the inputs matrix `same` does."""
        self._alias[key] = same

    def of(self, w) -> list[np.ndarray] | None:
        """The sums f64[K, K] of each layer of the host stack w [L, K, N], or None where w was
        not multiplied (or not in every layer)."""
        return self._layers(digest(w), w)

    def rounded(self, w, key: str | None = None):
        """w [L, K, N] (or [K, N]) rounded by GPTQ against its sums, a `quant.Rounded` (once per
        stack: data-parallel runners place the same ones); w itself where there are none.
        `key`: w's `digest`, where the caller has it."""
        key = key or digest(w)
        if key not in self._rounded:
            self._rounded[key] = self._gptq(w, self._layers(key, w))
        rounded = self._rounded[key]
        return w if rounded is None else rounded

    def _layers(self, key: str, w) -> list[np.ndarray] | None:
        sums = self.sums.get(self._alias.get(key, key), {})
        layers = w.shape[0] if w.ndim == 3 else 1
        if sorted(sums) != list(range(layers)):
            return None
        return [sums[i] for i in range(layers)]

    @staticmethod
    def _gptq(w, sums: list[np.ndarray] | None) -> quant.Rounded | None:
        if sums is None:
            return None
        stack = np.asarray(w, np.float32).reshape(len(sums), *w.shape[-2:])
        pairs = zip(stack, sums, strict=True)
        parts = [gptq.round_columns(quant.rotate_weights(m), h) for m, h in pairs]
        q, scale = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
        return quant.Rounded(q.reshape(w.shape), scale.reshape(*w.shape[:-2], w.shape[-1]))


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
    """The XLA strategy, each layer product first adding its input's real rows (bf16-rounded,
    rotated) to `hessians` under its matrix's digest. The head is not recorded (int8 leaves it
    in bf16)."""

    def prepared(prepare: Callable) -> Callable:
        def recorded(w, *args):
            return Recorded(prepare(w, *args), digest(w))

        return recorded

    def prepare_gated(gate, up, dtype):
        key = digest(gate)
        hessians.alias(digest(up), key)
        return Recorded(XLA.prepare_gated(gate, up, dtype), key)

    def record(w: Recorded, x, layer, rows) -> None:
        x = quant.rotate_rows(x.astype(jnp.bfloat16).astype(jnp.float32))
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
