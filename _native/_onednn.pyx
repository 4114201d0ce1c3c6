# distutils: language = c++
"""oneDNN's matmul as an XLA FFI handler capsule (dense_onednn.cc), and its weight packing.

Built only where the oneDNN headers and library were found at build time; the library itself
(`libdnnl.so.3`) must be loaded first (`score_kernels.onednn` does it)."""

from cpython.pycapsule cimport PyCapsule_New

cimport numpy as cnp

import numpy as np

cnp.import_array()


cdef extern from "dense_onednn.h":
    void* onednn_dense_handler()
    long long onednn_packed_bytes(long long k, long long n)
    int onednn_pack(
        const void* w, long long k, long long n, long long stride_k, long long stride_n, void* out
    )
    const char* onednn_isa()


def dense_handler():
    """The XLA FFI handler of the `onednn_dense` custom call, as a PyCapsule."""
    return PyCapsule_New(onednn_dense_handler(), NULL, NULL)


def packed_bytes(long long k, long long n):
    """Bytes of one packed [k, n] weight matrix, or -1 where oneDNN has no matmul for it."""
    return onednn_packed_bytes(k, n)


def pack_into(cnp.ndarray w, cnp.ndarray out):
    """Pack 16-bit (bf16) weights w[k, n], of any element strides (a transposed view too), into
    out (packed_bytes(k, n) contiguous bytes)."""
    if w.ndim != 2 or w.itemsize != 2 or w.strides[0] % 2 or w.strides[1] % 2:
        raise ValueError("w must be a bf16 [k, n] array")
    k, n = w.shape[0], w.shape[1]
    if not out.flags.c_contiguous or out.nbytes != onednn_packed_bytes(k, n):
        raise ValueError(f"out must be {onednn_packed_bytes(k, n)} contiguous bytes")
    if onednn_pack(w.data, k, n, w.strides[0] // 2, w.strides[1] // 2, out.data) != 0:
        raise RuntimeError(f"oneDNN could not pack weights of shape {(k, n)}")


def isa():
    """The instruction set oneDNN dispatches to on this CPU."""
    return onednn_isa().decode()
