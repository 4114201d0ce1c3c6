// Dense f32 matmul with pre-packed weights for the CPU, as an XLA FFI custom call.
//
// out f32[M, N] = a f32[M, K] @ W, W being layer `layer` of a weight stack packed as
// f32[L, N/16, K, 16]: per 16-column group, its K rows of 16 columns, in the order a register
// tile reads them. The register tiles read a copy of the activations (dense_staged.h).
//
// Each output is the sum over k in order of fused multiply-adds, whatever the row count or the
// row's place in the batch: a row's result does not depend on what it is batched with. Only the
// first `rows` rows of a are multiplied (a batch's real tokens); the output's other rows are
// zeros.
//
// Builds: AVX-512 (16 lanes: 8 rows by 3 groups of accumulators) and AVX2 (8 lanes: 6 rows by
// one group, 12 accumulators); the widest the CPU runs is used unless `set_isa` says otherwise.

#include "dense_f32.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "builds.h"
#include "cpu_pool.h"
#include "dense_tiles.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace dense_f32 {

struct Problem {
  int64_t m, n, k;
  const float* a;     // [m, k]
  const float* w;     // [n / 16, k, 16]
  float* out;         // [m, n]
  bool stream;        // out written with streaming stores (dense_tiles::streams)
  float* tiles;       // a's rows from first_row, as dense_staged.h lays them out
  int64_t first_row;  // (both set by run_staged)
};

enum Isa { kAvx2 = 0, kAvx512 = 1 };

#if defined(__x86_64__) && defined(__GNUC__)
#define DENSE_F32_NATIVE 1

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
namespace avx512 {
#define SIMD_WIDE 1
#include "simd.h"
#undef SIMD_WIDE
#include "dense_staged.h"
using Store = F32Out<8, 3>;  // 24 accumulators, 3 weight vectors and a broadcast of 32
#include "dense_f32_kernel.h"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#define SIMD_WIDE 0
#include "simd.h"
#undef SIMD_WIDE
#include "dense_staged.h"
using Store = F32Out<6, 1>;  // 12 accumulators, 2 weight vectors and a broadcast of 16
#include "dense_f32_kernel.h"
}  // namespace avx2
#pragma GCC pop_options
#else
#define DENSE_F32_NATIVE 0
#endif

bool cpu_has(int isa) {
#if DENSE_F32_NATIVE
  switch (isa) {
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
#endif
  return false;
}

native_builds::Choice g_builds(kAvx512, cpu_has);

int chosen_isa() { return g_builds.chosen(); }

void run(const Problem& p, int isa) {
#if DENSE_F32_NATIVE
  isa == kAvx512 ? avx512::run(p) : avx2::run(p);
#endif
}

using native_builds::dims;

// Checks the operands; an error message, or "" when they are right.
std::string check(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                  const ffi::Buffer<ffi::S32>& layer, const ffi::Buffer<ffi::S32>& rows,
                  const ffi::AnyBuffer& out) {
  if (chosen_isa() < 0) return "this CPU has neither AVX2 nor AVX-512";
  auto ad = a.dimensions(), wd = w.dimensions(), od = out.dimensions();
  if (a.element_type() != ffi::DataType::F32 || w.element_type() != ffi::DataType::F32 ||
      out.element_type() != ffi::DataType::F32)
    return "a, w and out must be float32";
  if (ad.size() != 2) return "a has shape " + dims(a);
  if (wd.size() != 4 || wd[2] != ad[1] || wd[3] != 16)
    return "w has shape " + dims(w) + " for a of " + dims(a);
  if (od.size() != 2 || od[0] != ad[0] || od[1] != wd[1] * 16) return "out has shape " + dims(out);
  if (layer.element_count() != 1) return "layer must be a scalar";
  if (rows.element_count() != 1) return "rows must be a scalar";
  const int32_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0])
    return "layer " + std::to_string(index) + " outside the stack of " + std::to_string(wd[0]);
  return "";
}

ffi::Error Dense(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                 ffi::Buffer<ffi::S32> rows, ffi::Result<ffi::AnyBuffer> out,
                 ffi::ThreadPool pool) {
  std::string error = check(a, w, layer, rows, *out);
  if (!error.empty()) return ffi::Error::InvalidArgument("dense_f32: " + error);
  native_cpu::PoolScope scope(pool);
  auto ad = a.dimensions(), wd = w.dimensions();
  const int64_t m = native_builds::computed_rows(rows, ad[0]), k = ad[1], n = wd[1] * 16;
  Problem p{m,
            n,
            k,
            static_cast<const float*>(a.untyped_data()),
            static_cast<const float*>(w.untyped_data()) + layer.typed_data()[0] * n * k,
            static_cast<float*>(out->untyped_data()),
            dense_tiles::streams(out->untyped_data(), m * n * 4),
            nullptr,
            0};
  if (m > 0) run(p, chosen_isa());
  native_builds::zero_rows(out->untyped_data(), m, ad[0], n * sizeof(float));
  return ffi::Error::Success();
}

}  // namespace dense_f32

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseF32Handler, dense_f32::Dense,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ctx<ffi::ThreadPool>());

void* dense_f32_handler() { return reinterpret_cast<void*>(&DenseF32Handler); }

int dense_f32_cpu_has(int isa) { return dense_f32::cpu_has(isa); }

void dense_f32_set_isa(int isa) { dense_f32::g_builds.set(isa); }

int dense_f32_isa() { return dense_f32::chosen_isa(); }
