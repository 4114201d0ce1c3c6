# Token-id conversion shared by the Cython modules: inlined where cimported.

from cpython.buffer cimport (
    PyBUF_RECORDS_RO,
    PyBuffer_IsContiguous,
    PyBuffer_Release,
    PyObject_CheckBuffer,
    PyObject_GetBuffer,
)
from libc.stdint cimport int32_t
from libc.string cimport memcpy


cdef inline object as_i32(object seq):
    """`seq` as a C-contiguous int32 array: converted from a list, else viewed when possible."""
    import numpy as np

    cdef Py_ssize_t i, n
    cdef int[::1] out
    if type(seq) is list:
        n = len(<list>seq)
        arr = np.empty(n, dtype=np.int32)
        out = arr
        for i in range(n):
            out[i] = (<list>seq)[i]
        return arr
    return np.ascontiguousarray(seq, dtype=np.int32)


cdef inline bint is_i32(Py_buffer* view) noexcept:
    """A C-contiguous vector of native int32."""
    return (
        view.ndim == 1
        and view.itemsize == 4
        and view.format != NULL
        and view.format[0] == b"i"
        and view.format[1] == 0
        and PyBuffer_IsContiguous(view, b"C")
    )


cdef inline int read_i32(object seq, Py_ssize_t start, Py_ssize_t stop, int32_t* out) except -1:
    """Copy `seq[start:stop]` (0 <= start <= stop <= len(seq)) into `out` as int32: an int32
    buffer (a `join_ids` view) by its raw buffer, not through a typed memoryview, which costs
    microseconds to take; a list id by id; anything else converted."""
    cdef Py_ssize_t i
    cdef Py_buffer view
    cdef int[::1] converted
    if type(seq) is list:
        for i in range(start, stop):
            out[i - start] = (<list>seq)[i]
        return 0
    if PyObject_CheckBuffer(seq):
        PyObject_GetBuffer(seq, &view, PyBUF_RECORDS_RO)
        if is_i32(&view):
            memcpy(out, <const int32_t*>view.buf + start, (stop - start) * sizeof(int32_t))
            PyBuffer_Release(&view)
            return 0
        PyBuffer_Release(&view)
    converted = as_i32(seq[start:stop])
    for i in range(stop - start):
        out[i] = converted[i]
    return 0
