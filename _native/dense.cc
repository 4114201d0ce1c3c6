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
// Only the first `rows` rows of a are multiplied (a batch's real tokens); the output's other rows
// are zeros.
// The gated form computes a gated MLP's bf16(act(a @ W_gate) * (a @ W_up)) in one pass (SwiGLU,
// GeGLU), from gate and up packed with their 16-column groups interleaved, so neither f32
// product reaches memory. The activated form computes bf16(act(a @ W + bias)) (an encoder MLP's
// up projection), so no f32 product reaches memory either; act is one of simd.h's activations.
// The q/k/v form computes bf16(a @ W + bias), q and k rotated by RoPE where it is given, and
// writes each head's columns into q, k or v (the fused projection of a decoder or encoder), so
// neither the f32 product nor a split copy reaches memory. The residual form adds the f32
// sums to the residual stream (and a bias) as it writes them.
//
// Builds: AMX (tile dot products, dense_amx.h), AVX512-BF16 (the hardware bf16 dot product) and
// AVX2 (the same products by f32 FMAs on the bf16 values widened, which is exact: the activations
// once per call, into dense_staged.h's copy, the weights as they are loaded); the widest the CPU
// runs is used unless `set_isa` says otherwise.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "amx.h"
#include "builds.h"
#include "cpu_pool.h"
#include "dense.h"
#include "dense_forms.h"
#include "dense_tiles.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace packed_dense {

struct Problem : dense_forms::Fused {  // the fused forms' outputs and bias: dense_forms.h
  Problem(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* w, uint64_t call,
          int64_t held)
      : m(m), n(n), k(k), a(a), w(w), call(call), held(held) {}
  int64_t m, n, k;    // n: columns of the packed weights (gate and up together when gated)
  const uint16_t* a;  // [m, k]
  const uint16_t* w;  // [n / 16, k / 2, 32]
  void* out = nullptr;  // f32[m, n], or bf16[m, n / 2] when gated
  bool stream = false;  // f32 out written with streaming stores (dense_tiles::streams)
  float* tiles = nullptr;  // the AVX2 build's f32 copy of a's rows from first_row (dense_staged.h)
  int64_t first_row = 0;   // (both set by run_staged)
  uint64_t call;           // the AMX build's call number (amx_tiles::configure)
  int64_t held;            // rows of a in memory (m or more)
  const uint16_t* staged = nullptr;  // the AMX build's copy of rows [from, m), ld apart
  int64_t from = 0, ld = 0;          // (set by dense_amx.h's stage)
};

// What a call writes: the f32 sums, bf16 of act(gate) * up, bf16 of an activation of the
// sums plus a bias, bf16 of the sums plus a bias split into q, k and v, or the f32 sums plus
// a residual (and a bias).
enum Form { kSums, kGated, kActivated, kQkv, kAdd };
constexpr int kActivations = 5;  // the gated and activated forms' (simd.h's Activation)

enum Isa { kAvx2 = 0, kAvx512Bf16 = 1, kAmx = 2 };

typedef int32_t __attribute__((may_alias)) Pair;  // two bf16 values read as one lane

#if defined(__x86_64__) && defined(__GNUC__)
#define PACKED_DENSE_NATIVE 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")
namespace amx {
#define SIMD_WIDE 1
#include "simd.h"
#undef SIMD_WIDE

#include "dense_amx.h"
}  // namespace amx
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma")
namespace avx512bf16 {
#define SIMD_WIDE 1
#include "simd.h"
#undef SIMD_WIDE

using StoreF32 = F32Out<8, 3>;  // 24 accumulators
using StoreAdd = AddOut<8, 3>;
template <int Act>
using StoreGated = GatedOut<6, 4, Act>;  // 24 accumulators, two output groups
template <int Act>
using StoreAct = ActOut<8, 3, Act>;
using StoreQkv = QkvOut<8, 3>;

// Rows [row, row + R) of a by the G column groups starting at `group`, stored by `Store`.
template <class Store, int R, int G>
void tile(const Problem& p, int64_t row, int64_t group) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  const int64_t pairs = p.k / 2, stride = p.k * 16;
  const Pair* rows = reinterpret_cast<const Pair*>(p.a + row * p.k);
  const uint16_t* w = p.w + group * stride;
  Store::template prefetch<R, G>(p, row, group);
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh b[G];
    for (int g = 0; g < G; ++g)
      b[g] = (__m512bh)_mm512_loadu_si512(w + g * stride + i * 32);
    for (int r = 0; r < R; ++r) {
      __m512bh x = (__m512bh)_mm512_set1_epi32(rows[r * pairs + i]);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], x, b[g]);
    }
  }
  for (int r = 0; r < R; ++r)
    Store::template row<G>(acc[r], p, row + r, group);
}

