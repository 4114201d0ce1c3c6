"""The MLP activations by name: their JAX functions, and the codes the native dense kernel's
fused form takes (`score_kernels.cpu.activated_cpu`, `_native/simd.h`'s `Activation`).

- "gelu": x Phi(x) with the exact erf (BERT's, XLM-RoBERTa's `gelu`);
- "gelu_tanh": its tanh approximation (`gelu_new`, `gelu_pytorch_tanh`);
- "relu", "silu";
- "identity": x itself (a product with its bias alone, rounded once: an encoder's q/k/v).
"""

import functools

import jax

FUNCTIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "identity": lambda x: x,
}
CODES = {name: code for code, name in enumerate(FUNCTIONS)}  # as _native/simd.h numbers them


def apply(name: str, x: jax.Array) -> jax.Array:
    """The activation `name` of x, in x's dtype."""
    return FUNCTIONS[name](x)
