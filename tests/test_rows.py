"""`engine.models.rows`: outputs at the real score rows alone, `HEAD_ROWS` at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.host.packing import empty_batch
from engine.models.rows import HEAD_ROWS, over_score_rows


def _batch(rng, rows: int, count: int):
    batch = empty_batch(8 * HEAD_ROWS, rows, 3, 64)
    return batch._replace(
        score_rows=rng.permutation(8 * HEAD_ROWS)[:rows].astype(np.int32),
        label_ids=rng.integers(0, 8, (rows, 3)).astype(np.int32),
        row_count=np.array(count, np.int32),
    )


def _at_rows(states):
    """An output of each row's state f32[E] and labels: its labels' entries, doubled."""
    return lambda rows, labels: jnp.take_along_axis(states[rows], labels, axis=1) * 2.0


@pytest.mark.parametrize("rows", [3, HEAD_ROWS, 2 * HEAD_ROWS + 5])
def test_every_real_row_in_order(rows):
    rng = np.random.default_rng(rows)
    states = jnp.asarray(rng.standard_normal((8 * HEAD_ROWS, 8)), jnp.float32)
    batch = _batch(rng, rows, rows)
    f = _at_rows(states)
    expected = f(batch.score_rows, batch.label_ids)
    np.testing.assert_array_equal(over_score_rows(f, batch), expected)


@pytest.mark.parametrize("count", [0, 1, HEAD_ROWS, HEAD_ROWS + 1, 3 * HEAD_ROWS])
def test_steps_stop_at_the_chunk_that_holds_the_last_real_row(count):
    """Rows in the chunks the real rows reach are computed (padding rows in the last of them
    too); every row past them is zero, and one compiled program serves every count."""
    rng = np.random.default_rng(count)
    states = jnp.asarray(rng.standard_normal((8 * HEAD_ROWS, 8)) + 5.0, jnp.float32)  # never 0
    s = 3 * HEAD_ROWS + 40
    batch = _batch(rng, s, count)
    f = _at_rows(states)
    program = jax.jit(lambda b: over_score_rows(f, b))
    out = np.asarray(program(batch))
    computed = -(-count // HEAD_ROWS) * HEAD_ROWS
    expected = np.asarray(f(batch.score_rows, batch.label_ids))
    np.testing.assert_array_equal(out[:computed], expected[:computed])
    assert not out[computed:].any()
    assert (out[:computed] != 0).all()
    program(batch._replace(row_count=np.array(s, np.int32)))
    assert program._cache_size() == 1