template <class Store>
struct Make {
  template <int R, int G>
  static constexpr dense_tiles::Tile<Problem> of() {
    return &tile<Store, R, G>;
  }
};

template <class Store>
void run(const Problem& p) {
  // about 256 KiB of bf16 activations per row block
  dense_tiles::run<Problem, Store, Make<Store>>(p, p.m, p.n / 16, 2 * p.k, 256 * 1024, 64);
}

}  // namespace avx512bf16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#define SIMD_WIDE 0
#include "simd.h"
#undef SIMD_WIDE

#include "dense_staged.h"

// Five rows by one group: 10 accumulators, two widened weight vectors, the mask and a broadcast
// in the 16 registers (six rows take all 16, and GCC then kept two accumulators on the stack),
// the activations widened once into dense_staged.h's copy.
using StoreF32 = F32Out<5, 1>;
using StoreAdd = AddOut<5, 1>;
template <int Act>
using StoreGated = GatedOut<5, 2, Act>;
template <int Act>
using StoreAct = ActOut<5, 1, Act>;
using StoreQkv = QkvOut<5, 1>;

// Rows [row, row + R) (the first R of a tile) by the G column groups starting at `group`, stored
// by `Store`: one pass over K per group, whose pair records' two 8-column halves are each
// widened to the odd row's weights (the high words as they are) and the even row's (shifted
// up). The odd product is added first, as VDPBF16PS adds.
template <class Store, int R, int G>
void tile(const Problem& p, int64_t row, int64_t group) {
  alignas(32) float done[R][2 * G][kLanes];
  const VI high = set1_i(int32_t(0xFFFF0000u));
  Store::template prefetch<R, G>(p, row, group);
  for (int g = 0; g < G; ++g) {
    const uint16_t* w = p.w + (group + g) * p.k * 16;
    const float* x = staged(p, row);
    VF acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = zero_f();
    for (int64_t c = 0; c < p.k; c += kChunk, x += kChunk * Store::kRows) {
      const int columns = int(std::min<int64_t>(kChunk, p.k - c));
      const float* xi = x;  // pointers stepped, not indices: constant offsets from them
      const uint16_t* pair = w + c * 16;  // rows c + i and c + i + 1
#pragma GCC unroll 1  // as dense_f32_kernel.h's loop: unrolled, accumulators go to the stack
      for (int i = 0; i < columns; i += 2, xi += 2, pair += 32) {
        VF odd[2], even[2];
        for (int v = 0; v < 2; ++v) odd[v] = from_bits(and_i(load_i(pair + v * 16), high));
        for (int r = 0; r < R; ++r) {
          const VF xo = set1_f(xi[r * kChunk + 1]);
          for (int v = 0; v < 2; ++v) acc[r][v] = fmadd(xo, odd[v], acc[r][v]);
        }
        // the weights loaded again rather than kept from the first load, which holds two
        // more registers through the odd products
        asm volatile("" ::: "memory");
        for (int v = 0; v < 2; ++v) even[v] = from_bits(shl_i(load_i(pair + v * 16), 16));
        for (int r = 0; r < R; ++r) {
          const VF xe = set1_f(xi[r * kChunk]);
          for (int v = 0; v < 2; ++v) acc[r][v] = fmadd(xe, even[v], acc[r][v]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v) store_f(done[r][2 * g + v], acc[r][v]);
  }
  for (int r = 0; r < R; ++r) {
    VF sums[2 * G];
    for (int j = 0; j < 2 * G; ++j) sums[j] = load_f(done[r][j]);
    Store::template row<G>(sums, p, row + r, group);
  }
}

template <class Store>
struct Make {
  template <int R, int G>
  static constexpr dense_tiles::Tile<Problem> of() {
    return &tile<Store, R, G>;
  }
};

template <class Store>
void run(const Problem& p) {
  run_staged<Problem, Store, Make<Store>>(p);
}
}  // namespace avx2
#pragma GCC pop_options
#else
#define PACKED_DENSE_NATIVE 0
#endif

bool cpu_has(int isa) {
#if PACKED_DENSE_NATIVE
  switch (isa) {
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAvx512Bf16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    case kAmx:
      return cpu_has(kAvx512Bf16) && amx_tiles::usable("bf16");
  }
#endif
  return false;
}

native_builds::Choice g_builds(kAmx, cpu_has);

int chosen_isa() { return g_builds.chosen(); }

#if PACKED_DENSE_NATIVE
template <class Amx, class Bf16, class Avx2>
void run_build(const Problem& p) {
  if (chosen_isa() == kAmx) return amx::run_amx<Amx>(p);
  if (chosen_isa() == kAvx512Bf16) return avx512bf16::run<Bf16>(p);
  avx2::run<Avx2>(p);
}

template <int Act>
void run_gated(const Problem& p) {
  run_build<amx::AmxGated<Act>, avx512bf16::StoreGated<Act>, avx2::StoreGated<Act>>(p);
}

template <int Act>
void run_activated(const Problem& p) {
  run_build<amx::AmxAct<Act>, avx512bf16::StoreAct<Act>, avx2::StoreAct<Act>>(p);
}

static_assert(amx::kActivations == kActivations);
#endif

void run(const Problem& p, Form form, int activation) {
#if PACKED_DENSE_NATIVE
  if (form == kSums) return run_build<amx::AmxF32, avx512bf16::StoreF32, avx2::StoreF32>(p);
  if (form == kQkv) return run_build<amx::AmxQkv, avx512bf16::StoreQkv, avx2::StoreQkv>(p);
  if (form == kAdd) return run_build<amx::AmxAdd, avx512bf16::StoreAdd, avx2::StoreAdd>(p);
  native_builds::with_code<kActivations>(activation, [&](auto act) {
    constexpr int kAct = decltype(act)::value;
    form == kGated ? run_gated<kAct>(p) : run_activated<kAct>(p);
  });
#endif
}

using native_builds::dims;

// Checks a, w, layer and rows; returns an error message or "".
std::string check_inputs(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                         const ffi::Buffer<ffi::S32>& layer, const ffi::Buffer<ffi::S32>& rows,
                         Form form) {
  if (chosen_isa() < 0) return "this CPU has neither AVX2 nor AVX512-BF16";
  auto ad = a.dimensions(), wd = w.dimensions();
  if (a.element_type() != ffi::DataType::BF16 || w.element_type() != ffi::DataType::BF16)
    return "a and w must be bfloat16";
  if (ad.size() != 2 || ad[1] % 2 != 0) return "a has shape " + dims(a);
  if (wd.size() != 4 || wd[2] * 2 != ad[1] || wd[3] != 32 || (form == kGated && wd[1] % 2 != 0))
    return "w has shape " + dims(w) + " for a of " + dims(a);
  if (layer.element_count() != 1) return "layer must be a scalar";
  if (rows.element_count() != 1) return "rows must be a scalar";
  const int32_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0])
    return "layer " + std::to_string(index) + " outside the stack of " + std::to_string(wd[0]);
  return "";
}

