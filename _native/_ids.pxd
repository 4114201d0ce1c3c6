# Token-id conversion shared by the Cython modules: inlined where cimported.


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
