// What the dense kernels' AMX builds share: whether this CPU and kernel may use the tiles, and
// the tile configuration every thread loads before its first tile instruction of a call.
//
// AMX (Sapphire Rapids and later) multiplies 16 x 64-byte tiles: a C tile of 16 x 16 f32 or
// int32 sums takes A (16 rows of 64 bytes: 32 bf16 or 64 int8 values of K) times B (16 rows of
// K pairs or quads, each row 16 columns' 64 bytes), which is the layout the native kernels pack
// their weights in for the AVX-512 dot products already. Linux hands a process the tile state
// only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), once; each thread then loads a tile
// configuration, which another library on the same thread (oneDNN, in XLA's dots) may replace
// between two calls, so the kernels load theirs at the start of every call's work on a thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NATIVE_AMX 1
#else
#define NATIVE_AMX 0
#endif

namespace amx_tiles {

// The CPU has the AMX tiles and `kind` ("int8" or "bf16") of tile dot products, and the kernel
// (Linux) lets this process use them. Asked of the CPU and Linux once, the permission being the
// whole process's: the kernels ask this on every call (a CPUID in a virtual machine is a trap).
inline bool usable(const char* kind) {
#if NATIVE_AMX
  // CPUID leaf 7's EDX flags, or none without the tiles or Linux's grant
  static const unsigned features = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24))) return 0u;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0 ? d : 0u;
  }();
  const unsigned bit = std::strcmp(kind, "int8") == 0 ? 25 : 22;  // AMX-INT8 : AMX-BF16
  return (features >> bit) & 1u;
#else
  (void)kind;
  return false;
#endif
}

// Calls of the AMX builds, counted: a thread whose last configuration was for an earlier call
// loads it again (`configure`), since other code may have run tiles on it in between.
inline std::atomic<uint64_t> g_calls{0};
inline thread_local uint64_t t_configured = 0;

// A new call's number, for `configure`.
inline uint64_t begin_call() { return ++g_calls; }

// A B tile's 16 rows of 64 bytes at `rows`, of which `held` lie inside K: in place when all do,
// else those copied into `tail` with zero rows after them (the A values they would meet are past
// K too, and the rows past K would be read beyond the weights).
inline const void* b_rows(const void* rows, int64_t held, uint8_t (&tail)[16][64]) {
  if (held >= 16) return rows;
  std::memcpy(tail, rows, held * 64);
  std::memset(tail[held], 0, (16 - held) * 64);
  return tail;
}

#if NATIVE_AMX
// Eight tiles of 16 rows of 64 bytes: C tiles 0-3, A tiles 4-5, B tiles 6-7.
__attribute__((target("amx-tile"))) inline void configure(uint64_t call) {
  if (t_configured == call) return;
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.bytes[t] = 64;
    config.rows[t] = 16;
  }
  // the whole configuration as the operand: GCC 12's _tile_loadconfig names only its first 8
  // bytes, and the stores of the rest were then dropped as dead (a #GP on stack garbage)
  asm volatile("ldtilecfg %0" ::"m"(config));
  t_configured = call;
}

// The C tiles of 32 rows by G (1 or 2) groups: tile 2 r + g holds rows 16 r.. by group g.
template <int G>
inline void zero_c() {
  _tile_zero(0);
  _tile_zero(2);
  if (G > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
}

// The C tiles into c[row tile][group] (f32 or int32 sums, 16 x 16 each).
template <int G, class T>
inline void store_c(T (&c)[2][G][16][16]) {
  _tile_stored(0, c[0][0], 64);
  _tile_stored(2, c[1][0], 64);
  if (G > 1) {
    _tile_stored(1, c[0][G - 1], 64);
    _tile_stored(3, c[1][G - 1], 64);
  }
}
#endif

}  // namespace amx_tiles