// Checks the operands and the one output of the plain, gated, activated and residual forms.
std::string check(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                  const ffi::Buffer<ffi::S32>& layer, const ffi::Buffer<ffi::S32>& rows,
                  const ffi::AnyBuffer& out, Form form) {
  std::string error = check_inputs(a, w, layer, rows, form);
  if (!error.empty()) return error;
  auto ad = a.dimensions(), wd = w.dimensions(), od = out.dimensions();
  const bool f32 = form == kSums || form == kAdd;
  if (out.element_type() != (f32 ? ffi::DataType::F32 : ffi::DataType::BF16))
    return f32 ? "out must be float32" : "out must be bfloat16";
  const int64_t columns = form == kGated ? wd[1] * 8 : wd[1] * 16;
  if (od.size() != 2 || od[0] != ad[0] || od[1] != columns) return "out has shape " + dims(out);
  return "";
}

// The problem of a call on `m` computed rows (the form's outputs and bias set by the caller).
Problem problem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                const ffi::Buffer<ffi::S32>& layer, int64_t m) {
  auto ad = a.dimensions(), wd = w.dimensions();
  const int64_t per_layer = wd[1] * wd[2] * wd[3];
  return Problem(m, wd[1] * 16, ad[1], static_cast<const uint16_t*>(a.untyped_data()),
                 static_cast<const uint16_t*>(w.untyped_data()) + layer.typed_data()[0] * per_layer,
                 amx_tiles::begin_call(), ad[0]);
}

