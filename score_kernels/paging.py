"""The paged KV pool as attention sees it: a batch writes its tokens' keys and values into pool
pages, and reads its context region (`AttentionMeta.context_pages`) back from them.

The pool holds K and V for every layer, `[L, P, page, Hkv, D]` each, as the bits of the attention
dtype (unsigned integers of its width), so a key read from a page is bit-equal to the key the
batch that wrote it computed. Bits, because pages are only ever moved: on a CPU, XLA computes
bf16 in f32, and a bf16 scatter into the pool converted all of it there and back every layer.
Implementations that cannot address pages themselves gather the context region into a
contiguous key array with `with_context`; the native CPU kernel reads the pages in place.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from score_kernels.metadata import AttentionMeta


class LayerPool(NamedTuple):
    """The whole pool and the layer whose pages attention reads (a jax pytree)."""

    k: jax.Array  # u16/u32[L, P, page, Hkv, D]: the bits of the attention dtype
    v: jax.Array  # u16/u32[L, P, page, Hkv, D]
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
    """A zeroed pool of `pages` pages per layer, K and V [L, P, page, Hkv, D] holding `dtype`."""
    shape = (layers, pages, page_size, kv_heads, head_dim)
    bits = bits_dtype(dtype)
    return LayerPool(jnp.zeros(shape, bits), jnp.zeros(shape, bits), jnp.zeros((), jnp.int32))


def bits_dtype(dtype) -> np.dtype:
    """The unsigned integer type the pool stores `dtype` values as."""
    return np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")


def as_bits(x: jax.Array) -> jax.Array:
    """`x` reinterpreted as the unsigned integers of its width."""
    return jax.lax.bitcast_convert_type(x, bits_dtype(x.dtype))


def write(
    pool: LayerPool,
    slots: jax.Array,  # i32[T]: page * page_size + offset per token; out of range: not written
    k: jax.Array,  # [T, Hkv, D] in the dtype the pool holds
    v: jax.Array,  # [T, Hkv, D]
) -> LayerPool:
    """The pool with the batch's K/V written into layer `pool.layer` at `slots`."""
    page, offset = slots // pool.page_size, slots % pool.page_size
    page = jnp.where(slots < 0, pool.k.shape[1], page)  # negative slots are dropped too
    at = (pool.layer, page, offset)

    return pool._replace(
        k=pool.k.at[at].set(as_bits(k), mode="drop"),
        v=pool.v.at[at].set(as_bits(v), mode="drop"),
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
        region = stack[pool.layer, meta.context_pages]  # bits[C / page, page, Hkv, D]
        region = jax.lax.bitcast_convert_type(region, batch.dtype)
        return jnp.concatenate([region.reshape(-1, *batch.shape[1:]), batch])

    return gather(pool.k, k), gather(pool.v, v)
