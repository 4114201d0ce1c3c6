"""A batch's outputs at its real score rows alone, `HEAD_ROWS` rows at a time.

A batch pads its score rows to its bucket (`engine.host.buckets`). What is computed per row (the
last layer past its attention, the final norm, the head or the pooling) runs over chunks of
`HEAD_ROWS` rows, as many as the batch's real rows fill (`PackedInputs.row_count`), so padding
rows cost no compute. That is why one row bucket per token bucket suffices, and the compiled
grid is one program per token bucket.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

# Score rows per step: the f32[rows, V] logits of a head and their log-softmax stay small
# instead of one f32[S, V] array (300 MB for 1,536 rows of a 49k vocabulary), which measured
# ~4% off a 12k-token batch's device time on a 2-core CPU and removed most of its page faults.
HEAD_ROWS = 128


def steps(rows):
    """The `HEAD_ROWS`-row steps that `rows` rows fill (an int, or an i32[] array)."""
    return (rows + HEAD_ROWS - 1) // HEAD_ROWS


def over_score_rows(f: Callable, inputs) -> jax.Array:
    """`f(rows i32[C], labels i32[C, L]) -> f32[C, W]` at `inputs`' score rows (token indices)
    and their label ids, C = `HEAD_ROWS` rows a step, for as many steps as `inputs.row_count`
    rows fill: f32[S, W], zeros past the last step. At most `HEAD_ROWS` rows are one call."""
    rows, labels = inputs.score_rows, inputs.label_ids  # i32[S], i32[S, L]
    s = rows.shape[0]
    if s <= HEAD_ROWS:
        return f(rows, labels)
    n = steps(s)
    pad = n * HEAD_ROWS - s
    rows, labels = jnp.pad(rows, (0, pad)), jnp.pad(labels, ((0, pad), (0, 0)))
    chunk = lambda a, i: jax.lax.dynamic_slice_in_dim(a, i * HEAD_ROWS, HEAD_ROWS)
    shapes = (rows[:HEAD_ROWS], labels[:HEAD_ROWS])
    out = jax.eval_shape(f, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in shapes))

    def step(i, done):
        y = f(chunk(rows, i), chunk(labels, i))
        return jax.lax.dynamic_update_slice_in_dim(done, y.astype(out.dtype), i * HEAD_ROWS, 0)

    zeros = jnp.zeros((n * HEAD_ROWS, *out.shape[1:]), out.dtype)
    filled = steps(jnp.asarray(inputs.row_count, jnp.int32))
    return jax.lax.fori_loop(0, filled, step, zeros)[:s]