// The call of any form but kQkv; `bias` is read by kActivated and kAdd, `activation` by
// kActivated and kGated, `addend` by kAdd.
ffi::Error Call(Form form, ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                ffi::Buffer<ffi::S32> rows, const float* bias, int activation,
                ffi::Result<ffi::AnyBuffer> out, ffi::ThreadPool pool,
                const float* addend = nullptr) {
  std::string error = check(a, w, layer, rows, *out, form);
  if (!error.empty()) return ffi::Error::InvalidArgument("packed_dense: " + error);
  native_cpu::PoolScope scope(pool);
  const int64_t total = a.dimensions()[0], m = native_builds::computed_rows(rows, total);
  Problem p = problem(a, w, layer, m);
  const int64_t row_bytes = form == kSums || form == kAdd ? p.n * sizeof(float)
                            : form == kGated               ? p.n / 2 * sizeof(uint16_t)
                                                           : p.n * sizeof(uint16_t);
  p.out = out->untyped_data();
  p.stream = form == kSums && dense_tiles::streams(p.out, m * row_bytes);
  p.bias = bias;
  p.addend = addend;
  if (m > 0) run(p, form, activation);
  native_builds::zero_rows(p.out, m, total, row_bytes);
  return ffi::Error::Success();
}

ffi::Error Dense(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                 ffi::Buffer<ffi::S32> rows, ffi::Result<ffi::AnyBuffer> out,
                 ffi::ThreadPool pool) {
  return Call(kSums, a, w, layer, rows, nullptr, 0, out, pool);
}

ffi::Error no_activation(int32_t activation) {
  return ffi::Error::InvalidArgument("packed_dense: no activation " + std::to_string(activation));
}

// bf16(act(a @ W_gate) * (a @ W_up)): `activation` a code of simd.h's Activation.
ffi::Error Gated(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                 ffi::Buffer<ffi::S32> rows, ffi::Result<ffi::AnyBuffer> out, int32_t activation,
                 ffi::ThreadPool pool) {
  if (activation < 0 || activation >= kActivations) return no_activation(activation);
  return Call(kGated, a, w, layer, rows, nullptr, activation, out, pool);
}

// bf16(act(a @ W + bias)): `bias` f32[n], `activation` a code of simd.h's Activation.
ffi::Error Activated(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                     ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::F32> bias,
                     ffi::Result<ffi::AnyBuffer> out, int32_t activation, ffi::ThreadPool pool) {
  if (bias.element_count() != w.dimensions()[1] * 16)
    return ffi::Error::InvalidArgument("packed_dense: bias has " +
                                       std::to_string(bias.element_count()) +
                                       " values for w of " + dims(w));
  if (activation < 0 || activation >= kActivations) return no_activation(activation);
  return Call(kActivated, a, w, layer, rows, bias.typed_data(), activation, out, pool);
}

