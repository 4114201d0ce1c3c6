// Packed two-span attention for the CPU as an XLA FFI custom call (see attention_kernel.h).
//
// Token t attends to keys [prefix_start[t], prefix_end[t]) and [own_start[t], own_end[t]) of a key
// space whose first C keys are read from KV pool pages through a page table. The handler
// checks shapes and dtypes, then runs the widest instruction-set build of the kernel this CPU
// supports on `threads` worker threads (every core this process may run on by default).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "amx.h"
#include "attention.h"
#include "builds.h"
#include "cpu_pool.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace packed_attention {

struct Problem {
  int tokens, heads, kv_heads, head_dim;  // tokens: the batch's queries (T)
  float scale;
  const int32_t* prefix_start;  // spans in the key space: the context region, then the batch
  const int32_t* prefix_end;
  const int32_t* own_start;
  const int32_t* own_end;  // exclusive; C + t + 1 for a causal (decoder) token
  int keys, context;  // C + T and C: query t is key C + t
  int page_size;
  const int32_t* pages;  // i32[C / page_size]: the context region's pages
  const void* pool_k;  // this layer's pages [P, page, Hkv, D]
  const void* pool_v;
};

// A growable, 64-byte aligned array of vectors of the caller's type (std::vector does not
// promise the alignment of vector-extension types across compilers).
class Vectors {
 public:
  Vectors() = default;
  Vectors(const Vectors&) = delete;
  Vectors& operator=(const Vectors&) = delete;
  ~Vectors() { std::free(data_); }
  // Room for n vectors of type V; the contents are not kept.
  template <typename V>
  V* resize(size_t n) {
    size_t bytes = (std::max<size_t>(n, 1) * sizeof(V) + 63) / 64 * 64;
    if (bytes > capacity_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = bytes;
    }
    return as<V>();
  }
  template <typename V>
  V* as() const { return static_cast<V*>(data_); }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;  // bytes
};

// Objects kept for reuse across calls: take() hands out a kept one (or a new one), give() keeps
// it again. Concurrent calls each hold their own.
template <typename T>
class Reusable {
 public:
  std::unique_ptr<T> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.empty()) return std::make_unique<T>();
    std::unique_ptr<T> t = std::move(kept_.back());
    kept_.pop_back();
    return t;
  }
  void give(std::unique_ptr<T> t) {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.push_back(std::move(t));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<T>> kept_;
};

using native_cpu::parallel_for;

// `#pragma GCC target` does not define the __AVX512F__-style macros, so each build says what it
// may use: PACKED_ATTENTION_AVX512 (512-bit intrinsics), PACKED_ATTENTION_BF16 (BF16 dots),
// PACKED_ATTENTION_AMX (BF16 tile products) and PACKED_ATTENTION_LANES (the f32 lanes of its
// vector registers).
#if defined(__x86_64__) && defined(__GNUC__)
#define PACKED_ATTENTION_AVX512 1
#define PACKED_ATTENTION_BF16 1
#define PACKED_ATTENTION_AMX 1
#define PACKED_ATTENTION_LANES 16
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")
namespace amx {
#include "attention_kernel.h"
}  // namespace amx
#pragma GCC pop_options
#undef PACKED_ATTENTION_AMX
#define PACKED_ATTENTION_AMX 0
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma")
namespace avx512bf16 {
#include "attention_kernel.h"
}  // namespace avx512bf16
#pragma GCC pop_options
#undef PACKED_ATTENTION_BF16
#define PACKED_ATTENTION_BF16 0
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
namespace avx512 {
#include "attention_kernel.h"
}  // namespace avx512
#pragma GCC pop_options
#undef PACKED_ATTENTION_AVX512
#define PACKED_ATTENTION_AVX512 0
#undef PACKED_ATTENTION_LANES
#define PACKED_ATTENTION_LANES 8
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "attention_kernel.h"
}  // namespace avx2
#pragma GCC pop_options
#undef PACKED_ATTENTION_LANES
#else
#define PACKED_ATTENTION_AVX512 0
#define PACKED_ATTENTION_BF16 0
#define PACKED_ATTENTION_AMX 0
#endif
#define PACKED_ATTENTION_LANES 4  // SSE2's and NEON's 128-bit registers
namespace portable {
#include "attention_kernel.h"
}  // namespace portable

enum Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

bool cpu_has(int isa) {
  switch (isa) {
    case kPortable:
      return true;
#if defined(__x86_64__) && defined(__GNUC__)
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    case kAvx512Bf16:
      return cpu_has(kAvx512) && __builtin_cpu_supports("avx512bf16");
    case kAmx:
      return cpu_has(kAvx512Bf16) && amx_tiles::usable("bf16");
#endif
    default:
      return false;
  }
}

native_builds::Choice g_builds(kAmx, cpu_has);  // the portable build runs anywhere

int chosen_isa() { return g_builds.chosen(); }

template <typename In>
bool dispatch(const Problem& p, const In* q, const In* k, const In* v, In* out) {
  switch (chosen_isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case kAmx:
      return amx::run(p, q, k, v, out);
    case kAvx512Bf16:
      return avx512bf16::run(p, q, k, v, out);
    case kAvx512:
      return avx512::run(p, q, k, v, out);
    case kAvx2:
      return avx2::run(p, q, k, v, out);
#endif
    default:
      return portable::run(p, q, k, v, out);
  }
}

