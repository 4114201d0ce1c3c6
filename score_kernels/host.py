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


def interleave_to_device(parts: Sequence, dtype) -> jax.Array:
    """`jnp.asarray(np.stack(parts, axis=-1).reshape(*lead, n * len(parts)), dtype)` for parts of
    one shape [..., n]: column j of each part side by side, each converted into its place."""
    parts = [np.asarray(part) for part in parts]
    out = aligned_empty((*parts[0].shape, len(parts)), dtype)
    for i, part in enumerate(parts):
        np.copyto(out[..., i], part, casting="unsafe")
    return jax.device_put(out.reshape(*parts[0].shape[:-1], -1))
