"""The platform the engine's programs run on, asked of JAX in this one place."""

import jax


def backend() -> str:
    """The default backend's platform: "cpu", "gpu" or "tpu". Kernels are picked for it
    (`kernels.select_attention`, `kernels.select_dense`), and the default KV pool is sized by its
    memory."""
    return jax.default_backend()