// residual + a @ W (+ bias): `residual` f32[M, N] (the residual stream), `bias` f32[N] or empty.
ffi::Error Add(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
               ffi::Buffer<ffi::S32> rows, ffi::AnyBuffer residual, ffi::Buffer<ffi::F32> bias,
               ffi::Result<ffi::AnyBuffer> out, ffi::ThreadPool pool) {
  std::string error = dense_forms::check_add(residual, bias, *out, w.dimensions()[1] * 16);
  if (!error.empty()) return ffi::Error::InvalidArgument("packed_dense_add: " + error);
  return Call(kAdd, a, w, layer, rows, bias.element_count() ? bias.typed_data() : nullptr, 0, out,
              pool, static_cast<const float*>(residual.untyped_data()));
}

// bf16(a @ W + bias) split into q bf16[M, H, D], k and v bf16[M, Hkv, D] (`qkv_places`), q and
// k rotated by RoPE where cos and sin f32[M, D/2] are given (empty: none).
ffi::Error Qkv(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
               ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> cos,
               ffi::Buffer<ffi::F32> sin, ffi::Result<ffi::AnyBuffer> q,
               ffi::Result<ffi::AnyBuffer> k, ffi::Result<ffi::AnyBuffer> v,
               ffi::ThreadPool pool) {
  ffi::AnyBuffer* const outs[3] = {&*q, &*k, &*v};
  std::string error = check_inputs(a, w, layer, rows, kQkv);
  const int64_t total = a.dimensions()[0], n = error.empty() ? w.dimensions()[1] * 16 : 0;
  if (error.empty()) error = dense_forms::check_qkv(total, n, bias, cos, sin, outs);
  if (!error.empty()) return ffi::Error::InvalidArgument("packed_qkv: " + error);
  native_cpu::PoolScope scope(pool);
  Problem p = problem(a, w, layer, native_builds::computed_rows(rows, total));
  std::vector<dense_forms::Fused::Place> places;
  dense_forms::set_qkv(p, n, bias, cos, sin, outs, places);
  if (p.m > 0) run(p, kQkv, 0);
  dense_forms::zero_qkv_rows(p, p.m, total);
  return ffi::Error::Success();
}

}  // namespace packed_dense

// a, w, layer and rows: the operands every form takes first
#define PACKED_DENSE_INPUTS         \
  ffi::Ffi::Bind()                  \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::Buffer<ffi::S32>>() \
      .Arg<ffi::Buffer<ffi::S32>>()
#define PACKED_DENSE_BINDING PACKED_DENSE_INPUTS.Ret<ffi::AnyBuffer>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedDenseHandler, packed_dense::Dense,
                              PACKED_DENSE_BINDING.Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedGatedHandler, packed_dense::Gated,
                              PACKED_DENSE_BINDING.Attr<int32_t>("activation")
                                  .Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedActivatedHandler, packed_dense::Activated,
                              PACKED_DENSE_INPUTS.Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("activation")
                                  .Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedAddHandler, packed_dense::Add,
                              DENSE_FORMS_ADD(PACKED_DENSE_INPUTS).Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedQkvHandler, packed_dense::Qkv,
                              DENSE_FORMS_QKV(PACKED_DENSE_INPUTS).Ctx<ffi::ThreadPool>());

void* packed_dense_handler() { return reinterpret_cast<void*>(&PackedDenseHandler); }

void* packed_gated_handler() { return reinterpret_cast<void*>(&PackedGatedHandler); }

void* packed_activated_handler() { return reinterpret_cast<void*>(&PackedActivatedHandler); }

void* packed_qkv_handler() { return reinterpret_cast<void*>(&PackedQkvHandler); }

void* packed_add_handler() { return reinterpret_cast<void*>(&PackedAddHandler); }

int packed_dense_cpu_has(int isa) { return packed_dense::cpu_has(isa); }

void packed_dense_set_isa(int isa) { packed_dense::g_builds.set(isa); }

int packed_dense_isa() { return packed_dense::chosen_isa(); }

long long packed_dense_stream_bytes() { return dense_tiles::kStreamBytes; }
