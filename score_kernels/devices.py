"""The platform the engine's programs run on, asked of JAX in this one place."""

import os

import jax


def backend() -> str:
    """The default backend's platform: "cpu", "gpu" or "tpu". Kernels are picked for it
    (`score_kernels.select_attention`, `score_kernels.select_dense`), and the default KV pool is
    sized by its memory."""
    return jax.default_backend()


def hopper_or_newer() -> bool:
    """Whether the default backend is a GPU of compute capability 9.0 (Hopper) or newer, where
    Pallas' Mosaic GPU backend (wgmma, TMA) runs."""
    if backend() != "gpu":
        return False
    return float(getattr(jax.devices()[0], "compute_capability", "0") or 0) >= 9.0


def share_memory() -> bool:
    """Whether the devices of the default backend share one memory: a CPU's host devices
    (`--xla_force_host_platform_device_count`) all take the host's. Runners on such devices
    divide one default KV pool and compile one at a time."""
    return backend() == "cpu"


def host_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory(device) -> int:
    """Bytes `device` can hold in all: an accelerator's limit, a CPU device's the host's
    physical memory."""
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit") or host_memory()


def free_memory(device) -> int | None:
    """Bytes `device` can still allocate: an accelerator's limit less what it holds, a CPU
    device's the host's available memory (`MemAvailable`); None where neither is known."""
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
