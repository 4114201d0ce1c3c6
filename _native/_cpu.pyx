# distutils: language = c++
"""The native CPU kernels as XLA FFI handler capsules, and their knobs: packed attention
(attention.cc), the pre-packed bf16 dense matmul (dense.cc), the f32 one (dense_f32.cc) and the
int8 one (dense_int8.cc)."""

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
    void* packed_activated_handler()
    void* packed_qkv_handler()
    void* packed_add_handler()
    int packed_dense_cpu_has(int isa)
    void packed_dense_set_isa(int isa)
    int packed_dense_isa()
    long long packed_dense_stream_bytes()


cdef extern from "dense_f32.h":
    void* dense_f32_handler()
    int dense_f32_cpu_has(int isa)
    void dense_f32_set_isa(int isa)
    int dense_f32_isa()


cdef extern from "dense_int8.h":
    void* dense_int8_handler()
    void* gated_int8_handler()
    void* activated_int8_handler()
    void* add_int8_handler()
    void* qkv_int8_handler()
    int dense_int8_cpu_has(int isa)
    void dense_int8_set_isa(int isa)
    int dense_int8_isa()


# Instruction-set builds of the attention kernel, by the index the C side uses.
ISAS = ("portable", "avx2", "avx512", "avx512bf16", "amx")


def attention_handler():
    """The XLA FFI handler of the `packed_attention` custom call, as a PyCapsule."""
    return PyCapsule_New(packed_attention_handler(), NULL, NULL)


def dense_handler():
    """The XLA FFI handler of the `packed_dense` custom call, as a PyCapsule."""
    return PyCapsule_New(packed_dense_handler(), NULL, NULL)


def gated_handler():
    """The XLA FFI handler of the `packed_gated` custom call (a SwiGLU MLP's gate and up)."""
    return PyCapsule_New(packed_gated_handler(), NULL, NULL)


def activated_handler():
    """The XLA FFI handler of the `packed_activated` custom call (bias and activation)."""
    return PyCapsule_New(packed_activated_handler(), NULL, NULL)


def qkv_handler():
    """The XLA FFI handler of the `packed_qkv` custom call (a fused q/k/v projection)."""
    return PyCapsule_New(packed_qkv_handler(), NULL, NULL)


def add_handler():
    """The XLA FFI handler of the `packed_dense_add` custom call (the residual form)."""
    return PyCapsule_New(packed_add_handler(), NULL, NULL)


# Instruction-set builds of the bf16 dense kernel, by the index the C side uses.
DENSE_ISAS = ("avx2", "avx512bf16", "amx")


def dense_isas():
    """The bf16 dense kernel's builds this CPU can run, narrowest first."""
    return _builds(DENSE_ISAS, lambda i: packed_dense_cpu_has(i))


def set_dense_isa(name):
    """Use bf16 dense build `name` (one of `dense_isas()`), or None for the widest available."""
    packed_dense_set_isa(_build_index(DENSE_ISAS, dense_isas(), name))


def dense_isa():
    """The bf16 dense build calls use now, or None when this CPU runs none."""
    return _build_name(DENSE_ISAS, packed_dense_isa())


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
    return _builds(ISAS, lambda i: packed_attention_cpu_has(i))


def set_isa(name):
    """Use build `name` (one of `available_isas()`), or None for the widest available."""
    packed_attention_set_isa(_build_index(ISAS, available_isas(), name))


def isa():
    """The build calls use now."""
    return ISAS[packed_attention_isa()]


# Instruction-set builds of the f32 dense kernel, by the index the C side uses.
F32_ISAS = ("avx2", "avx512")


def f32_handler():
    """The XLA FFI handler of the `dense_f32` custom call, as a PyCapsule."""
    return PyCapsule_New(dense_f32_handler(), NULL, NULL)


def f32_isas():
    """The f32 dense kernel's builds this CPU can run, narrowest first."""
    return _builds(F32_ISAS, lambda i: dense_f32_cpu_has(i))


def set_f32_isa(name):
    """Use f32 dense build `name` (one of `f32_isas()`), or None for the widest available."""
    dense_f32_set_isa(_build_index(F32_ISAS, f32_isas(), name))


def f32_isa():
    """The f32 dense build calls use now, or None when this CPU runs none."""
    return _build_name(F32_ISAS, dense_f32_isa())


# Instruction-set builds of the int8 dense kernel, by the index the C side uses.
INT8_ISAS = ("avx2", "avxvnni", "avx512vnni", "amx")


def int8_handler():
    """The XLA FFI handler of the `dense_int8` custom call, as a PyCapsule."""
    return PyCapsule_New(dense_int8_handler(), NULL, NULL)


def int8_gated_handler():
    """The XLA FFI handler of the `gated_int8` custom call (a SwiGLU MLP's gate and up)."""
    return PyCapsule_New(gated_int8_handler(), NULL, NULL)


def int8_activated_handler():
    """The XLA FFI handler of the `activated_int8` custom call (bias and activation)."""
    return PyCapsule_New(activated_int8_handler(), NULL, NULL)


def int8_add_handler():
    """The XLA FFI handler of the `dense_int8_add` custom call (the residual form)."""
    return PyCapsule_New(add_int8_handler(), NULL, NULL)


def int8_qkv_handler():
    """The XLA FFI handler of the `qkv_int8` custom call (a fused q/k/v projection)."""
    return PyCapsule_New(qkv_int8_handler(), NULL, NULL)


def int8_isas():
    """The int8 kernel's builds this CPU can run, narrowest first."""
    return _builds(INT8_ISAS, lambda i: dense_int8_cpu_has(i))


def set_int8_isa(name):
    """Use int8 build `name` (one of `int8_isas()`), or None for the widest available."""
    dense_int8_set_isa(_build_index(INT8_ISAS, int8_isas(), name))


def int8_isa():
    """The int8 build calls use now, or None when this CPU runs none."""
    return _build_name(INT8_ISAS, dense_int8_isa())


def _builds(names, has):
    return tuple(name for i, name in enumerate(names) if has(i))


def _build_index(names, runnable, name):
    """The C side's index of build `name`; -1 (the widest) for None."""
    if name is None:
        return -1
    if name not in names:
        raise ValueError(f"isa must be one of {names} or None, got {name!r}")
    if name not in runnable:
        raise ValueError(f"this CPU cannot run the {name} build; it can run {runnable}")
    return names.index(name)


def _build_name(names, index):
    return names[index] if index >= 0 else None
