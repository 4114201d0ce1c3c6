// Dense int8 matmul with pre-packed weights for the CPU, as an XLA FFI custom call.
//
// out f32[M, N] = a bf16[M, K] @ W, W being layer `layer` of a stack of int8 weights quantised
// per column after their rows' Hadamard rotation (`score_kernels/quant.py`): stored as u8 q + 128
// packed [L, N/16, K/4, 64] (per 16-column group and quad of rows k..k+3, each column's four
// bytes: the operand layout of the VNNI u8 x s8 dot product), with f32 column scales [L, N]. The
// activations are rotated by the same Hadamard blocks and quantised per row block on the fly
// (the rotations cancel in the product); each block's sums are exact in int32, then weighted by
// the block's scale in f32. The weights' +128 adds `128 * sum(q_x)` of a block to every column
// of the row, which is taken back from the block's int32 sums. The gated form computes a SwiGLU
// MLP's bf16(silu(a @ W_gate) * (a @ W_up)) from gate and up packed with their 16-column groups
// interleaved; the activated, q/k/v and residual forms write what dense.cc's do, from the same
// epilogues (simd.h) on the f32 sums, so that no f32 product reaches memory.
//
// Only the first `rows` rows of a are multiplied (a batch's real tokens); the output's other rows
// are zeros.
//
// Builds: AMX (tile dot products, dense_int8_amx.h), AVX512-VNNI (512-bit), AVX-VNNI (256-bit)
// and AVX2 (256-bit, the dot product emulated exactly); the widest the CPU runs is used unless
// `set_isa` says otherwise. All give the same results to f32 rounding.

#include "dense_int8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "amx.h"
#include "builds.h"
#include "cpu_pool.h"
#include "dense_forms.h"
#include "dense_tiles.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace dense_int8 {

struct Problem : dense_forms::Fused {  // the fused forms' outputs and bias: dense_forms.h
  int64_t m, n, k;       // n: columns of the packed weights (gate and up together when gated)
  int64_t blocks, block;  // activation blocks per row, and their width (the last may be shorter)
  const uint16_t* a;     // bf16[m, k]
  const uint8_t* w;      // [n / 16, k / 4, 64]: q + 128
  const float* wscale;   // [n]
  int8_t* q;             // [m, k]: the quantised activations
  float* scales;         // [m, blocks]: their scales
  int32_t* offsets;      // [m, blocks]: 128 * the sum of the block's q
  void* out;             // f32[m, n], or bf16[m, n / 2] when gated
  bool stream;           // f32 out written with streaming stores (dense_tiles::streams)
  uint64_t call;         // the AMX build's call number (amx_tiles::configure)
};

enum Isa { kAvx2 = 0, kAvxVnni = 1, kAvx512Vnni = 2, kAmx = 3 };

// What a call writes: the f32 sums, bf16 of act(gate) * up, bf16 of an activation of the sums
// plus a bias, bf16 of the sums plus a bias split into q, k and v, or the f32 sums plus a
// residual (and a bias), as dense.cc's forms.
enum Form { kSums, kGated, kActivated, kQkv, kAdd };
constexpr int kActivations = 5;  // the gated and activated forms' (simd.h's Activation)

#if defined(__x86_64__) && defined(__GNUC__)
#define DENSE_INT8_NATIVE 1

#define DENSE_INT8_WIDE 1
#define DENSE_INT8_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,fma,amx-tile,amx-int8")
namespace amx {
#include "dense_int8_kernel.h"
#include "dense_int8_amx.h"
}  // namespace amx
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,fma")
namespace avx512vnni {
#include "dense_int8_kernel.h"
}  // namespace avx512vnni
#pragma GCC pop_options
#undef DENSE_INT8_WIDE
#undef DENSE_INT8_VNNI

#define DENSE_INT8_WIDE 0
#define DENSE_INT8_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx2,avxvnni,fma")
namespace avxvnni {
#include "dense_int8_kernel.h"
}  // namespace avxvnni
#pragma GCC pop_options
#undef DENSE_INT8_VNNI

#define DENSE_INT8_VNNI 0
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "dense_int8_kernel.h"
}  // namespace avx2
#pragma GCC pop_options
#undef DENSE_INT8_WIDE
#undef DENSE_INT8_VNNI

#else
#define DENSE_INT8_NATIVE 0
#endif

