// C entry points of the CPU packed attention custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handler (an XLA_FFI_Handler*), to register as a custom call target.
void* packed_attention_handler();

// Worker threads per call; 0 (the default) means every core this process may run on.
void packed_attention_set_threads(int threads);

// Instruction-set builds: 0 portable, 1 AVX2+FMA, 2 AVX-512, 3 AVX-512 with BF16 dot products.
int packed_attention_cpu_has(int isa);  // whether this CPU can run build `isa`
void packed_attention_set_isa(int isa);  // -1 (the default) picks the widest this CPU has
int packed_attention_isa();  // the build calls use now
