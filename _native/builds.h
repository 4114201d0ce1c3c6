// What the native kernels' XLA FFI handlers share: which instruction-set build a kernel runs,
// and operand shapes for their error messages.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace native_builds {

// A kernel's builds, indexed narrowest first: the one `set`, or else the widest this CPU runs.
class Choice {
 public:
  Choice(int widest, bool (*runs)(int)) : widest_(widest), runs_(runs) {}

  void set(int isa) { set_ = isa; }  // -1: the widest this CPU runs

  // The build calls use now; -1 when this CPU runs none.
  int chosen() const {
    const int isa = set_.load();
    if (isa >= 0) return isa;
    for (int widest = widest_; widest >= 0; --widest)
      if (runs_(widest)) return widest;
    return -1;
  }

 private:
  const int widest_;
  bool (*const runs_)(int);
  std::atomic<int> set_{-1};
};

// Calls fn(std::integral_constant<int, code>{}) for a run-time `code` in [0, N) (none outside
// it): a kernel's activation code (simd.h's Activation) as the compile-time template argument
// of its epilogue.
template <int N, int I = 0, class Fn>
void with_code(int code, const Fn& fn) {
  if constexpr (I < N) {
    if (code == I) return fn(std::integral_constant<int, I>{});
    with_code<N, I + 1>(code, fn);
  }
}

// A buffer's shape as "[d0, d1, ...]".
inline std::string dims(const xla::ffi::AnyBuffer& buffer) {
  std::string text;
  for (int64_t d : buffer.dimensions()) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return "[" + text + "]";
}

// The rows of an m-row output a dense call computes: its `rows` operand (i32[]: the real rows,
// the first ones) clamped to [0, m]. The rest are a batch's padding, which nothing reads: they
// cost no products and are written as zeros (`zero_rows`), so they stay finite.
inline int64_t computed_rows(const xla::ffi::Buffer<xla::ffi::S32>& rows, int64_t m) {
  return std::clamp<int64_t>(rows.typed_data()[0], 0, m);
}

// Rows [from, m) of an output whose rows are `row_bytes` long, set to zeros.
inline void zero_rows(void* out, int64_t from, int64_t m, int64_t row_bytes) {
  if (from < m) std::memset(static_cast<char*>(out) + from * row_bytes, 0, (m - from) * row_bytes);
}

}  // namespace native_builds