bool cpu_has(int isa) {
#if DENSE_INT8_NATIVE
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (isa) {
    case kAvx2:
      return avx2;
    case kAvxVnni:
      return avx2 && __builtin_cpu_supports("avxvnni");
    case kAvx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    case kAmx:
      return cpu_has(kAvx512Vnni) && amx_tiles::usable("int8");
  }
#endif
  return false;
}

native_builds::Choice g_builds(kAmx, cpu_has);

int chosen_isa() { return g_builds.chosen(); }

#if DENSE_INT8_NATIVE
// `Store` of each build (AMX, AVX512-VNNI, AVX-VNNI, AVX2) on the chosen one.
template <class Amx, class Vnni512, class AvxVnni, class Avx2>
void run_build(const Problem& p) {
  switch (chosen_isa()) {
    case kAmx:
      if (p.block % amx::kAmxStep == 0) return amx::run_amx<Amx>(p);
      [[fallthrough]];  // blocks that split a tile step: the VNNI tiles
    case kAvx512Vnni:
      return avx512vnni::run<Vnni512>(p);
    case kAvxVnni:
      return avxvnni::run<AvxVnni>(p);
    default:
      return avx2::run<Avx2>(p);
  }
}

template <int Act>
void run_gated(const Problem& p) {
  run_build<amx::AmxGated<Act>, avx512vnni::StoreGated<Act>, avxvnni::StoreGated<Act>,
            avx2::StoreGated<Act>>(p);
}

template <int Act>
void run_activated(const Problem& p) {
  run_build<amx::AmxAct<Act>, avx512vnni::StoreAct<Act>, avxvnni::StoreAct<Act>,
            avx2::StoreAct<Act>>(p);
}

static_assert(amx::kActivations == kActivations);
#endif

// The call's form (`activation`: the gated and activated forms', a code of simd.h's).
void run(const Problem& p, Form form, int activation) {
#if DENSE_INT8_NATIVE
  if (form == kGated || form == kActivated)
    return native_builds::with_code<kActivations>(activation, [&](auto act) {
      constexpr int kAct = decltype(act)::value;
      form == kGated ? run_gated<kAct>(p) : run_activated<kAct>(p);
    });
  if (form == kQkv)
    return run_build<amx::AmxQkv, avx512vnni::StoreQkv, avxvnni::StoreQkv, avx2::StoreQkv>(p);
  if (form == kAdd)
    return run_build<amx::AmxAdd, avx512vnni::StoreAdd, avxvnni::StoreAdd, avx2::StoreAdd>(p);
  run_build<amx::AmxF32, avx512vnni::StoreF32, avxvnni::StoreF32, avx2::StoreF32>(p);
#endif
}

using native_builds::dims;

// Checks the operands every form takes; an error message, or "" when they are right.
std::string check_inputs(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                         const ffi::AnyBuffer& scale, const ffi::Buffer<ffi::S32>& layer,
                         const ffi::Buffer<ffi::S32>& rows, int64_t block, Form form) {
  if (chosen_isa() < 0) return "this CPU has neither AVX2 nor AVX512-VNNI";
  auto ad = a.dimensions(), wd = w.dimensions(), sd = scale.dimensions();
  if (a.element_type() != ffi::DataType::BF16 || w.element_type() != ffi::DataType::U8 ||
      scale.element_type() != ffi::DataType::F32)
    return "a must be bfloat16, w uint8 and scale float32";
  if (ad.size() != 2 || ad[1] % 4 != 0) return "a has shape " + dims(a);
  if (wd.size() != 4 || wd[2] * 4 != ad[1] || wd[3] != 64 || (form == kGated && wd[1] % 2 != 0))
    return "w has shape " + dims(w) + " for a of " + dims(a);
  if (sd.size() != 2 || sd[0] != wd[0] || sd[1] != wd[1] * 16)
    return "scale has shape " + dims(scale) + " for w of " + dims(w);
  if (block < 4 || block % 4 != 0)
    return "block " + std::to_string(block) + " is not a positive multiple of 4";
  if (layer.element_count() != 1) return "layer must be a scalar";
  if (rows.element_count() != 1) return "rows must be a scalar";
  const int32_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0])
    return "layer " + std::to_string(index) + " outside the stack of " + std::to_string(wd[0]);
  return "";
}

// Checks the one output of the plain, gated, activated and residual forms against a and w.
std::string check_out(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w, const ffi::AnyBuffer& out,
                      Form form) {
  auto ad = a.dimensions(), wd = w.dimensions(), od = out.dimensions();
  const bool f32 = form == kSums || form == kAdd;
  if (out.element_type() != (f32 ? ffi::DataType::F32 : ffi::DataType::BF16))
    return f32 ? "out must be float32" : "out must be bfloat16";
  const int64_t columns = form == kGated ? wd[1] * 8 : wd[1] * 16;
  if (od.size() != 2 || od[0] != ad[0] || od[1] != columns) return "out has shape " + dims(out);
  return "";
}

