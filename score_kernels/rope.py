"""Rotate-half RoPE, as transformers applies it to q and k: the head's first and second halves
turned together by each frequency's angle (`engine.models.decoder.Rope` computes the angles;
`score_kernels.cpu.qkv_cpu` applies the same rotation in the native q/k/v projection)."""

import jax
import jax.numpy as jnp


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x f32[T, heads, D] rotated by cos/sin f32[T, D/2]: (x1 cos - x2 sin, x2 cos + x1 sin)."""
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, D/2]: every head alike
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
