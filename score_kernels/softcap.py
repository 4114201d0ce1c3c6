"""Logit soft-capping (Gemma 2): `cap * tanh(x / cap)` bounds logits to (-cap, cap) smoothly."""

import jax
import jax.numpy as jnp


def soft_cap(x: jax.Array, cap: float) -> jax.Array:
    """`cap * tanh(x / cap)`, or x itself when `cap` is 0 (no capping)."""
    return cap * jnp.tanh(x / cap) if cap else x
