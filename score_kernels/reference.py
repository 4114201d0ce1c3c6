"""Dense oracle for packed two-span attention: builds the full [T, C + T] mask, ignores the
schedule."""

import jax
import jax.numpy as jnp

from score_kernels.metadata import AttentionMeta, context_length
from score_kernels.paging import LayerPool, with_context
from score_kernels.softcap import soft_cap


def attention_reference(
    q: jax.Array,  # [T, H, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    *,
    scale: float,
    softcap: float = 0.0,
    pool: LayerPool | None = None,
) -> jax.Array:  # [T, H, D] in q's dtype
    """Attention of every token over its prefix span and own span, computed densely in f32.

    Query head h reads kv head `h // (H // Hkv)`; the context region's keys come from `pool`'s
    pages (`score_kernels.paging`); `softcap` > 0 soft-caps the scaled scores. Cost and memory are
    O(T (C + T) H): a test oracle.
    """
    k, v = with_context(k, v, meta, pool)
    num_heads = q.shape[1]
    kv_head = jnp.arange(num_heads) // (num_heads // k.shape[1])
    qf = q.astype(jnp.float32)
    kf = k.astype(jnp.float32)[:, kv_head]
    vf = v.astype(jnp.float32)[:, kv_head]
    hi = jax.lax.Precision.HIGHEST
    scores = soft_cap(jnp.einsum("thd,shd->hts", qf, kf, precision=hi) * scale, softcap)
    scores = jnp.where(dense_mask(meta, context_length(q, k))[None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("hts,shd->thd", probs, vf, precision=hi).astype(q.dtype)


def dense_mask(meta: AttentionMeta, context: int = 0) -> jax.Array:  # bool[T, C + T]
    """`mask[t, s]` is True when query t (key C + t) may attend to key s."""
    t = meta.prefix_start.shape[0]
    key = jnp.arange(context + t)[None, :]
    in_prefix = (key >= meta.prefix_start[:, None]) & (key < meta.prefix_end[:, None])
    in_own = (key >= meta.own_start[:, None]) & (key < meta.own_end[:, None])
    return in_prefix | in_own
