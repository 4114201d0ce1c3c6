"""The precision of an attention kernel's dots: f32 operands at full f32, whoever calls the kernel
(a GPU multiplies f32 in TF32 by default, 1e-3 off); bf16 operands are exact at the default."""

import jax
import jax.numpy as jnp


def dot_precision(dtype) -> jax.lax.Precision | None:
    """HIGHEST for f32 operands, the backend's default (None) for any other dtype."""
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
