"""A GGUF file's tensors as float32 arrays in Hugging Face orientation, for the loaders
(`engine.loaders.gguf`, `engine.loaders.gguf_encoder`)."""

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import GGUFTensor

_DEQUANTIZE_BYTES = 1 << 16  # per gguf call: amortises its overhead, temporaries stay in cache


def require_tensor(tensors: dict[str, GGUFTensor], name: str, source: str) -> GGUFTensor:
    tensor = tensors.get(name)
    if tensor is None:
        raise CheckpointError(f"{source}: missing tensor {name!r}")
    return tensor


def dequantized(tensor: GGUFTensor, shape: tuple[int, ...], source: str) -> np.ndarray:
    """The tensor as float32 in HF orientation: ggml lists dims innermost first, so reversed."""
    hf_shape = tensor.shape[::-1]
    if hf_shape != shape:
        raise CheckpointError(
            f"{source}: tensor {tensor.name!r} has shape {list(hf_shape)}, expected {list(shape)}"
        )
    try:
        values = _dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise CheckpointError(
            f"{source}: tensor {tensor.name!r} has unsupported type {tensor.tensor_type.name}"
        ) from error
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _dequantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """`gguf.quants.dequantize(data, qtype)` (to be reshaped), in calls of about
    `_DEQUANTIZE_BYTES` each.

    It dequantises block by block, so any split into whole rows gives the same values; left to
    itself it makes a call per 16 rows, whose overhead was ~40% of SmolLM2's dequantisation.
    """
    if data.dtype != np.uint8 or data.size == 0:  # stored as elements: one vectorised cast
        return dequantize(data, qtype)
    rows = data.reshape(-1, data.shape[-1])
    step = max(1, _DEQUANTIZE_BYTES // rows.shape[1])
    parts = [
        dequantize(rows[i : i + step].reshape(1, -1), qtype) for i in range(0, len(rows), step)
    ]
    return np.concatenate(parts, axis=1)


def owned(weight: np.ndarray, tensor: GGUFTensor) -> np.ndarray:
    """An array independent of the memory-mapped file (F32 tensors dequantise to a view of it)."""
    if np.may_share_memory(weight, tensor.data):
        return np.array(weight, dtype=np.float32)
    return np.ascontiguousarray(weight)
