"""Attention kernels for packed prefix batches, the host-side schedule they consume, and the
choice of dense matmul path."""

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from kernels import cpu, pallas
from kernels.cpu import attention_cpu
from kernels.dense import STRATEGIES, Dense
from kernels.metadata import AttentionMeta
from kernels.pallas import attention_pallas, attention_pallas_auto
from kernels.reference import attention_reference
from kernels.schedule import build_block_schedule, local_spans, make_meta, window_spans
from kernels.xla import attention_xla

# "pallas" compiles on TPU and GPU and runs in the (slow) Pallas interpreter elsewhere.
ATTENTION: dict[str, Callable] = {
    "reference": attention_reference,
    "xla": attention_xla,
    "pallas": attention_pallas_auto,
}
if cpu.AVAILABLE:
    ATTENTION["cpu"] = attention_cpu


def select_attention(
    name: str | None, backend: str, *, head_dim: int | None = None, dtype=None, softcap: float = 0.0
) -> Callable:
    """The attention function called `name`, or the default for `backend` when `name` is None.

    `backend` is a `jax.default_backend()` name. On "cpu" the default is the fused native kernel
    when it was built and supports `head_dim` and `dtype`; on "tpu" and "gpu" it is the Pallas
    kernel when it supports them (None counts as supported); everywhere else, and as the
    fallback, it is "xla", which runs anywhere. The native CPU kernel has no score soft-capping:
    with `softcap` the default is never "cpu". Raises ValueError for an unknown name, listing
    the known ones, or for "cpu" with `softcap`.
    """
    if name is None:
        name = _default_name(backend, head_dim, dtype, softcap)
    if name not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; known: {sorted(ATTENTION)}")
    if name == "cpu" and softcap:
        raise ValueError("attention 'cpu' has no score soft-capping, which this model uses")
    return ATTENTION[name]


DENSE = tuple(STRATEGIES)  # "cpu": bf16 layer matrices packed for the native kernel


def select_dense(name: str | None, backend: str, *, dtype) -> Dense:
    """The dense matmul strategy called `name`, or the default for `backend` when `name` is None.

    The default is "cpu" (`kernels.cpu.dense_cpu`) for bfloat16 weights on a CPU backend where the
    native kernel runs (it needs AVX512-BF16), "xla" otherwise. Raises ValueError for an unknown
    name or "cpu" where it cannot run.
    """
    runs = backend == "cpu" and np.dtype(dtype) == jnp.bfloat16 and cpu.DENSE_AVAILABLE
    if name is None:
        name = "cpu" if runs else "xla"
    if name not in DENSE:
        raise ValueError(f"unknown dense {name!r}; known: {list(DENSE)}")
    if name == "cpu" and not runs:
        raise ValueError(
            "dense 'cpu' needs the CPU backend, bfloat16 weights, the native extension and an "
            f"AVX512-BF16 CPU (backend {backend}, dtype {np.dtype(dtype)}, "
            f"kernel available: {cpu.DENSE_AVAILABLE})"
        )
    return STRATEGIES[name]


def _default_name(backend: str, head_dim: int | None, dtype, softcap: float) -> str:
    if backend == "cpu":
        native = head_dim is not None and cpu.supports(head_dim, dtype) and not softcap
        return "cpu" if native else "xla"
    return "pallas" if pallas.supports(head_dim, dtype, backend) else "xla"


__all__ = [
    "ATTENTION",
    "DENSE",
    "AttentionMeta",
    "Dense",
    "attention_cpu",
    "attention_pallas",
    "attention_pallas_auto",
    "attention_reference",
    "attention_xla",
    "build_block_schedule",
    "local_spans",
    "make_meta",
    "select_attention",
    "select_dense",
    "window_spans",
]
