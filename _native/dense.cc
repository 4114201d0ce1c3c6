// Dense bf16 matmul with pre-packed weights for the CPU, as an XLA FFI custom call.
//
// out f32[M, N] = a bf16[M, K] @ W, W being layer `layer` of a weight stack packed as
// bf16[L, N/16, K/2, 32]: per 16-column group and pair of rows (k, k+1), the 16 columns'
// (W[k, n], W[k+1, n]) pairs, which is the operand layout of the AVX512-BF16 dot product. The
// weights are packed once at load; XLA's CPU GEMMs repack bf16 weights on every call, which
// costs more than the multiply itself for small batches. Taking the whole stack and a layer
// index keeps a `lax.scan` over layers from copying each layer's weights out of the stack.
//
// Products are exact in f32 and accumulate in f32, as `preferred_element_type=float32` does.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "cpu_pool.h"
#include "dense.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace packed_dense {

struct Problem {
  int64_t m, n, k;
  const uint16_t* a;  // [m, k]
  const uint16_t* w;  // [n / 16, k / 2, 32]
  float* out;         // [m, n]
};

constexpr int kRows = 8;    // rows of a register tile
constexpr int kGroups = 3;  // 16-column groups of a register tile: 8 x 3 accumulators

#if defined(__x86_64__) && defined(__GNUC__)
#define PACKED_DENSE_NATIVE 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma")

typedef int32_t __attribute__((may_alias)) Pair;  // two bf16 values read as one lane

// out[R, 16 G] = a[R, k] @ the G column groups at w (each `stride` elements apart).
template <int R, int G>
void tile(const uint16_t* a, int64_t k, const uint16_t* w, int64_t stride, float* out,
          int64_t n) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  const int64_t pairs = k / 2;
  const Pair* rows = reinterpret_cast<const Pair*>(a);
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[G];
    for (int g = 0; g < G; ++g)
      b[g] = (__m512bh)_mm512_loadu_si512(w + g * stride + p * 32);
    for (int r = 0; r < R; ++r) {
      __m512bh x = (__m512bh)_mm512_set1_epi32(rows[r * pairs + p]);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], x, b[g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(out + r * n + g * 16, acc[r][g]);
}

using Tile = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);

template <int G, int... R>
constexpr auto row_tiles(std::integer_sequence<int, R...>) {
  return std::array<Tile, sizeof...(R)>{&tile<R + 1, G>...};
}

// TILES[g - 1][r - 1] computes r rows by g groups.
const std::array<std::array<Tile, kRows>, kGroups> TILES = {
    row_tiles<1>(std::make_integer_sequence<int, kRows>{}),
    row_tiles<2>(std::make_integer_sequence<int, kRows>{}),
    row_tiles<3>(std::make_integer_sequence<int, kRows>{}),
};

#pragma GCC pop_options
#else
#define PACKED_DENSE_NATIVE 0
#endif

bool cpu_supported() {
#if PACKED_DENSE_NATIVE
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

#if PACKED_DENSE_NATIVE
// Rows [r0, r1) by column panels [p0, p1): each panel (kGroups groups) stays in L2 while the
// rows' register tiles stream past it.
void block(const Problem& p, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  const int64_t groups = p.n / 16, stride = p.k * 16;
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t g0 = panel * kGroups;
    const int g = int(std::min<int64_t>(kGroups, groups - g0));
    for (int64_t r = r0; r < r1; r += kRows) {
      const int rows = int(std::min<int64_t>(kRows, r1 - r));
      TILES[g - 1][rows - 1](p.a + r * p.k, p.k, p.w + g0 * stride, stride,
                             p.out + r * p.n + g0 * 16, p.n);
    }
  }
}

void run(const Problem& p) {
  const int64_t groups = p.n / 16, panels = (groups + kGroups - 1) / kGroups;
  // about 256 KiB of activations per block, beside one weight panel, within L2
  const int64_t block_rows = std::clamp<int64_t>((128 * 1024 / p.k) / kRows * kRows, kRows, 512);
  const int64_t row_blocks = (p.m + block_rows - 1) / block_rows;
  // small batches split the columns too, so every thread has work
  const int64_t wanted = 4 * native_cpu::thread_count();
  const int64_t splits = std::clamp<int64_t>((wanted + row_blocks - 1) / row_blocks, 1, panels);
  native_cpu::parallel_for(int(row_blocks * splits), [&](int item) {
    const int64_t rb = item / splits, s = item % splits;
    const int64_t r0 = rb * block_rows, r1 = std::min(p.m, r0 + block_rows);
    block(p, r0, r1, s * panels / splits, (s + 1) * panels / splits);
  });
}
#endif

std::string dims(const ffi::AnyBuffer& buffer) {
  std::string text;
  for (int64_t d : buffer.dimensions()) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return "[" + text + "]";
}

ffi::Error Dense(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                 ffi::Result<ffi::AnyBuffer> out, ffi::ThreadPool pool) {
  if (!cpu_supported())
    return ffi::Error::InvalidArgument("packed_dense: this CPU has no AVX512-BF16");
  auto ad = a.dimensions(), wd = w.dimensions(), od = out->dimensions();
  if (a.element_type() != ffi::DataType::BF16 || w.element_type() != ffi::DataType::BF16 ||
      out->element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("packed_dense: a and w must be bfloat16, out float32");
  if (ad.size() != 2 || ad[1] % 2 != 0)
    return ffi::Error::InvalidArgument("packed_dense: a has shape " + dims(a));
  if (wd.size() != 4 || wd[2] * 2 != ad[1] || wd[3] != 32)
    return ffi::Error::InvalidArgument("packed_dense: w has shape " + dims(w) + " for a of " +
                                       dims(a));
  if (od.size() != 2 || od[0] != ad[0] || od[1] != wd[1] * 16)
    return ffi::Error::InvalidArgument("packed_dense: out has shape " + dims(*out));
  if (layer.element_count() != 1)
    return ffi::Error::InvalidArgument("packed_dense: layer must be a scalar");
  const int32_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0])
    return ffi::Error::InvalidArgument("packed_dense: layer " + std::to_string(index) +
                                       " outside the stack of " + std::to_string(wd[0]));
#if PACKED_DENSE_NATIVE
  native_cpu::PoolScope scope(pool);
  const int64_t per_layer = wd[1] * wd[2] * wd[3];
  Problem p{ad[0], od[1], ad[1], static_cast<const uint16_t*>(a.untyped_data()),
            static_cast<const uint16_t*>(w.untyped_data()) + index * per_layer,
            static_cast<float*>(out->untyped_data())};
  run(p);
#endif
  return ffi::Error::Success();
}

}  // namespace packed_dense

XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedDenseHandler, packed_dense::Dense,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ctx<ffi::ThreadPool>());

void* packed_dense_handler() { return reinterpret_cast<void*>(&PackedDenseHandler); }

int packed_dense_supported() { return packed_dense::cpu_supported(); }
