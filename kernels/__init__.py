"""Attention kernels for packed prefix batches and the host-side schedule they consume."""

from collections.abc import Callable

from kernels.metadata import AttentionMeta
from kernels.reference import attention_reference
from kernels.schedule import build_block_schedule, make_meta
from kernels.xla import attention_xla

ATTENTION: dict[str, Callable] = {"reference": attention_reference, "xla": attention_xla}

_DEFAULT_BY_BACKEND = {"cpu": "xla", "gpu": "xla", "tpu": "xla"}


def select_attention(name: str | None, backend: str) -> Callable:
    """The attention function called `name`, or the default for `backend` when `name` is None.

    `backend` is a `jax.default_backend()` name; unlisted backends get "xla", which runs anywhere.
    Raises ValueError for an unknown name, listing the known ones.
    """
    if name is None:
        name = _DEFAULT_BY_BACKEND.get(backend, "xla")
    if name not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; known: {sorted(ATTENTION)}")
    return ATTENTION[name]


__all__ = [
    "ATTENTION",
    "AttentionMeta",
    "attention_reference",
    "attention_xla",
    "build_block_schedule",
    "make_meta",
    "select_attention",
]
