// C entry points of the CPU packed dense custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handler (an XLA_FFI_Handler*), to register as a custom call target.
void* packed_dense_handler();

// The handler of the gated (SwiGLU) form.
void* packed_gated_handler();

// Whether this CPU runs the kernel (it needs AVX512-BF16).
int packed_dense_supported();

// The size from which the kernels write an f32 output with streaming stores (bytes).
long long packed_dense_stream_bytes();
