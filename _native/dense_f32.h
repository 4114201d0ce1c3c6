// C entry points of the CPU packed f32 dense custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handler (an XLA_FFI_Handler*), to register as a custom call target.
void* dense_f32_handler();

// Instruction-set builds, by index: 0 AVX2, 1 AVX-512.
int dense_f32_cpu_has(int isa);
// Use build `isa` from now on; -1: the widest this CPU runs.
void dense_f32_set_isa(int isa);
// The build calls use now; -1 when this CPU runs none.
int dense_f32_isa();
