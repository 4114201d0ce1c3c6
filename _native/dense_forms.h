// What the fused epilogues of the dense kernels read (simd.h's AddOut, ActOut and QkvOut), shared
// by the bf16 kernel (dense.cc) and the int8 one (dense_int8.cc): the bias, the residual, and
// where a fused q/k/v product's columns go, with the checks and the setup of its outputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "builds.h"
#include "xla/ffi/api/ffi.h"

namespace dense_forms {

// A kernel's Problem derives from this; the plain and gated forms leave it unset.
struct Fused {
  const float* bias = nullptr;    // f32[n]: the activated and q/k/v forms, and the residual's
  const float* addend = nullptr;  // the residual form: f32[m, n], the stream the sums are added to
  // q/k/v: where each 16-column group goes (simd.h's QkvOut)
  struct Place {
    int32_t out;     // 0 q, 1 k, 2 v
    int32_t column;  // of its row there (of its first half's, for q and k)
    int32_t freq;    // q and k: the RoPE frequency of its first column (halves D/2 apart); v: -1
  };
  const Place* places = nullptr;  // [n / 16]
  uint16_t* heads_out[3] = {};    // q bf16[m, H, D], k and v bf16[m, Hkv, D]
  int64_t head_cols[3] = {};      // H D, Hkv D, Hkv D
  int64_t half = 0;               // D / 2
  const float* cos = nullptr;     // f32[m, D / 2], with sin: RoPE of q and k (null: none)
  const float* sin = nullptr;
};

// Where each 16-column group of a q/k/v product of `n` columns goes: W's columns are laid out by
// kv head (for each, its G query heads, then its k and its v, D each), and within each q and k
// head in groups of 8 columns of the head's first half and the 8 D/2 further
// (`score_kernels.cpu.pack_qkv`).
inline std::vector<Fused::Place> qkv_places(int64_t n, int64_t d, int64_t group) {
  std::vector<Fused::Place> places(n / 16);
  for (int64_t c = 0; c < n; c += 16) {  // slot: a head's D columns in the kv head's G + 2
    const int64_t slot = c / d, kv = slot / (group + 2), i = slot % (group + 2), j = c % d / 16;
    const int32_t out = i < group ? 0 : int32_t(i - group + 1);
    const int64_t head = out == 0 ? kv * group + i : kv;
    places[c / 16] = out == 2 ? Fused::Place{out, int32_t(head * d + 16 * j), -1}
                              : Fused::Place{out, int32_t(head * d + 8 * j), int32_t(8 * j)};
  }
  return places;
}

// Checks a q/k/v call's outputs, bias and RoPE tables against `total` rows of `n` product
// columns; returns an error or "".
inline std::string check_qkv(int64_t total, int64_t n, const xla::ffi::Buffer<xla::ffi::F32>& bias,
                             const xla::ffi::Buffer<xla::ffi::F32>& cos,
                             const xla::ffi::Buffer<xla::ffi::F32>& sin,
                             xla::ffi::AnyBuffer* const (&outs)[3]) {
  using native_builds::dims;
  auto qd = outs[0]->dimensions(), kd = outs[1]->dimensions(), vd = outs[2]->dimensions();
  const bool shaped = qd.size() == 3 && kd.size() == 3 && qd[0] == total && kd[1] > 0 &&
                      qd[1] % kd[1] == 0 && qd[2] == kd[2] && qd[2] % 16 == 0 &&
                      (qd[1] + 2 * kd[1]) * qd[2] == n;
  if (!shaped)
    return "q of " + dims(*outs[0]) + " and k of " + dims(*outs[1]) + " do not split " +
           std::to_string(n) + " columns";
  if (vd.size() != 3 || !std::equal(vd.begin(), vd.end(), kd.begin()))
    return "k of " + dims(*outs[1]) + " and v of " + dims(*outs[2]) + " must be of one shape";
  for (auto* out : outs)
    if (out->element_type() != xla::ffi::DataType::BF16) return "q, k and v must be bfloat16";
  if (int64_t(bias.element_count()) != n) return "bias does not match " + std::to_string(n) +
                                                 " columns";
  const int64_t table = int64_t(cos.element_count());
  if (table != int64_t(sin.element_count()) || (table && table != total * qd[2] / 2))
    return "cos and sin must both be empty or hold [" + std::to_string(total) + ", " +
           std::to_string(qd[2] / 2) + "] values";
  return "";
}

// Points `f` at a checked q/k/v call's outputs, bias and RoPE tables; `places` (set here) must
// outlive the call.
inline void set_qkv(Fused& f, int64_t n, const xla::ffi::Buffer<xla::ffi::F32>& bias,
                    const xla::ffi::Buffer<xla::ffi::F32>& cos,
                    const xla::ffi::Buffer<xla::ffi::F32>& sin,
                    xla::ffi::AnyBuffer* const (&outs)[3], std::vector<Fused::Place>& places) {
  auto qd = outs[0]->dimensions(), kd = outs[1]->dimensions();
  places = qkv_places(n, qd[2], qd[1] / kd[1]);
  f.places = places.data();
  f.bias = bias.typed_data();
  f.half = qd[2] / 2;
  if (cos.element_count()) f.cos = cos.typed_data(), f.sin = sin.typed_data();
  for (int i = 0; i < 3; ++i) {
    f.heads_out[i] = static_cast<uint16_t*>(outs[i]->untyped_data());
    f.head_cols[i] = (i == 0 ? qd[1] : kd[1]) * qd[2];
  }
}

// Rows [m, total) of the three q/k/v outputs `f` points at, set to zeros.
inline void zero_qkv_rows(const Fused& f, int64_t m, int64_t total) {
  for (int i = 0; i < 3; ++i)
    native_builds::zero_rows(f.heads_out[i], m, total, f.head_cols[i] * sizeof(uint16_t));
}

// Checks a residual call's residual f32[M, N] and bias (f32[N] or empty) against its out;
// returns an error or "".
inline std::string check_add(const xla::ffi::AnyBuffer& residual,
                             const xla::ffi::Buffer<xla::ffi::F32>& bias,
                             const xla::ffi::AnyBuffer& out, int64_t n) {
  using native_builds::dims;
  auto rd = residual.dimensions(), od = out.dimensions();
  const int64_t values = int64_t(bias.element_count());
  if (residual.element_type() != xla::ffi::DataType::F32 || rd.size() != 2 || od.size() != 2 ||
      rd[0] != od[0] || rd[1] != od[1])
    return "residual of " + dims(residual) + " for out of " + dims(out) + " (both float32)";
  if (values != 0 && values != n)
    return "bias has " + std::to_string(values) + " values for " + std::to_string(n) + " columns";
  return "";
}

}  // namespace dense_forms

// The bindings of the residual and q/k/v forms after a kernel's own operands (`inputs`), in the
// order score_kernels/cpu.py passes them: the residual f32[M, N] and bias f32[N] or empty, the
// out f32[M, N]; the bias f32[N], cos and sin f32[M, D/2] or empty, q, k and v out.
#define DENSE_FORMS_ADD(inputs)                 \
  inputs.Arg<xla::ffi::AnyBuffer>()             \
      .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   \
      .Ret<xla::ffi::AnyBuffer>()
#define DENSE_FORMS_QKV(inputs)                 \
  inputs.Arg<xla::ffi::Buffer<xla::ffi::F32>>() \
      .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   \
      .Arg<xla::ffi::Buffer<xla::ffi::F32>>()   \
      .Ret<xla::ffi::AnyBuffer>()               \
      .Ret<xla::ffi::AnyBuffer>()               \
      .Ret<xla::ffi::AnyBuffer>()
