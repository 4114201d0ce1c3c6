// Vector helpers and the epilogues the dense kernels share (f32 sums, SwiGLU, bias and
// activation), compiled once per instruction set.
//
// A kernel includes this file inside its namespace per target, after defining SIMD_WIDE (1:
// 512-bit AVX-512 vectors; 0: 256-bit AVX2) and after including <immintrin.h> and <cstring> at
// file scope (this file includes nothing, so it can sit inside a namespace).

#if SIMD_WIDE
using VI = __m512i;
using VF = __m512;
constexpr int kLanes = 16;
inline VI zero_i() { return _mm512_setzero_si512(); }
inline VF zero_f() { return _mm512_setzero_ps(); }
inline VI set1_i(int32_t x) { return _mm512_set1_epi32(x); }
inline VF set1_f(float x) { return _mm512_set1_ps(x); }
inline VI load_i(const void* p) { return _mm512_loadu_si512(p); }
inline VF load_f(const float* p) { return _mm512_loadu_ps(p); }
inline void store_f(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline void stream_f(float* p, VF v) { _mm512_stream_ps(p, v); }  // p 64-byte aligned
inline VI add_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI sub_i(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI shl_i(VI a, int n) { return _mm512_slli_epi32(a, n); }
inline VI shr_i(VI a, int n) { return _mm512_srli_epi32(a, n); }
inline VF add_f(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF sub_f(VF a, VF b) { return _mm512_sub_ps(a, b); }
inline VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF div_f(VF a, VF b) { return _mm512_div_ps(a, b); }
inline VF min_f(VF a, VF b) { return _mm512_min_ps(a, b); }
inline VF max_f(VF a, VF b) { return _mm512_max_ps(a, b); }
inline VF fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF to_f(VI v) { return _mm512_cvtepi32_ps(v); }
inline VI to_i(VF v) { return _mm512_cvtps_epi32(v); }  // exact: v holds integers
inline VI bits(VF v) { return _mm512_castps_si512(v); }
inline VF from_bits(VI v) { return _mm512_castsi512_ps(v); }
inline VF round_even(VF x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline float hmax(VF v) { return _mm512_reduce_max_ps(v); }
// rounded to the nearest integer, ties to even, whatever the rounding mode
inline VI to_nearest_i(VF v) {
  return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline int32_t hsum(VI v) { return _mm512_reduce_add_epi32(v); }
// 16 bf16 values (raw 16-bit words) as f32
inline VF load_bf16(const uint16_t* p) {
  return from_bits(shl_i(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
// the low 16 bits of each lane, stored as 16-bit words
inline void store_u16(uint16_t* p, VI v) {
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(v));
}
// lanes in [-127, 127], stored as bytes
inline void store_i8(int8_t* p, VI v) { _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(v)); }
// `neg` in the lanes where x's sign bit is set, `pos` elsewhere
inline VF where_negative(VF x, VF neg, VF pos) {
  return _mm512_mask_blend_ps(_mm512_movepi32_mask(bits(x)), pos, neg);
}
#else
using VI = __m256i;
using VF = __m256;
constexpr int kLanes = 8;
inline VI zero_i() { return _mm256_setzero_si256(); }
inline VF zero_f() { return _mm256_setzero_ps(); }
inline VI set1_i(int32_t x) { return _mm256_set1_epi32(x); }
inline VF set1_f(float x) { return _mm256_set1_ps(x); }
inline VI load_i(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
inline VF load_f(const float* p) { return _mm256_loadu_ps(p); }
inline void store_f(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline void stream_f(float* p, VF v) { _mm256_stream_ps(p, v); }  // p 32-byte aligned
inline VI add_i(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI sub_i(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI shl_i(VI a, int n) { return _mm256_slli_epi32(a, n); }
inline VI shr_i(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline VF add_f(VF a, VF b) { return _mm256_add_ps(a, b); }
inline VF sub_f(VF a, VF b) { return _mm256_sub_ps(a, b); }
inline VF mul_f(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF div_f(VF a, VF b) { return _mm256_div_ps(a, b); }
inline VF min_f(VF a, VF b) { return _mm256_min_ps(a, b); }
inline VF max_f(VF a, VF b) { return _mm256_max_ps(a, b); }
inline VF fmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF to_f(VI v) { return _mm256_cvtepi32_ps(v); }
inline VI to_i(VF v) { return _mm256_cvtps_epi32(v); }
inline VI bits(VF v) { return _mm256_castps_si256(v); }
inline VF from_bits(VI v) { return _mm256_castsi256_ps(v); }
inline VF round_even(VF x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VI to_nearest_i(VF v) { return to_i(round_even(v)); }
inline float hmax(VF v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline int32_t hsum(VI v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
inline VF load_bf16(const uint16_t* p) {
  return from_bits(shl_i(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline void store_u16(uint16_t* p, VI v) {
  const VI packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(packed));
}
inline void store_i8(int8_t* p, VI v) {
  const VI w = _mm256_packs_epi16(_mm256_packs_epi32(v, v), _mm256_packs_epi32(v, v));
  const int32_t lo = _mm256_extract_epi32(w, 0), hi = _mm256_extract_epi32(w, 4);
  std::memcpy(p, &lo, 4);
  std::memcpy(p + 4, &hi, 4);
}
inline VF where_negative(VF x, VF neg, VF pos) { return _mm256_blendv_ps(pos, neg, x); }
#endif

constexpr int kVecs = 16 / kLanes;  // vectors per 16-column group

inline float bf16_to_f32(uint16_t h) {
  const uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}



// e^x for x in [-87, 88] (clamped there), to ~2e-7 relative: 2^n built in the exponent bits
// times a degree-7 Taylor polynomial of e^f for |f| <= ln(2) / 2.
inline VF exp_f(VF x) {
  x = min_f(max_f(x, set1_f(-87.0f)), set1_f(88.0f));
  const VF n = round_even(mul_f(x, set1_f(1.44269504088896341f)));
  const VF f = fmadd(n, set1_f(-0.69314718055994531f), x);
  VF poly = set1_f(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    poly = fmadd(poly, f, set1_f(c));
  return mul_f(poly, from_bits(shl_i(add_i(to_i(n), set1_i(127)), 23)));
}

inline VF silu_f(VF x) { return div_f(x, add_f(set1_f(1.0f), exp_f(sub_f(zero_f(), x)))); }

// erfc(z) for z >= 0, to ~4e-7 relative (and e^-z^2's rounding, ~6e-6 near z = 9) while it is
// a normal f32: e^-z^2 times a degree-9 polynomial in t = 1 / (1 + z / 2), fitted to
// erfc(z) e^z^2 on [0, 14] for relative error.
inline VF erfc_f(VF z) {
  const VF t = div_f(set1_f(1.0f), fmadd(z, set1_f(0.5f), set1_f(1.0f)));
  VF poly = set1_f(-0.05882646515965462f);
  for (float c : {0.28330299258232117f, -0.48432227969169617f, 0.27439069747924805f,
                  -0.023709304630756378f, 0.2012006938457489f, 0.24358931183815002f,
                  0.2822774052619934f, 0.2820974588394165f, -5.302797490003286e-07f})
    poly = fmadd(poly, t, set1_f(c));
  return mul_f(poly, exp_f(mul_f(sub_f(zero_f(), z), z)));
}

// GELU, x Phi(x), with erf: x - x erfc(|x| / sqrt 2) / 2 for x >= 0, and x erfc(|x| / sqrt 2) / 2
// below, so that the small values of the negative side keep their relative precision.
inline VF gelu_f(VF x) {
  const VF z = mul_f(from_bits(and_i(bits(x), set1_i(0x7FFFFFFF))), set1_f(0.70710678118654752f));
  const VF tail = mul_f(x, mul_f(set1_f(0.5f), erfc_f(z)));
  return where_negative(x, tail, sub_f(x, tail));
}

// GELU's tanh form, x (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (x + 0.044715 x^3), computed as
// x sigmoid(2 u) (the same function).
inline VF gelu_tanh_f(VF x) {
  const VF u2 = mul_f(mul_f(x, set1_f(1.5957691216057308f)),
                      fmadd(mul_f(x, x), set1_f(0.044715f), set1_f(1.0f)));
  return div_f(x, add_f(set1_f(1.0f), exp_f(sub_f(zero_f(), u2))));
}

// The activations of GatedOut and ActOut, by the codes score_kernels/activations.py gives them.
enum Activation { kGelu = 0, kGeluTanh = 1, kRelu = 2, kSilu = 3, kIdentity = 4, kActivations = 5 };

template <int Act>
inline VF activate(VF x) {
  static_assert(Act >= 0 && Act < kActivations);
  if constexpr (Act == kGelu) return gelu_f(x);
  else if constexpr (Act == kGeluTanh) return gelu_tanh_f(x);
  else if constexpr (Act == kRelu) return max_f(x, zero_f());
  else if constexpr (Act == kSilu) return silu_f(x);
  else return x;
}

// f32 lanes rounded to bf16, to nearest even (as XLA converts), stored as 16-bit words.
inline void store_bf16(uint16_t* p, VF v) {
  const VI b = bits(v);
  const VI odd = and_i(shr_i(b, 16), set1_i(1));
  store_u16(p, shr_i(add_i(b, add_i(set1_i(0x7FFF), odd)), 16));
}

// Writes f32 results as they are: groups g of a row go to columns 16 g. Rows x Groups: the
// kernel's largest register tile.
template <int Rows, int Groups>
struct F32Out {
  static constexpr int kRows = Rows, kGroups = Groups;
  template <int R, int G, class P>
  static void prefetch(const P&, int64_t, int64_t) {}
  template <int G, class P>
  static void row(const VF* acc, const P& p, int64_t row, int64_t group) {
    float* o = static_cast<float*>(p.out) + row * p.n + group * 16;
    for (int j = 0; j < G * kVecs; ++j)
      p.stream ? stream_f(o + j * kLanes, acc[j]) : store_f(o + j * kLanes, acc[j]);
  }
};

// Starts fetching the lines of [at, at + bytes) into L1: a tile's epilogue reads or writes a
// few such spans per row, lying too far apart (a row of the output each) for the hardware
// prefetchers.
inline void prefetch_span(const void* at, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(at), last = first + bytes - 1;
  for (uintptr_t line = first & ~uintptr_t(63); line <= last; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// The residual stream's update: writes the f32 sums plus `p.addend` (f32[m, n], the residual)
// plus `p.bias` (f32[n], where set), added in that order, so the product never reaches memory
// on its own.
template <int Rows, int Groups>
struct AddOut {
  static constexpr int kRows = Rows, kGroups = Groups;
  // Starts loading the tile's residual rows (`p.addend`, the call's residual form), called
  // before the tile's products: the stream was written by an earlier call and has left the
  // caches (SmolLM2's o projection on Zen 5: 15% faster with this, its down projection 7%).
  template <int R, int G, class P>
  static void prefetch(const P& p, int64_t row, int64_t group) {
    for (int r = 0; r < R; ++r) prefetch_span(p.addend + (row + r) * p.n + group * 16, G * 64);
  }
  template <int G, class P>
  static void row(const VF* acc, const P& p, int64_t row, int64_t group) {
    float* o = static_cast<float*>(p.out) + row * p.n + group * 16;
    const float* residual = p.addend + row * p.n + group * 16;
    for (int j = 0; j < G * kVecs; ++j) {
      VF v = add_f(acc[j], load_f(residual + j * kLanes));
      if (p.bias) v = add_f(v, load_f(p.bias + group * 16 + j * kLanes));
      store_f(o + j * kLanes, v);
    }
  }
};

// Gated output (SwiGLU, GeGLU): group pairs (2j, 2j+1) are gate and up of output group j;
// writes bf16(act(gate) * up).
template <int Rows, int Groups, int Act = kSilu>
struct GatedOut {
  static constexpr int kRows = Rows, kGroups = Groups;
  template <int R, int G, class P>
  static void prefetch(const P& p, int64_t row, int64_t group) {
    const uint16_t* o = static_cast<const uint16_t*>(p.out) + group / 2 * 16;
    for (int r = 0; r < R; ++r) prefetch_span(o + (row + r) * (p.n / 2), G / 2 * 32);
  }
  template <int G, class P>
  static void row(const VF* acc, const P& p, int64_t row, int64_t group) {
    uint16_t* o = static_cast<uint16_t*>(p.out) + row * (p.n / 2) + group / 2 * 16;
    for (int g = 0; g + 1 < G; g += 2) {
      for (int v = 0; v < kVecs; ++v) {
        const VF gate = acc[g * kVecs + v], up = acc[(g + 1) * kVecs + v];
        store_bf16(o + g / 2 * 16 + v * kLanes, mul_f(activate<Act>(gate), up));
      }
    }
  }
};

// Bias and activation: writes bf16(act(sums + bias)) to out bf16[m, n], the bias f32[n] at
// p.bias, so that the product never reaches memory in f32 (an encoder MLP's up projection).
template <int Rows, int Groups, int Act>
struct ActOut {
  static constexpr int kRows = Rows, kGroups = Groups;
  template <int R, int G, class P>
  static void prefetch(const P& p, int64_t row, int64_t group) {
    const uint16_t* o = static_cast<const uint16_t*>(p.out) + group * 16;
    for (int r = 0; r < R; ++r) prefetch_span(o + (row + r) * p.n, G * 32);
  }
  template <int G, class P>
  static void row(const VF* acc, const P& p, int64_t row, int64_t group) {
    uint16_t* o = static_cast<uint16_t*>(p.out) + row * p.n + group * 16;
    const float* bias = p.bias + group * 16;
    for (int j = 0; j < G * kVecs; ++j)
      store_bf16(o + j * kLanes, activate<Act>(add_f(acc[j], load_f(bias + j * kLanes))));
  }
};

// A 16-column group's two halves, each 8 values: for q and k heads, the group holds 8 columns
// of the head's first half and the 8 columns D/2 further (`score_kernels.cpu.pack_qkv`), the pairs
// rotate-half RoPE turns together. Rotated by cos/sin (8 values each, f32) when `cos` is set:
// (x1 cos - x2 sin, x2 cos + x1 sin).
inline void rotate_halves(VF* v, const float* cos, const float* sin) {
#if SIMD_WIDE
  const VF c = _mm512_broadcast_f32x8(_mm256_loadu_ps(cos));
  const VF s = _mm512_broadcast_f32x8(_mm256_loadu_ps(sin));
  const VF swapped = _mm512_shuffle_f32x4(v[0], v[0], 0x4E);  // (x2, x1)
  const VF signed_s = _mm512_mask_sub_ps(s, 0x00FF, zero_f(), s);  // (-sin, sin)
  v[0] = add_f(mul_f(v[0], c), mul_f(swapped, signed_s));
#else
  const VF c = load_f(cos), s = load_f(sin), x1 = v[0], x2 = v[1];
  v[0] = sub_f(mul_f(x1, c), mul_f(x2, s));
  v[1] = add_f(mul_f(x2, c), mul_f(x1, s));
#endif
}

// A 16-column group rounded to bf16, its first 8 values at `first`, the other 8 at `second`.
inline void store_bf16_halves(uint16_t* first, uint16_t* second, const VF* v) {
#if SIMD_WIDE
  const VI b = bits(v[0]);
  const VI odd = and_i(shr_i(b, 16), set1_i(1));
  const __m256i words = _mm512_cvtepi32_epi16(shr_i(add_i(b, add_i(set1_i(0x7FFF), odd)), 16));
  _mm_storeu_si128((__m128i*)first, _mm256_castsi256_si128(words));
  _mm_storeu_si128((__m128i*)second, _mm256_extracti128_si256(words, 1));
#else
  store_bf16(first, v[0]);
  store_bf16(second, v[1]);
#endif
}

// The fused q/k/v projection: bf16(sums + bias) of each 16-column group written to its place
// in q, k or v (`p.places[group]`: which of `p.heads_out`, the column there, and for a q or k
// group its RoPE frequency: its halves go to `column` and `column + p.half`, rotated by
// `p.cos`/`p.sin` [m, D/2] when they are set), rows `p.head_cols[out]` long, so no f32 product
// and no split copy reaches memory.
template <int Rows, int Groups>
struct QkvOut {
  static constexpr int kRows = Rows, kGroups = Groups;
  template <int R, int G, class P>
  static void prefetch(const P& p, int64_t row, int64_t group) {
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) {
        const auto place = p.places[group + g];
        const uint16_t* o = p.heads_out[place.out] + (row + r) * p.head_cols[place.out];
        o += place.column;
        prefetch_span(o, place.freq < 0 ? 32 : 16);
        if (place.freq >= 0) prefetch_span(o + p.half, 16);
      }
  }
  template <int G, class P>
  static void row(const VF* acc, const P& p, int64_t row, int64_t group) {
    for (int g = 0; g < G; ++g) {
      const auto place = p.places[group + g];
      uint16_t* o = p.heads_out[place.out] + row * p.head_cols[place.out] + place.column;
      const float* bias = p.bias + (group + g) * 16;
      VF v[kVecs];
      for (int i = 0; i < kVecs; ++i) v[i] = add_f(acc[g * kVecs + i], load_f(bias + i * kLanes));
      if (place.freq < 0) {  // a v head: its columns in order
        for (int i = 0; i < kVecs; ++i) store_bf16(o + i * kLanes, v[i]);
        continue;
      }
      if (p.cos) {
        const int64_t at = row * p.half + place.freq;
        rotate_halves(v, p.cos + at, p.sin + at);
      }
      store_bf16_halves(o, o + p.half, v);
    }
  }
};