// The quantised activations of one call (per calling thread, grown as needed).
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> offsets;
};

// The problem of a call on `m` computed rows, its quantised activations to go in this thread's
// scratch (the form's outputs and bias set by the caller).
Problem problem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w, const ffi::AnyBuffer& scale,
                const ffi::Buffer<ffi::S32>& layer, int64_t m, int64_t block) {
  auto ad = a.dimensions(), wd = w.dimensions();
  const int64_t k = ad[1], n = wd[1] * 16, blocks = (k + block - 1) / block;
  const int32_t index = layer.typed_data()[0];
  thread_local Scratch scratch;
  // room for the AMX tiles' reads past the rows (dense_int8_amx.h)
  scratch.q.resize((m + 31) / 32 * 32 * k + 64);
  scratch.scales.resize(m * blocks);
  scratch.offsets.resize(m * blocks);
  return Problem{{},
                 m,
                 n,
                 k,
                 blocks,
                 block,
                 static_cast<const uint16_t*>(a.untyped_data()),
                 static_cast<const uint8_t*>(w.untyped_data()) + index * wd[1] * wd[2] * wd[3],
                 static_cast<const float*>(scale.untyped_data()) + index * n,
                 scratch.q.data(),
                 scratch.scales.data(),
                 scratch.offsets.data(),
                 nullptr,
                 false,
                 amx_tiles::begin_call()};
}

// The call of any form but kQkv (`activation`: the gated and activated forms'; `bias`: the
// activated and residual forms'; `addend`: the residual form's).
ffi::Error Call(Form form, int activation, ffi::AnyBuffer a, ffi::AnyBuffer w,
                ffi::AnyBuffer scale, ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows,
                ffi::Result<ffi::AnyBuffer> out, int64_t block, ffi::ThreadPool pool,
                const float* bias = nullptr, const float* addend = nullptr) {
  std::string error = check_inputs(a, w, scale, layer, rows, block, form);
  if (error.empty()) error = check_out(a, w, *out, form);
  if (!error.empty()) return ffi::Error::InvalidArgument("dense_int8: " + error);
  native_cpu::PoolScope scope(pool);
  const int64_t total = a.dimensions()[0], m = native_builds::computed_rows(rows, total);
  Problem p = problem(a, w, scale, layer, m, block);
  const int64_t row_bytes = form == kGated       ? p.n / 2 * sizeof(uint16_t)
                            : form == kActivated ? p.n * sizeof(uint16_t)
                                                 : p.n * sizeof(float);
  p.out = out->untyped_data();
  p.stream = form == kSums && dense_tiles::streams(p.out, m * p.n * 4);
  p.bias = bias;
  p.addend = addend;
  if (m > 0) run(p, form, activation);
  native_builds::zero_rows(p.out, m, total, row_bytes);
  return ffi::Error::Success();
}

ffi::Error no_activation(int32_t activation) {
  return ffi::Error::InvalidArgument("dense_int8: no activation " + std::to_string(activation));
}

ffi::Error Dense(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                 ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows,
                 ffi::Result<ffi::AnyBuffer> out, int64_t block, ffi::ThreadPool pool) {
  return Call(kSums, 0, a, w, scale, layer, rows, out, block, pool);
}

ffi::Error Gated(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                 ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows,
                 ffi::Result<ffi::AnyBuffer> out, int64_t block, int32_t activation,
                 ffi::ThreadPool pool) {
  if (activation < 0 || activation >= kActivations) return no_activation(activation);
  return Call(kGated, activation, a, w, scale, layer, rows, out, block, pool);
}

// bf16(act(a @ W + bias)), as dense.cc's activated form: `bias` f32[n], `activation` a code of
// simd.h's Activation.
ffi::Error Activated(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                     ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows,
                     ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> out, int64_t block,
                     int32_t activation, ffi::ThreadPool pool) {
  std::string error = check_inputs(a, w, scale, layer, rows, block, kActivated);
  if (error.empty() && int64_t(bias.element_count()) != w.dimensions()[1] * 16)
    error = "bias has " + std::to_string(bias.element_count()) + " values for w of " + dims(w);
  if (!error.empty()) return ffi::Error::InvalidArgument("activated_int8: " + error);
  if (activation < 0 || activation >= kActivations) return no_activation(activation);
  return Call(kActivated, activation, a, w, scale, layer, rows, out, block, pool,
              bias.typed_data());
}

