"""A sparse output's way off the device: of each row of a vocabulary-wide f32[S, V] (a SPLADE
head's weights, non-negative) only its non-zero entries are copied to the host.

The device counts each real row's non-zero entries; the host reads the largest count (one
scalar) and has the device gather every real row's non-zero entries into K columns, K that count
rounded up to a power of two (a handful of compiled widths); the host copies those f32[R, K] and
i32[R, K] arrays, never a vocabulary-wide row. Only the batch's first R rows are read, R its real
rows rounded up to a power of two: a batch's rows are padded to its row bucket (half or a 32nd of
its tokens, `engine.tasks.splade`), and reading every padding row of a 30k vocabulary cost as
much as a tenth of a batch's device time.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MIN_WIDTH = 16  # the narrowest gather: rows of fewer entries share its program


class Pending(NamedTuple):
    """A dispatched batch's sparse output, still on the device."""

    x: jax.Array  # f32[S, V]: rows past the first `rows` are padding
    rows: int  # the batch's real rows


class SparseRows(NamedTuple):
    """A batch's rows' non-zero entries, on the host."""

    indices: np.ndarray  # i32[R, K]: each row's non-zero columns ascending, then padding
    values: np.ndarray  # f32[R, K]: their values (> 0), then padding
    counts: np.ndarray  # i32[R]: each row's non-zero entries (0 past the real rows)

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Row `r`'s (columns i32[k] ascending, values f32[k]), copies of their own."""
        k = int(self.counts[r])
        return self.indices[r, :k].copy(), self.values[r, :k].copy()


@functools.partial(jax.jit, static_argnums=1)
def _counts(x: jax.Array, read: int, rows: jax.Array) -> jax.Array:  # i32[R]
    counts = jnp.sum(x[:read] > 0, axis=1, dtype=jnp.int32)
    return jnp.where(jnp.arange(read) < rows, counts, 0)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _gather(x: jax.Array, read: int, width: int) -> tuple[jax.Array, jax.Array]:  # [R, K] each
    x = x[:read]
    columns = jax.vmap(lambda r: jnp.nonzero(r > 0, size=width, fill_value=0)[0])(x)
    columns = columns.astype(jnp.int32)
    return columns, jnp.take_along_axis(x, columns, axis=1)


def width_for(count: int, vocab: int) -> int:
    """The gather width for rows of at most `count` non-zero entries of `vocab` columns."""
    return min(vocab, max(MIN_WIDTH, 1 << max(count - 1, 0).bit_length()))


def rows_read(rows: int, bucket: int) -> int:
    """The rows read of a batch of `rows` real rows in a bucket of `bucket`: a power of two
    (at least `MIN_WIDTH`), at most the bucket."""
    return min(bucket, max(MIN_WIDTH, 1 << max(rows - 1, 0).bit_length()))


def fetch(pending: Pending) -> SparseRows:
    """The non-zero entries of each real row of the device array f32[S, V] (entries >= 0)."""
    x = pending.x
    read = rows_read(pending.rows, x.shape[0])
    counts = np.asarray(_counts(x, read, jnp.int32(pending.rows)))
    columns, values = _gather(x, read, width_for(int(counts.max(initial=0)), x.shape[1]))
    return SparseRows(np.asarray(columns), np.asarray(values), counts)
