"""Block-sparse packed two-span attention in plain XLA.

Queries are grouped in blocks of B. For each query block a loop walks its `block_count` scheduled
key blocks (`block_kv[i, :block_count[i]]`), scores one key block per step and folds it into an
online softmax, so the work is sum(block_count) * B^2 rather than T^2. Query blocks are processed
`lax.map`-style, several at once (vmapped, each running to the chunk's largest count). GQA folds
the G query heads of a kv head into the query rows, so K/V are never repeated in memory.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from score_kernels import devices
from score_kernels.metadata import AttentionMeta
from score_kernels.paging import LayerPool, with_context
from score_kernels.precision import dot_precision
from score_kernels.softcap import soft_cap

# Finite, so a row that has seen no visible key yet computes exp(0) garbage that the first real
# key rescales to exactly zero, instead of inf - inf = NaN.
_MASKED = -1e30

# Query rows (query blocks * B) per step on CPU, measured on a 2-core EPYC with the SmolLM2
# shape: for B >= 64 batching blocks gains a little from bigger matmuls while the score tile stays
# near cache size; below that the vmap's per-step overhead wins, so small blocks run one by one.
_CPU_QUERY_ROWS_PER_STEP = 512


class _QueryBlock(NamedTuple):
    """One query block's inputs (a leading [n] axis when batched)."""

    rows: jax.Array  # [Hkv, G*B, D]
    prefix_start: jax.Array  # i32[B, 1]
    prefix_end: jax.Array  # i32[B, 1]
    own_start: jax.Array  # i32[B, 1]
    own_end: jax.Array  # i32[B, 1]
    kv_blocks: jax.Array  # i32[K]
    count: jax.Array  # i32[]


def attention_xla(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
    query_blocks_per_step: int | None = None,
) -> jax.Array:  # [T, H, D] in q's dtype
    """Attention over the prefix span and own span, visiting only scheduled key blocks.

    Query head h reads kv head `h // (H // Hkv)`. Scores and the softmax are f32; the output has
    q's dtype; `softcap` > 0 soft-caps the scaled scores. Shapes (T, C, H, Hkv, D, K) are static
    under `jax.jit`; B comes from `meta`.
    `query_blocks_per_step` trades batching against cache locality; None picks it per backend.
    The context region's keys are gathered from `pool`'s pages first (`score_kernels.paging`).
    """
    k, v = with_context(k, v, meta, pool)
    t, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    block = meta.block_size
    n = t // block
    group = num_heads // num_kv
    k_blocks = _kv_blocks(k, k.shape[0] // block, block)
    v_blocks = _kv_blocks(v, v.shape[0] // block, block)
    per_step = min(n, query_blocks_per_step or _default_query_blocks_per_step(n, block))

    def attend(query: _QueryBlock) -> jax.Array:  # f32[Hkv, G*B, D]
        return _attend_query_block(query, k_blocks, v_blocks, (scale, softcap), group=group)

    queries = _query_blocks(q, meta, n, block, num_kv)
    out = jax.lax.map(attend, queries, batch_size=per_step)
    out = out.reshape(n, num_kv, group, block, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(t, num_heads, head_dim).astype(q.dtype)


def _default_query_blocks_per_step(n: int, block: int) -> int:
    if devices.backend() != "cpu":
        # Accelerators want few large kernels: all query blocks per step, K steps in all.
        return n
    if block < 64:
        return 1
    return max(1, _CPU_QUERY_ROWS_PER_STEP // block)


def _kv_blocks(
    x: jax.Array,  # [T, Hkv, D]
    n: int,
    block: int,
) -> jax.Array:  # [n, Hkv, B, D]
    return x.reshape(n, block, x.shape[1], x.shape[2]).transpose(0, 2, 1, 3)


def _query_blocks(
    q: jax.Array,  # [T, H, D]
    meta: AttentionMeta,
    n: int,
    block: int,
    num_kv: int,
) -> _QueryBlock:
    _, num_heads, head_dim = q.shape
    group = num_heads // num_kv
    # Row r = g * B + b of kv head h holds query head h * G + g of token b.
    rows = q.reshape(n, block, num_kv, group, head_dim).transpose(0, 2, 3, 1, 4)
    column = lambda a: a.reshape(n, block, 1)
    return _QueryBlock(
        rows=rows.reshape(n, num_kv, group * block, head_dim),
        prefix_start=column(meta.prefix_start),
        prefix_end=column(meta.prefix_end),
        own_start=column(meta.own_start),
        own_end=column(meta.own_end),
        kv_blocks=meta.block_kv,
        count=meta.block_count,
    )


def _attend_query_block(
    query: _QueryBlock,
    k_blocks: jax.Array,  # [n, Hkv, B, D]
    v_blocks: jax.Array,  # [n, Hkv, B, D]
    scaling: tuple[float, float],  # scale, soft cap
    *,
    group: int,
) -> jax.Array:  # f32[Hkv, G*B, D]
    num_kv, rows, head_dim = query.rows.shape

    def step(slot, carry):
        kv_block = query.kv_blocks[slot]
        bias = _mask_bias(query, kv_block, k_blocks.shape[2])  # f32[B, B]
        scores = jnp.einsum(
            "hrd,hkd->hrk",
            query.rows,
            k_blocks[kv_block],
            precision=dot_precision(query.rows.dtype),
            preferred_element_type=jnp.float32,
        )
        scores = soft_cap(scores * scaling[0], scaling[1]).reshape(num_kv, group, *bias.shape)
        scores = scores + bias
        return _online_update(carry, scores.reshape(num_kv, rows, -1), v_blocks[kv_block])

    init = (
        jnp.full((num_kv, rows), _MASKED, jnp.float32),
        jnp.zeros((num_kv, rows), jnp.float32),
        jnp.zeros((num_kv, rows, head_dim), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, query.count, step, init)
    # total >= 1 for a well-formed schedule (every row sees its own diagonal key); the guard only
    # keeps a malformed one from producing NaN.
    return acc / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)[..., None]


def _mask_bias(
    query: _QueryBlock,
    kv_block: jax.Array,  # i32[]
    block: int,
) -> jax.Array:  # f32[B, B]: 0 where query row may see key column, _MASKED elsewhere
    key = kv_block * block + jnp.arange(block, dtype=jnp.int32)[None, :]
    in_prefix = (key >= query.prefix_start) & (key < query.prefix_end)
    in_own = (key >= query.own_start) & (key < query.own_end)
    return jnp.where(in_prefix | in_own, 0.0, _MASKED).astype(jnp.float32)


def _online_update(
    carry: tuple[jax.Array, jax.Array, jax.Array],  # f32[Hkv, R], f32[Hkv, R], f32[Hkv, R, D]
    scores: jax.Array,  # f32[Hkv, R, B], masked entries near _MASKED
    v_block: jax.Array,  # [Hkv, B, D]
) -> tuple[jax.Array, jax.Array, jax.Array]:
    running_max, total, acc = carry
    new_max = jnp.maximum(running_max, scores.max(axis=-1))
    probs = jnp.exp(scores - new_max[..., None])
    rescale = jnp.exp(running_max - new_max)
    total = total * rescale + probs.sum(axis=-1)
    pv = jnp.einsum(
        "hrk,hkd->hrd",
        probs.astype(v_block.dtype),
        v_block,
        precision=dot_precision(v_block.dtype),
        preferred_element_type=jnp.float32,
    )
    return new_max, total, acc * rescale[..., None] + pv
