"""oneDNN's matmul with weights packed once at load: the dense path for CPUs with AMX.

On Intel CPUs with AMX (Sapphire Rapids and later) the native AVX512-BF16 kernel is slow
(`vdpbf16ps` has a fraction of the throughput it has on AMD Zen 4/5) and XLA's dot repacks the
weights for oneDNN on every call. This path keeps them in the layout oneDNN chose for this CPU
(`_native/dense_onednn.cc`), whichever matrix instructions it has: AMX tiles, AVX512-BF16 or
AVX-512. `BUILT` is False when the extension was not built (no oneDNN at build time) or the
library (`libdnnl.so.3`, from the `onednn-cpu-gomp` package) cannot be loaded; `AVAILABLE` is
False as well on a CPU where that oneDNN has no bf16 matmul (one with AVX2 but no AVX-512).
"""

import ctypes
import os
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np

from score_kernels.host import aligned_empty

TARGET = "onednn_dense"


def _load():
    """The extension module, with oneDNN's library loaded first (None where either is missing).

    oneDNN runs on OpenMP threads, which by default spin after each call while XLA's threads
    run the next ops on the same cores: passive waiting (unless the environment says otherwise)
    took W1 through this path from 4.8 items/s (spinning) to 7.8-8.1 on two cores.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when libgomp loads, just below
    try:
        files = metadata.distribution("onednn-cpu-gomp").files or []
        [library] = [f for f in files if f.name == "libdnnl.so.3"]
        path = metadata.distribution("onednn-cpu-gomp").locate_file(library)
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # the extension links it by this name
        from _native import _onednn
    except (metadata.PackageNotFoundError, ValueError, OSError, ImportError):
        return None
    return _onednn


_onednn = _load()
BUILT = _onednn is not None
# A bf16 matmul needs AVX-512 in this oneDNN: on an AVX2 CPU it has no implementation to offer.
AVAILABLE = BUILT and _onednn.packed_bytes(64, 64) > 0
if AVAILABLE:
    jax.ffi.register_ffi_target(TARGET, _onednn.dense_handler(), platform="cpu")


def isa() -> str | None:
    """The instruction set oneDNN runs on this CPU ("avx512_core_amx", "avx512_core_bf16",
    ..., "avx2"), None where the extension is not built."""
    return _onednn.isa() if BUILT else None


def supports(k: int, n: int) -> bool:
    """Whether this path takes a [K, N] weight."""
    return AVAILABLE and k > 0 and n > 0 and _onednn.packed_bytes(k, n) > 0


def pack(w) -> np.ndarray:
    """Weights [L, K, N] (any strides: a transposed view packs without a copy of its own)
    rounded to bf16 and packed for `dense`: u8[L, bytes], aligned for
    `score_kernels.host.to_device`."""
    w = np.asarray(w)
    lead, k, n = w.shape
    out = aligned_empty((lead, _onednn.packed_bytes(k, n)), np.uint8)
    for i in range(lead):
        _onednn.pack_into(_bf16(w[i]), out[i])
    return out


def _bf16(w: np.ndarray) -> np.ndarray:
    """w rounded to bf16 in its own memory order (a transposed view stays one)."""
    if w.dtype == jnp.bfloat16:
        return w
    flip = w.flags.f_contiguous and not w.flags.c_contiguous
    return w.T.astype(jnp.bfloat16).T if flip else w.astype(jnp.bfloat16)


def dense(
    x: jax.Array,  # [M, K], cast to bf16
    w: jax.Array,  # u8[L, bytes] from `pack`
    layer: jax.Array,  # i32[]: which of the L matrices
    n: int,  # columns of the packed weights
) -> jax.Array:  # f32[M, N]
    """`x @ W[layer]` through oneDNN: bf16 inputs, f32 accumulation."""
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], n), np.float32))
    return call(x.astype(jnp.bfloat16), w, jnp.asarray(layer, np.int32))
