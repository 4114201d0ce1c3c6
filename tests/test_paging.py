"""Attention over a context region read from KV pool pages: every implementation, on batches
whose groups' prefixes were (partly) computed earlier, equals attention over the whole sequences
computed in one batch without a pool."""

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from score_kernels import ATTENTION, attention_reference, make_meta
from score_kernels.paging import LayerPool, as_bits, empty_pool, with_context, write
from tests.test_attention import TOLERANCE, layout_meta, random_qkv


class Group(NamedTuple):
    """A group whose first `cached` prefix tokens are in the pool before the batch, the rest of
    its prefix computed (and written to pages) by the batch, then its items."""

    cached: int
    prefix: int
    items: Sequence[int]


class Paged(NamedTuple):
    q: jax.Array  # [T, H, D] the batch's queries
    k: jax.Array  # [T, Hkv, D]
    v: jax.Array  # [T, Hkv, D]
    meta: object  # AttentionMeta over the key space (context region, then batch)
    pool: LayerPool
    full_rows: np.ndarray  # i32[T]: each batch token's row in the one-batch layout (-1: padding)


def paged_layout(
    groups: Sequence[Group],
    full_q,
    full_k,
    full_v,
    *,
    block: int,
    page: int,
    pages: int,
    seed=0,
    window: int = 0,
) -> Paged:
    """The batch that computes `groups` with their prefixes in pool pages, from the q/k/v of the
    one-batch layout (`layout_meta` of the same groups), for layers of sliding `window` (0:
    global). Pages are scattered at random and the rest of every page (past a partial last
    page, unused pages) holds large random values, so a key read from the wrong place changes
    the result."""
    rng = np.random.default_rng(seed)
    free = list(rng.permutation(pages)[1:])  # page 0 pads the context region
    kv_heads, head_dim = full_k.shape[1:]
    junk = rng.standard_normal((2, 1, pages, page, kv_heads, head_dim)) * 30
    pool_k, pool_v = (as_bits(jnp.asarray(x, full_k.dtype)) for x in junk)
    ctx_pages, rows, spans = [], [], ([], [], [])
    slots_k, slots_v, slots = [], [], []
    full = 0  # row of the group's first token in the one-batch layout
    for g in groups:
        n_pages = -(-g.prefix // page)
        run = [int(free.pop()) for _ in range(n_pages)]
        ctx = len(ctx_pages) * page
        ctx_pages.extend(run)
        for i in range(g.prefix):  # the whole prefix is in pages when attention runs
            slots.append(run[i // page] * page + i % page)
            slots_k.append(full_k[full + i])
            slots_v.append(full_v[full + i])
        start = len(rows)
        for i in range(g.cached, g.prefix):
            rows.append(full + i)
            for span, x in zip(spans, (ctx, ctx + g.cached, start), strict=True):
                span.append(x)
        offset = full + g.prefix
        for n in g.items:
            item_start = len(rows)
            for i in range(n):
                rows.append(offset + i)
                for span, x in zip(spans, (ctx, ctx + g.prefix, item_start), strict=True):
                    span.append(x)
            offset += n
        full = offset
    ctx_pages.extend([0] * (-len(ctx_pages) % (block // page)))
    c = len(ctx_pages) * page
    t = -(-len(rows) // block) * block
    own = [c + x for x in spans[2]]
    pad = list(range(c + len(rows), c + t))
    ps, pe, os_ = (np.asarray(x + pad, np.int32) for x in (spans[0], spans[1], own))
    meta = make_meta(
        ps,
        pe,
        os_,
        block_size=block,
        width_buckets=((c + t) // block,),
        context_pages=np.asarray(ctx_pages, np.int32),
        page_size=page,
        window=window,
    )
    layer_pool = LayerPool(pool_k, pool_v, jnp.int32(0))
    slots = jnp.asarray(slots, jnp.int32)
    layer_pool = write(layer_pool, slots, jnp.stack(slots_k), jnp.stack(slots_v))
    full_rows = np.asarray(rows + [-1] * (t - len(rows)), np.int32)
    take = lambda x: jnp.asarray(x)[np.maximum(full_rows, 0)]
    return Paged(take(full_q), take(full_k), take(full_v), meta, layer_pool, full_rows)


@partial(jax.jit, static_argnames=("name",))
def run_paged(q, k, v, meta, pool, *, name: str):
    return ATTENTION[name](q, k, v, meta, scale=q.shape[-1] ** -0.5, pool=pool)


@jax.jit
def run_whole(q, k, v, meta):
    return attention_reference(q, k, v, meta, scale=q.shape[-1] ** -0.5)


SCENARIOS = {
    # name: (groups, block, page, heads, kv_heads, head_dim)
    "whole_prefix_cached": ([Group(32, 32, [5, 9, 1])], 16, 8, 4, 4, 64),
    "partial_last_page": ([Group(16, 21, [7, 3])], 16, 8, 6, 2, 64),
    "nothing_cached_yet": ([Group(0, 27, [4, 4])], 32, 16, 6, 2, 128),
    "chunk_continues": ([Group(48, 48, [40])], 16, 16, 8, 1, 64),
    "mixed_groups": (
        [Group(8, 19, [5, 2]), Group(0, 0, [21]), Group(40, 40, [1] * 6), Group(16, 33, [3])],
        32,
        8,
        6,
        2,
        128,
    ),
    "gqa8_long_context": ([Group(96, 130, [11, 6]), Group(24, 24, [17])], 32, 16, 8, 1, 64),
}
PAGES = 64


def groups_layout(groups: Sequence[Group]) -> list[tuple[int, list[int]]]:
    # A group without items is a plain sequence in the one-batch layout.
    return [(g.prefix, list(g.items)) if g.prefix else (0, list(g.items)) for g in groups]


@pytest.mark.parametrize("window", [0, 20], ids=["global", "window20"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
# the Mosaic GPU form runs bf16 at 64-token blocks: tests/test_mosaic_gpu.py pages it there
@pytest.mark.parametrize("name", sorted(set(ATTENTION) - {"mosaic"}))
def test_paged_context_equals_one_batch(name, scenario, dtype, window, request) -> None:
    if name == "cpu":
        request.getfixturevalue("on_the_cpu")  # the native kernel reads host memory
    groups, block, page, heads, kv_heads, head_dim = SCENARIOS[scenario]
    whole_meta = layout_meta(groups_layout(groups), block, window=window)
    whole = random_qkv(whole_meta.prefix_start.shape[0], heads, kv_heads, head_dim, dtype)
    paged = paged_layout(groups, *whole, block=block, page=page, pages=PAGES, window=window)
    assert paged.meta.context_pages.shape[0] > 0
    want = np.asarray(run_whole(*whole, whole_meta), np.float32)
    got = run_paged(paged.q, paged.k, paged.v, paged.meta, paged.pool, name=name)
    assert got.shape == paged.q.shape and got.dtype == dtype
    real = paged.full_rows >= 0
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(
        np.asarray(got, np.float32)[real], want[paged.full_rows[real]], atol=tol, rtol=tol
    )


def test_write_then_read_round_trips() -> None:
    pool = empty_pool(3, 4, 8, 2, 64, jnp.float32).at_layer(jnp.int32(2))
    rng = np.random.default_rng(1)
    batch_k, batch_v = (jnp.asarray(rng.standard_normal((5, 2, 64)), jnp.float32) for _ in "kv")
    slots = jnp.asarray([3 * 8 + 7, 1 * 8, 99, -1, 2 * 8 + 3], jnp.int32)  # 99, -1: not written
    pool = write(pool, slots, batch_k, batch_v)
    assert pool.k.dtype == np.uint32  # the bits of f32
    np.testing.assert_array_equal(pool.k[2, 3, 7], as_bits(batch_k[0]))
    np.testing.assert_array_equal(pool.v[2, 1, 0], as_bits(batch_v[1]))
    np.testing.assert_array_equal(pool.k[2, 2, 3], as_bits(batch_k[4]))
    assert float(jnp.abs(pool.k[:2]).sum()) == 0.0  # other layers untouched
    assert int((pool.k[2] != 0).any(axis=(-1, -2)).sum()) == 3  # only the three slots written


def test_context_without_a_pool_is_refused() -> None:
    meta = layout_meta([(0, [16])], 16)
    meta = meta._replace(context_pages=np.zeros(2, np.int32))
    _, k, v = random_qkv(16, 2, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match="no KV pool"):
        with_context(k, v, meta, None)
