"""Attention kernels for packed prefix batches, the host-side schedule they consume, and the
choice of dense matmul path."""

from collections.abc import Callable

import numpy as np

from score_kernels import cpu, dense_choice, devices, mosaic_gpu, onednn, pallas
from score_kernels.cpu import attention_cpu
from score_kernels.dense import STRATEGIES, Dense
from score_kernels.metadata import AttentionMeta
from score_kernels.mosaic_gpu import attention_mosaic_gpu, attention_mosaic_gpu_auto
from score_kernels.pallas import attention_pallas, attention_pallas_auto
from score_kernels.reference import attention_reference
from score_kernels.schedule import build_block_schedule, local_spans, make_meta, window_spans
from score_kernels.xla import attention_xla

# "pallas" compiles on TPU and GPU (Triton) and runs in the (slow) Pallas interpreter elsewhere;
# "mosaic" is the Mosaic GPU form for Hopper and newer (bf16), GPU-interpreted off a GPU.
ATTENTION: dict[str, Callable] = {
    "reference": attention_reference,
    "xla": attention_xla,
    "pallas": attention_pallas_auto,
    "mosaic": attention_mosaic_gpu_auto,
}
if cpu.AVAILABLE:
    ATTENTION["cpu"] = attention_cpu


def select_attention(
    name: str | None,
    backend: str,
    *,
    head_dim: int | None = None,
    dtype=None,
    softcap: float = 0.0,
    block_size: int | None = None,
    sharded: bool = False,
) -> Callable:
    """The attention function called `name`, or the default for `backend` when `name` is None.

    `backend` is a platform name (`score_kernels.devices.backend()`). On "cpu" the default is the
    fused native kernel when it was built and supports `head_dim` and `dtype`; on a Hopper or newer
    GPU it is "mosaic" (the Mosaic GPU form, `score_kernels.mosaic_gpu`) where it runs `head_dim`,
    `dtype` and the schedule's `block_size` (None counts as supported); on "tpu" and "gpu"
    otherwise the Pallas kernel ("pallas": Triton on a GPU) when it supports them; everywhere
    else, and as the fallback, it is "xla", which runs anywhere. The native CPU kernel has no
    score soft-capping: with `softcap` the default is never "cpu". Raises ValueError for an
    unknown name, listing the known ones, for "cpu" with `softcap`, or for "mosaic" with a dtype,
    head dim or block size it does not run (`mosaic_gpu.supports`), or interpreted (off a GPU)
    for a program `sharded` over several devices.
    """
    if name is None:
        name = _default_name(backend, head_dim, dtype, softcap, block_size)
    if name not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; known: {sorted(ATTENTION)}")
    if name == "cpu" and softcap:
        raise ValueError("attention 'cpu' has no score soft-capping, which this model uses")
    if name == "mosaic" and not mosaic_gpu.supports(head_dim, dtype):
        raise ValueError(
            "attention 'mosaic' runs bfloat16 with a head dim that is a multiple of 64, not "
            f"{np.dtype(dtype) if dtype is not None else None} with head dim {head_dim}"
        )
    if name == "mosaic" and not mosaic_gpu.supports(None, None, block_size):
        raise ValueError(
            f"attention 'mosaic' needs a block_size that is a multiple of {mosaic_gpu.ROWS}, "
            f"not {block_size}"
        )
    if name == "mosaic" and sharded and mosaic_gpu.interpreted():
        raise ValueError(
            "'mosaic' off a GPU runs in an interpreter that serves one device at a time: "
            "tensor_parallel needs another attention here"
        )
    return ATTENTION[name]


DENSE = tuple(STRATEGIES)  # "cpu" and "onednn": layer matrices packed once at load
INT8_DENSE = ("int8", "int8-xla")  # the strategies of the int8 compute mode


