// C entry points of the oneDNN dense custom call, for the Cython wrapper.
#pragma once

// The XLA FFI handler (an XLA_FFI_Handler*), to register as a custom call target.
void* onednn_dense_handler();

// Bytes of one packed [k, n] weight matrix; -1 if oneDNN has no matmul for it.
long long onednn_packed_bytes(long long k, long long n);

// Packs bf16 weights w[k, n], element (i, j) at w + i * stride_k + j * stride_n (in elements),
// into out (onednn_packed_bytes(k, n) bytes); 0 on success, -1 on failure.
int onednn_pack(const void* w, long long k, long long n, long long stride_k, long long stride_n,
                void* out);

// The instruction set oneDNN dispatches to on this CPU ("avx512_core_amx", ...).
const char* onednn_isa();
