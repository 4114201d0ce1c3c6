"""The device program lowered for TPU or GPU on any host (`jax.export`): the forward of one
packed batch with the Pallas attention in its compiled form (TPU's, Triton's on "gpu", or the
Mosaic GPU form on "mosaic_gpu"), so that a program the accelerator could not be given fails
here, on the CPU, rather than on the device."""

import functools

import jax
from jax import export

from engine.device.program import DeviceProgram
from engine.host.packing import empty_batch
from score_kernels.dense import XLA
from score_kernels.mosaic_gpu import attention_mosaic_gpu
from score_kernels.pallas import attention_pallas

# our platform names -> jax.export's, and the custom call that launches the kernel
TARGETS = {"tpu": "tpu", "gpu": "cuda", "mosaic_gpu": "cuda"}
KERNEL_CALLS = {
    "tpu": "tpu_custom_call",
    "gpu": "__gpu$xla.gpu.triton",
    "mosaic_gpu": "mosaic_gpu_v2",
}
# the compiled kernel form exported for each platform
KERNELS = {
    "tpu": functools.partial(attention_pallas, platform="tpu"),
    "gpu": functools.partial(attention_pallas, platform="gpu"),
    "mosaic_gpu": attention_mosaic_gpu,
}
# JAX promises no serialisation compatibility for Triton calls: lowering is what is checked
_UNCHECKED = {"gpu": [export.DisabledSafetyCheck.custom_call(KERNEL_CALLS["gpu"])]}


def export_program(
    program: DeviceProgram,
    platform: str,
    shape: tuple[int, int, int],
    block_size: int,
    *,
    context: int = 0,
) -> export.Exported:
    """`program`'s forward of a batch of shape (T, S, L) that reads `context` keys from the KV
    pool, lowered for `platform` ("tpu", "gpu" or "mosaic_gpu") with the Pallas kernel compiled
    at that platform's tuned tiles. Only shapes and dtypes are used, not the weights' values. The
    program must take the XLA dense path (the native kernel is the CPU's) and, for a context,
    have a pool. Raises ValueError otherwise; a lowering error propagates."""
    if platform not in TARGETS:
        raise ValueError(f"platform must be one of {sorted(TARGETS)}, got {platform!r}")
    if program.dense is not XLA:
        raise ValueError(f"export needs the 'xla' dense path, not {program.dense.name!r}")
    if context and program.kv.arrays is None:
        raise ValueError("a context region needs a KV pool (kv_cache_bytes > 0)")
    forward = program.forward_of(KERNELS[platform])
    window = program.config.window
    batch = empty_batch(*shape, block_size, window, context=context, page_size=program.kv.page_size)
    lower = export.export(
        jax.jit(forward),
        platforms=[TARGETS[platform]],
        disabled_checks=_UNCHECKED.get(platform, []),
    )
    return lower(_abstract(program.params), batch, _abstract(program.kv.arrays))


def _abstract(tree):
    """Shapes and dtypes only: nothing is copied or computed for an export."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
