# distutils: language = c++
"""The native CPU kernels as XLA FFI handler capsules, and their knobs: packed attention
(attention.cc), the pre-packed bf16 dense matmul (dense.cc) and the int8 one (dense_int8.cc)."""

from cpython.pycapsule cimport PyCapsule_New


cdef extern from "attention.h":
    void* packed_attention_handler()
    void packed_attention_set_threads(int threads)
    int packed_attention_cpu_has(int isa)
    void packed_attention_set_isa(int isa)
    int packed_attention_isa()


cdef extern from "dense.h":
    void* packed_dense_handler()
    void* packed_gated_handler()
    int packed_dense_supported()
    long long packed_dense_stream_bytes()


cdef extern from "dense_int8.h":
    void* dense_int8_handler()
    void* gated_int8_handler()
    int dense_int8_cpu_has(int isa)
    void dense_int8_set_isa(int isa)
    int dense_int8_isa()


# Instruction-set builds of the attention kernel, by the index the C side uses.
ISAS = ("portable", "avx2", "avx512", "avx512bf16")


def attention_handler():
    """The XLA FFI handler of the `packed_attention` custom call, as a PyCapsule."""
    return PyCapsule_New(packed_attention_handler(), NULL, NULL)


def dense_handler():
    """The XLA FFI handler of the `packed_dense` custom call, as a PyCapsule."""
    return PyCapsule_New(packed_dense_handler(), NULL, NULL)


def gated_handler():
    """The XLA FFI handler of the `packed_gated` custom call (a SwiGLU MLP's gate and up)."""
    return PyCapsule_New(packed_gated_handler(), NULL, NULL)


def dense_supported():
    """Whether this CPU runs the dense kernel (it needs AVX512-BF16)."""
    return bool(packed_dense_supported())


def stream_bytes():
    """The size (bytes) from which the dense kernels stream an f32 output past the caches."""
    return packed_dense_stream_bytes()


def set_threads(int threads):
    """Worker threads per kernel call (attention and dense); 0 means every core this process may run on."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    packed_attention_set_threads(threads)


def available_isas():
    """The instruction-set builds this CPU can run, narrowest first."""
    return tuple(name for i, name in enumerate(ISAS) if packed_attention_cpu_has(i))


def set_isa(name):
    """Use build `name` (one of `available_isas()`), or None for the widest available."""
    if name is None:
        packed_attention_set_isa(-1)
        return
    if name not in ISAS:
        raise ValueError(f"isa must be one of {ISAS} or None, got {name!r}")
    if not packed_attention_cpu_has(ISAS.index(name)):
        raise ValueError(f"this CPU cannot run the {name} build; it can run {available_isas()}")
    packed_attention_set_isa(ISAS.index(name))


def isa():
    """The build calls use now."""
    return ISAS[packed_attention_isa()]


# Instruction-set builds of the int8 dense kernel, by the index the C side uses.
INT8_ISAS = ("avx2", "avxvnni", "avx512vnni")


def int8_handler():
    """The XLA FFI handler of the `dense_int8` custom call, as a PyCapsule."""
    return PyCapsule_New(dense_int8_handler(), NULL, NULL)


def int8_gated_handler():
    """The XLA FFI handler of the `gated_int8` custom call (a SwiGLU MLP's gate and up)."""
    return PyCapsule_New(gated_int8_handler(), NULL, NULL)


def int8_isas():
    """The int8 kernel's builds this CPU can run, narrowest first."""
    return tuple(name for i, name in enumerate(INT8_ISAS) if dense_int8_cpu_has(i))


def set_int8_isa(name):
    """Use int8 build `name` (one of `int8_isas()`), or None for the widest available."""
    if name is None:
        dense_int8_set_isa(-1)
        return
    if name not in INT8_ISAS:
        raise ValueError(f"isa must be one of {INT8_ISAS} or None, got {name!r}")
    if not dense_int8_cpu_has(INT8_ISAS.index(name)):
        raise ValueError(f"this CPU cannot run the {name} build; it can run {int8_isas()}")
    dense_int8_set_isa(INT8_ISAS.index(name))


def int8_isa():
    """The int8 build calls use now, or None when this CPU runs none."""
    index = dense_int8_isa()
    return INT8_ISAS[index] if index >= 0 else None