std::string shape_error(const char* what, const ffi::AnyBuffer& buffer) {
  std::string dims;
  for (int64_t d : buffer.dimensions()) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  return std::string("packed_attention: ") + what + " has shape [" + dims + "]";
}

// The pool [L, P, page, Hkv, D] and page table fit the batch's K/V; `context` is set to C.
std::string check_pages(const ffi::AnyBuffer& k, const ffi::AnyBuffer& pool_k,
                        const ffi::AnyBuffer& pool_v, const ffi::Buffer<ffi::S32>& layer,
                        const ffi::Buffer<ffi::S32>& pages) {
  auto kd = k.dimensions(), pd = pool_k.dimensions(), vd = pool_v.dimensions();
  // The pool holds the bits of k's dtype (unsigned integers of its width).
  size_t width = ffi::ByteWidth(k.element_type());
  if (pd.size() != 5 || pd[3] != kd[1] || pd[4] != kd[2] ||
      !std::equal(pd.begin(), pd.end(), vd.begin(), vd.end()) ||
      ffi::ByteWidth(pool_k.element_type()) != width ||
      ffi::ByteWidth(pool_v.element_type()) != width)
    return shape_error("the KV pool", pool_k);
  if (layer.element_count() != 1) return "packed_attention: layer must be a scalar";
  int l = layer.typed_data()[0];
  if (l < 0 || l >= pd[0]) return "packed_attention: layer out of range";
  const int32_t* table = pages.typed_data();
  for (size_t i = 0; i < pages.element_count(); ++i)
    if (table[i] < 0 || table[i] >= pd[1]) return "packed_attention: page out of range";
  return "";
}

ffi::Error Attention(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer pool_k,
                     ffi::AnyBuffer pool_v, ffi::Buffer<ffi::S32> layer,
                     ffi::Buffer<ffi::S32> pages, ffi::Buffer<ffi::S32> prefix_start,
                     ffi::Buffer<ffi::S32> prefix_end, ffi::Buffer<ffi::S32> own_start,
                     ffi::Buffer<ffi::S32> own_end,
                     ffi::Result<ffi::AnyBuffer> out, float scale, ffi::ThreadPool pool) {
  native_cpu::PoolScope scope(pool);
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 3) return ffi::Error::InvalidArgument(shape_error("q", q));
  if (kd.size() != 3 || kd[0] != qd[0] || kd[2] != qd[2] || qd[1] % kd[1] != 0)
    return ffi::Error::InvalidArgument(shape_error("k", k));
  if (vd.size() != 3 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2])
    return ffi::Error::InvalidArgument(shape_error("v", v));
  for (const auto* span : {&prefix_start, &prefix_end, &own_start, &own_end})
    if (span->element_count() != size_t(qd[0]))
      return ffi::Error::InvalidArgument("packed_attention: spans must have T entries");
  auto dtype = q.element_type();
  if (k.element_type() != dtype || v.element_type() != dtype || out->element_type() != dtype)
    return ffi::Error::InvalidArgument("packed_attention: q, k, v and out must share a dtype");
  std::string bad = check_pages(k, pool_k, pool_v, layer, pages);
  if (!bad.empty()) return ffi::Error::InvalidArgument(bad);
  auto pd = pool_k.dimensions();
  int page_size = int(pd[2]);
  int context = int(pages.element_count()) * page_size;
  size_t layer_bytes = size_t(pd[1]) * pd[2] * pd[3] * pd[4] * ffi::ByteWidth(dtype);
  size_t layer_offset = size_t(layer.typed_data()[0]) * layer_bytes;
  Problem p{int(qd[0]),
            int(qd[1]),
            int(kd[1]),
            int(qd[2]),
            scale,
            prefix_start.typed_data(),
            prefix_end.typed_data(),
            own_start.typed_data(),
            own_end.typed_data(),
            context + int(qd[0]),
            context,
            page_size,
            pages.typed_data(),
            static_cast<const char*>(pool_k.untyped_data()) + layer_offset,
            static_cast<const char*>(pool_v.untyped_data()) + layer_offset};
  bool ok;
  if (dtype == ffi::DataType::BF16) {
    ok = dispatch(p, static_cast<const uint16_t*>(q.untyped_data()),
                  static_cast<const uint16_t*>(k.untyped_data()),
                  static_cast<const uint16_t*>(v.untyped_data()),
                  static_cast<uint16_t*>(out->untyped_data()));
  } else if (dtype == ffi::DataType::F32) {
    ok = dispatch(p, static_cast<const float*>(q.untyped_data()),
                  static_cast<const float*>(k.untyped_data()),
                  static_cast<const float*>(v.untyped_data()),
                  static_cast<float*>(out->untyped_data()));
  } else {
    return ffi::Error::InvalidArgument("packed_attention: dtype must be bfloat16 or float32");
  }
  if (!ok) return ffi::Error::InvalidArgument("packed_attention: head_dim must be 32, 64 or 128");
  return ffi::Error::Success();
}

}  // namespace packed_attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(PackedAttentionHandler, packed_attention::Attention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale")
                                  .Ctx<ffi::ThreadPool>());

void* packed_attention_handler() { return reinterpret_cast<void*>(&PackedAttentionHandler); }

void packed_attention_set_threads(int threads) { native_cpu::g_threads = threads; }

int packed_attention_cpu_has(int isa) { return packed_attention::cpu_has(isa); }

void packed_attention_set_isa(int isa) { packed_attention::g_builds.set(isa); }

int packed_attention_isa() { return packed_attention::chosen_isa(); }
