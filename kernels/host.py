"""Host weights onto the device with one pass over them.

`jnp.asarray(w, dtype)` converts on the host and then copies the result into device memory; on
the CPU backend that second copy runs several times slower than numpy's. PJRT's CPU client
adopts a host buffer aligned to `ALIGNMENT` bytes as it is instead, so these helpers write the
converted weights straight into such a buffer and hand it over. Elsewhere the transfer is the
usual one. Each buffer is fresh and owned by the device array: nothing else writes to it.
"""

import math
from collections.abc import Sequence

import jax
import numpy as np

ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `ALIGNMENT`-byte boundary."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


def to_device(w, dtype=None) -> jax.Array:
    """`jnp.asarray(w, dtype)` for a host array `w` (the same rounding: numpy's); a device array
    that already has the dtype is returned as it is."""
    if isinstance(w, jax.Array) and (dtype is None or w.dtype == dtype):
        return w
    w = np.asarray(w)
    out = aligned_empty(w.shape, w.dtype if dtype is None else dtype)
    np.copyto(out, w, casting="unsafe")
    return jax.device_put(out)


def concat_to_device(parts: Sequence, dtype) -> jax.Array:
    """`jnp.asarray(np.concatenate(parts, axis=-1), dtype)`, each part converted into its place."""
    parts = [np.asarray(part) for part in parts]
    lead = parts[0].shape[:-1]
    out = aligned_empty((*lead, sum(part.shape[-1] for part in parts)), dtype)
    start = 0
    for part in parts:
        stop = start + part.shape[-1]
        np.copyto(out[..., start:stop], part, casting="unsafe")
        start = stop
    return jax.device_put(out)
