// Dense bf16 matmul through oneDNN's matmul primitive, with weights packed once at load in the
// layout oneDNN picks for this CPU, as an XLA FFI custom call.
//
// out f32[M, N] = a bf16[M, K] @ W, W being layer `layer` of a stack of packed weights
// u8[L, bytes(K, N)]. oneDNN dispatches to the CPU's widest matrix instructions (AMX tiles on
// Intel Sapphire Rapids and later, AVX512-BF16, AVX-512, AVX2), so this path runs where the
// hand-written AVX512-BF16 kernel is slow or absent. The packed layout is the one oneDNN asks
// for at `kPackRows` rows with the weight format left to it; a call of any row count uses a
// primitive made for that layout (one per row count, kept). Products accumulate in f32.

#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "builds.h"
#include "dense_onednn.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace onednn_dense {

using dnnl::memory;
using Dims = memory::dims;

constexpr int64_t kPackRows = 2048;  // the batch the weight layout is chosen for

dnnl::engine& cpu() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::desc plain(int64_t rows, int64_t cols, memory::data_type type) {
  return memory::desc(Dims{rows, cols}, type, memory::format_tag::ab);
}

// The packed weight layout of (k, n): asked of oneDNN once, then kept.
const memory::desc& packed_desc(int64_t k, int64_t n) {
  static std::mutex lock;
  static std::map<std::pair<int64_t, int64_t>, memory::desc> layouts;
  std::lock_guard<std::mutex> guard(lock);
  auto found = layouts.find({k, n});
  if (found != layouts.end()) return found->second;
  const memory::desc any(Dims{k, n}, memory::data_type::bf16, memory::format_tag::any);
  dnnl::matmul::primitive_desc pd(cpu(), plain(kPackRows, k, memory::data_type::bf16), any,
                                  plain(kPackRows, n, memory::data_type::f32));
  return layouts.emplace(std::make_pair(k, n), pd.weights_desc()).first->second;
}

// The matmul of m rows over packed (k, n) weights: made once per shape, then kept.
const dnnl::matmul& primitive(int64_t m, int64_t k, int64_t n) {
  static std::mutex lock;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, dnnl::matmul> made;
  const memory::desc& weights = packed_desc(k, n);
  std::lock_guard<std::mutex> guard(lock);
  auto found = made.find({m, k, n});
  if (found != made.end()) return found->second;
  dnnl::matmul::primitive_desc pd(cpu(), plain(m, k, memory::data_type::bf16), weights,
                                  plain(m, n, memory::data_type::f32));
  return made.emplace(std::make_tuple(m, k, n), dnnl::matmul(pd)).first->second;
}

using native_builds::dims;

std::string check(const ffi::AnyBuffer& a, const ffi::AnyBuffer& w,
                  const ffi::Buffer<ffi::S32>& layer, const ffi::AnyBuffer& out) {
  auto ad = a.dimensions(), wd = w.dimensions(), od = out.dimensions();
  if (a.element_type() != ffi::DataType::BF16 || w.element_type() != ffi::DataType::U8 ||
      out.element_type() != ffi::DataType::F32)
    return "a must be bfloat16, w uint8 and out float32";
  if (ad.size() != 2 || od.size() != 2 || od[0] != ad[0])
    return "a has shape " + dims(a) + " and out " + dims(out);
  if (wd.size() != 2 || wd[1] != static_cast<int64_t>(packed_desc(ad[1], od[1]).get_size()))
    return "w has shape " + dims(w) + ", not the packing of [" + std::to_string(ad[1]) + ", " +
           std::to_string(od[1]) + "]";
  if (layer.element_count() != 1) return "layer must be a scalar";
  const int32_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0])
    return "layer " + std::to_string(index) + " outside the stack of " + std::to_string(wd[0]);
  return "";
}

ffi::Error Dense(ffi::AnyBuffer a, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> layer,
                 ffi::Result<ffi::AnyBuffer> out) {
  try {
    std::string error = check(a, w, layer, *out);
    if (!error.empty()) return ffi::Error::InvalidArgument("onednn_dense: " + error);
    const int64_t m = a.dimensions()[0], k = a.dimensions()[1], n = out->dimensions()[1];
    if (m == 0) return ffi::Error::Success();
    auto* weights = static_cast<uint8_t*>(w.untyped_data()) +
                    layer.typed_data()[0] * w.dimensions()[1];
    memory src(plain(m, k, memory::data_type::bf16), cpu(), a.untyped_data());
    memory wts(packed_desc(k, n), cpu(), weights);
    memory dst(plain(m, n, memory::data_type::f32), cpu(), out->untyped_data());
    dnnl::stream stream(cpu());
    primitive(m, k, n).execute(
        stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
    stream.wait();
  } catch (const std::exception& e) {  // dnnl::error among them: nothing crosses into XLA
    return ffi::Error::Internal(std::string("onednn_dense: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace onednn_dense

XLA_FFI_DEFINE_HANDLER_SYMBOL(OneDnnDenseHandler, onednn_dense::Dense,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

void* onednn_dense_handler() { return reinterpret_cast<void*>(&OneDnnDenseHandler); }

long long onednn_packed_bytes(long long k, long long n) {
  try {
    return static_cast<long long>(onednn_dense::packed_desc(k, n).get_size());
  } catch (const std::exception&) {
    return -1;
  }
}

int onednn_pack(const void* w, long long k, long long n, long long stride_k, long long stride_n,
                void* out) {
  using onednn_dense::cpu;
  try {
    const dnnl::memory::desc strided(onednn_dense::Dims{k, n}, dnnl::memory::data_type::bf16,
                                     onednn_dense::Dims{stride_k, stride_n});
    dnnl::memory src(strided, cpu(), const_cast<void*>(w));
    dnnl::memory dst(onednn_dense::packed_desc(k, n), cpu(), out);
    dnnl::stream stream(cpu());
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
  } catch (const std::exception&) {
    return -1;
  }
  return 0;
}

const char* onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "other";
  }
}
