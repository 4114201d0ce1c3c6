# Token-id conversion shared by the Cython modules: inlined where cimported.

cimport numpy as cnp
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


cdef inline const int32_t* i32_data(object seq) noexcept:
    """The ids of `seq` in place when it is a C-contiguous vector of native int32 (a view of
    `join_ids` or the native tokenizer), else NULL. Asked of numpy's C API: taking a buffer
    instead costs some 0.4 us a sequence, and a batch has hundreds."""
    if type(seq) is not cnp.ndarray:
        return NULL
    cdef cnp.ndarray a = <cnp.ndarray>seq
    if (
        cnp.PyArray_NDIM(a) == 1
        and cnp.PyArray_TYPE(a) == cnp.NPY_INT32
        and cnp.PyArray_ISCARRAY_RO(a)
        and cnp.PyArray_ISNOTSWAPPED(a)
    ):
        return <const int32_t*>cnp.PyArray_DATA(a)
    return NULL


cdef inline int read_i32(object seq, Py_ssize_t start, Py_ssize_t stop, int32_t* out) except -1:
    """Copy `seq[start:stop]` (0 <= start <= stop <= len(seq)) into `out` as int32: in place
    (`i32_data`), a list id by id, anything else converted."""
    cdef Py_ssize_t i
    cdef const int32_t* ids = i32_data(seq)
    cdef int[::1] converted
    if ids != NULL:
        memcpy(out, ids + start, (stop - start) * sizeof(int32_t))
    elif type(seq) is list:
        for i in range(start, stop):
            out[i - start] = (<list>seq)[i]
    else:
        converted = as_i32(seq[start:stop])
        for i in range(stop - start):
            out[i] = converted[i]
    return 0
