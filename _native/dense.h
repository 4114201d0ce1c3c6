// C entry points of the CPU packed dense custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handler (an XLA_FFI_Handler*), to register as a custom call target.
void* packed_dense_handler();

// The handler of the gated (SwiGLU) form.
void* packed_gated_handler();

// The handler of the bias-and-activation form (bf16 out).
void* packed_activated_handler();

// The handler of the q/k/v form (bf16 q, k and v out).
void* packed_qkv_handler();

// The handler of the residual form (f32 out: a residual plus the product).
void* packed_add_handler();

// Instruction-set builds, by index: 0 AVX2, 1 AVX512-BF16, 2 AMX.
int packed_dense_cpu_has(int isa);
// Use build `isa` from now on; -1: the widest this CPU runs.
void packed_dense_set_isa(int isa);
// The build calls use now; -1 when this CPU runs none.
int packed_dense_isa();

// The size from which the kernels write an f32 output with streaming stores (bytes).
long long packed_dense_stream_bytes();