def select_dense(
    name: str | None,
    backend: str,
    *,
    dtype,
    int8: bool = False,
    cache_dir: str | None = None,
) -> Dense:
    """The dense matmul strategy called `name`, or the default for `backend` when `name` is None.

    Where more than one strategy runs (a CPU backend with the native kernels: bfloat16 or
    float32 weights, or the int8 mode), the default is the measured one
    (`score_kernels.dense_choice.measured`): each weight shape multiplied by the fastest eligible
    strategy on this machine, the choices kept under `cache_dir` (None: measured once per
    process). Elsewhere it is "xla", or "int8-xla" in the int8 mode (`int8`). The fixed
    strategies are "xla", "cpu" (the native kernel of the weight dtype: bf16 on AMX, AVX512-BF16
    or AVX2, f32 on AVX-512 or AVX2), "onednn" (oneDNN's matmul on bf16 weights it packed, AMX
    where the CPU has it), and in the int8 mode "int8" (the native kernel: AMX-INT8, VNNI or
    AVX2) and "int8-xla"
    (the same arithmetic in XLA). Raises ValueError for an unknown name, a
    strategy of the other mode, or a native one where it cannot run.
    """
    if int8:
        return _select_int8(name, backend, cache_dir)
    on_cpu, mode = backend == "cpu", np.dtype(dtype).name
    native = {"bfloat16": cpu.DENSE_AVAILABLE, "float32": cpu.F32_AVAILABLE}.get(mode, False)
    runs = {"xla": True, "cpu": on_cpu and native}
    runs["onednn"] = on_cpu and mode == "bfloat16" and onednn.AVAILABLE
    if name is None:
        several = sum(runs.values()) > 1
        return dense_choice.measured(mode, cache_dir) if several else STRATEGIES["xla"]
    if name not in DENSE:
        raise ValueError(f"unknown dense {name!r}; known: {list(DENSE)}")
    if name in INT8_DENSE:
        raise ValueError(f"dense {name!r} is the int8 compute mode's: use dtype 'int8'")
    if not runs[name]:
        weights = "bfloat16 or float32" if name == "cpu" else "bfloat16"
        needs = {
            "cpu": "an AVX2 or AVX512-BF16 CPU (AVX2 or AVX-512 for float32)",
            "onednn": "the oneDNN extension and an AVX-512 CPU (oneDNN's bf16 matmul)",
        }[name]
        raise ValueError(
            f"dense {name!r} needs the CPU backend, {weights} weights, and {needs} (backend "
            f"{backend}, dtype {np.dtype(dtype)}, native kernels: bf16 {cpu.DENSE_AVAILABLE}, "
            f"f32 {cpu.F32_AVAILABLE}, "
            f"oneDNN built: {onednn.BUILT}, on {onednn.isa() or 'none'})"
        )
    return STRATEGIES[name]


def dense_runs(name: str, backend: str, *, dtype, int8: bool = False) -> bool:
    """Whether `select_dense` takes the strategy `name` here (no exception)."""
    try:
        select_dense(name, backend, dtype=dtype, int8=int8)
    except ValueError:
        return False
    return True


def _select_int8(name: str | None, backend: str, cache_dir: str | None) -> Dense:
    runs = backend == "cpu" and cpu.INT8_AVAILABLE
    if name is None:
        return dense_choice.measured("int8", cache_dir) if runs else STRATEGIES["int8-xla"]
    if name not in INT8_DENSE:
        raise ValueError(f"dtype 'int8' computes with dense {list(INT8_DENSE)}, not {name!r}")
    if name == "int8" and not runs:
        raise ValueError(
            "dense 'int8' needs the CPU backend, the native extension and an AVX2 CPU"
            f" (backend {backend}, kernel available: {cpu.INT8_AVAILABLE})"
        )
    return STRATEGIES[name]


def _default_name(
    backend: str, head_dim: int | None, dtype, softcap: float, block_size: int | None
) -> str:
    if backend == "cpu":
        native = head_dim is not None and cpu.supports(head_dim, dtype) and not softcap
        return "cpu" if native else "xla"
    mosaic = mosaic_gpu.supports(head_dim, dtype, block_size)
    if backend == "gpu" and mosaic and devices.hopper_or_newer():
        return "mosaic"
    return "pallas" if pallas.supports(head_dim, dtype, backend) else "xla"


__all__ = [
    "ATTENTION",
    "DENSE",
    "INT8_DENSE",
    "AttentionMeta",
    "Dense",
    "attention_cpu",
    "attention_mosaic_gpu",
    "attention_mosaic_gpu_auto",
    "attention_pallas",
    "attention_pallas_auto",
    "attention_reference",
    "attention_xla",
    "build_block_schedule",
    "dense_runs",
    "local_spans",
    "make_meta",
    "select_attention",
    "select_dense",
    "window_spans",
]
