// C entry points of the CPU int8 dense custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handlers (XLA_FFI_Handler*) of the plain and the gated (SwiGLU) form ...
void* dense_int8_handler();
void* gated_int8_handler();
// ... of the bias-and-activation form (bf16 out), the residual form (f32 out: a residual plus
// the product) and the q/k/v form (bf16 q, k and v out), as dense.h's.
void* activated_int8_handler();
void* add_int8_handler();
void* qkv_int8_handler();

// Instruction-set builds, by index: 0 AVX2, 1 AVX-VNNI, 2 AVX512-VNNI, 3 AMX.
int dense_int8_cpu_has(int isa);
// Use build `isa` from now on; -1: the widest this CPU runs.
void dense_int8_set_isa(int isa);
// The build calls use now; -1 when this CPU runs none.
int dense_int8_isa();