// residual + a @ W (+ bias) in f32, as dense.cc's residual form: `residual` f32[M, N], `bias`
// f32[N] or empty.
ffi::Error Add(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::AnyBuffer scale,
               ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows, ffi::AnyBuffer residual,
               ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> out, int64_t block,
               ffi::ThreadPool pool) {
  std::string error = check_inputs(a, w, scale, layer, rows, block, kAdd);
  if (error.empty()) error = dense_forms::check_add(residual, bias, *out, w.dimensions()[1] * 16);
  if (!error.empty()) return ffi::Error::InvalidArgument("dense_int8_add: " + error);
  return Call(kAdd, 0, a, w, scale, layer, rows, out, block, pool,
              bias.element_count() ? bias.typed_data() : nullptr,
              static_cast<const float*>(residual.untyped_data()));
}

// bf16(a @ W + bias) split into q bf16[M, H, D], k and v bf16[M, Hkv, D], q and k rotated by
// RoPE where cos and sin f32[M, D/2] are given (empty: none), as dense.cc's q/k/v form.
ffi::Error Qkv(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::AnyBuffer scale,
               ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::F32> bias,
               ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
               ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> k,
               ffi::Result<ffi::AnyBuffer> v, int64_t block, ffi::ThreadPool pool) {
  ffi::AnyBuffer* const outs[3] = {&*q, &*k, &*v};
  std::string error = check_inputs(a, w, scale, layer, rows, block, kQkv);
  const int64_t total = a.dimensions()[0], n = error.empty() ? w.dimensions()[1] * 16 : 0;
  if (error.empty()) error = dense_forms::check_qkv(total, n, bias, cos, sin, outs);
  if (!error.empty()) return ffi::Error::InvalidArgument("qkv_int8: " + error);
  native_cpu::PoolScope scope(pool);
  Problem p = problem(a, w, scale, layer, native_builds::computed_rows(rows, total), block);
  std::vector<dense_forms::Fused::Place> places;
  dense_forms::set_qkv(p, n, bias, cos, sin, outs, places);
  if (p.m > 0) run(p, kQkv, 0);
  dense_forms::zero_qkv_rows(p, p.m, total);
  return ffi::Error::Success();
}

}  // namespace dense_int8

// a, w, scale, layer and rows: the operands every form takes first
#define DENSE_INT8_INPUTS           \
  ffi::Ffi::Bind()                  \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::Buffer<ffi::S32>>() \
      .Arg<ffi::Buffer<ffi::S32>>()
#define DENSE_INT8_BINDING DENSE_INT8_INPUTS.Ret<ffi::AnyBuffer>().Attr<int64_t>("block")

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseInt8Handler, dense_int8::Dense,
                              DENSE_INT8_BINDING.Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatedInt8Handler, dense_int8::Gated,
                              DENSE_INT8_BINDING.Attr<int32_t>("activation")
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ActivatedInt8Handler, dense_int8::Activated,
                              DENSE_INT8_INPUTS.Arg<ffi::Buffer<ffi::F32>>()  // bias
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("block")
                                  .Attr<int32_t>("activation")
                                  .Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AddInt8Handler, dense_int8::Add,
                              DENSE_FORMS_ADD(DENSE_INT8_INPUTS)
                                  .Attr<int64_t>("block")
                                  .Ctx<ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(QkvInt8Handler, dense_int8::Qkv,
                              DENSE_FORMS_QKV(DENSE_INT8_INPUTS)
                                  .Attr<int64_t>("block")
                                  .Ctx<ffi::ThreadPool>());

void* dense_int8_handler() { return reinterpret_cast<void*>(&DenseInt8Handler); }

void* activated_int8_handler() { return reinterpret_cast<void*>(&ActivatedInt8Handler); }

void* add_int8_handler() { return reinterpret_cast<void*>(&AddInt8Handler); }

void* qkv_int8_handler() { return reinterpret_cast<void*>(&QkvInt8Handler); }

void* gated_int8_handler() { return reinterpret_cast<void*>(&GatedInt8Handler); }

int dense_int8_cpu_has(int isa) { return dense_int8::cpu_has(isa); }

void dense_int8_set_isa(int isa) { dense_int8::g_builds.set(isa); }

int dense_int8_isa() { return dense_int8::chosen_isa(); }
