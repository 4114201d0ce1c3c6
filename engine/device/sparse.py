"""A sparse output's way off the device: of each row of a vocabulary-wide f32[S, V] (a SPLADE
head's weights, non-negative) only its non-zero entries are copied to the host.

The device counts each row's non-zero entries; the host reads the largest count (one scalar)
and has the device gather every row's non-zero entries into K columns, K that count rounded up
to a power of two (a handful of compiled widths); the host copies those f32[S, K] and i32[S, K]
arrays, never a vocabulary-wide row.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MIN_WIDTH = 16  # the narrowest gather: rows of fewer entries share its program


class SparseRows(NamedTuple):
    """A batch's rows' non-zero entries, on the host."""

    indices: np.ndarray  # i32[S, K]: each row's non-zero columns ascending, then padding
    values: np.ndarray  # f32[S, K]: their values (> 0), then padding
    counts: np.ndarray  # i32[S]: each row's non-zero entries

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Row `r`'s (columns i32[k] ascending, values f32[k]), copies of their own."""
        k = int(self.counts[r])
        return self.indices[r, :k].copy(), self.values[r, :k].copy()


@jax.jit
def _counts(x: jax.Array) -> jax.Array:  # i32[S]
    return jnp.sum(x > 0, axis=1, dtype=jnp.int32)


@functools.partial(jax.jit, static_argnums=1)
def _gather(x: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:  # i32[S, K], f32[S, K]
    columns = jax.vmap(lambda r: jnp.nonzero(r > 0, size=width, fill_value=0)[0])(x)
    columns = columns.astype(jnp.int32)
    return columns, jnp.take_along_axis(x, columns, axis=1)


def width_for(count: int, vocab: int) -> int:
    """The gather width for rows of at most `count` non-zero entries of `vocab` columns."""
    return min(vocab, max(MIN_WIDTH, 1 << max(count - 1, 0).bit_length()))


def fetch(x: jax.Array) -> SparseRows:
    """The non-zero entries of each row of the device array x f32[S, V] (entries >= 0)."""
    counts = np.asarray(_counts(x))
    columns, values = _gather(x, width_for(int(counts.max(initial=0)), x.shape[1]))
    return SparseRows(np.asarray(columns), np.asarray(values), counts)
