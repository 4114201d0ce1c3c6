"""The paged KV pool as attention sees it: a batch writes its tokens' keys and values into pool
pages, and reads its context region (`AttentionMeta.context_pages`) back from them.

The pool holds K and V for every layer, `[L, P, page, Hkv, D]` each, in the attention dtype, so a
key read from a page is bit-equal to the key the batch that wrote it computed. Implementations
that cannot address pages themselves gather the context region into a contiguous key array with
`with_context`; the native CPU kernel reads the pages in place.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.metadata import AttentionMeta


class LayerPool(NamedTuple):
    """The whole pool and the layer whose pages attention reads (a jax pytree)."""

    k: jax.Array  # [L, P, page, Hkv, D]
    v: jax.Array  # [L, P, page, Hkv, D]
    layer: jax.Array  # i32[]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def at_layer(self, layer: jax.Array) -> "LayerPool":
        """The pool with attention reading and writing layer `layer`."""
        return self._replace(layer=layer)


def empty_pool(
    layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int, dtype
) -> LayerPool:
    """A zeroed pool of `pages` pages per layer, K and V [L, P, page, Hkv, D]."""
    shape = (layers, pages, page_size, kv_heads, head_dim)
    return LayerPool(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))


def write(
    pool: LayerPool,
    slots: jax.Array,  # i32[T]: page * page_size + offset per token; out of range: not written
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
) -> LayerPool:
    """The pool with the batch's K/V written into layer `pool.layer` at `slots`."""
    page, offset = slots // pool.page_size, slots % pool.page_size
    page = jnp.where(slots < 0, pool.k.shape[1], page)  # negative slots are dropped too
    at = (pool.layer, page, offset)
    return pool._replace(
        k=pool.k.at[at].set(k.astype(pool.k.dtype), mode="drop"),
        v=pool.v.at[at].set(v.astype(pool.v.dtype), mode="drop"),
    )


def with_context(
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    meta: AttentionMeta,
    pool: LayerPool | None,
) -> tuple[jax.Array, jax.Array]:  # [C + T, Hkv, D] each
    """The key space as one array: the context region gathered from the pool's pages, then the
    batch. Without context pages this is `(k, v)` itself."""
    pages = meta.context_pages.shape[0]
    if pages == 0:
        return k, v
    if pool is None:
        raise ValueError(f"the metadata names {pages} context pages but no KV pool was given")

    def gather(stack: jax.Array, batch: jax.Array) -> jax.Array:
        region = stack[pool.layer, meta.context_pages]  # [C / page, page, Hkv, D]
        return jnp.concatenate([region.reshape(-1, *batch.shape[1:]).astype(batch.dtype), batch])

    return gather(pool.k, k), gather(pool.v, v)
