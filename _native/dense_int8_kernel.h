// The int8 dense kernel's body, compiled once per instruction set.
//
// dense_int8.cc includes this file inside a namespace per target, after defining
// DENSE_INT8_WIDE (1: 512-bit vectors, AVX512-VNNI; 0: 256-bit) and DENSE_INT8_VNNI (1: the
// hardware u8 x s8 dot product; 0: AVX2's exact emulation of it through 16-bit products).
// The arithmetic is `kernels/quant.py`'s: activations quantised per row block here, weights per
// column at load (stored as q + 128, unsigned, for the dot product's unsigned operand).

#if DENSE_INT8_WIDE
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
// acc += w (u8) . x (s8) per lane. In asm: GCC copies the accumulator of the intrinsic out and
// back on every call in a loop, two extra moves per dot product
inline VI dot(VI acc, VI w, VI x) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
  return acc;
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
#if DENSE_INT8_VNNI
inline VI dot(VI acc, VI w, VI x) {  // in asm, as the 512-bit build says
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
  return acc;
}
#else
// u8 w times s8 x, four products summed per 32-bit lane, exactly: even and odd bytes widened to
// 16 bits (w zero-extended, x sign-extended), where pairs of products fit the 32-bit sums
inline VI dot(VI acc, VI w, VI x) {
  const VI even_w = _mm256_and_si256(w, _mm256_set1_epi16(0x00FF));
  const VI odd_w = _mm256_srli_epi16(w, 8);
  const VI even_x = _mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8);
  const VI odd_x = _mm256_srai_epi16(x, 8);
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(even_w, even_x));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(odd_w, odd_x));
}
#endif
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
#endif

constexpr int kVecs = 16 / kLanes;  // vectors per 16-column group

inline float bf16_to_f32(uint16_t h) {
  const uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Lanes v quantised by `inverse` into q, their sum added to `sum`.
inline void quantize_vec(VF v, VF inverse, int8_t* q, VI& sum) {
  const VI qi = to_nearest_i(mul_f(v, inverse));
  store_i8(q, qi);
  sum = add_i(sum, qi);
}

// The block's scale and offset from its largest magnitude and the sum of its q.
inline void block_stats(const Problem& p, int64_t row, int64_t b, float amax, int32_t sum) {
  p.scales[row * p.blocks + b] = amax > 0 ? amax * (1.0f / 127.0f) : 1.0f;
  p.offsets[row * p.blocks + b] = 128 * sum;  // what the weights' +128 adds to the block
}

inline float inverse_of(float amax) { return amax > 0 ? 127.0f / amax : 0.0f; }

#if DENSE_INT8_WIDE
// The largest magnitude of 128 bf16 values: their bits less the sign, compared as 16-bit
// integers, which orders them as their values.
inline float held_amax(const uint16_t* x) {
  const VI magnitude = _mm512_set1_epi16(0x7FFF);
  VI m = and_i(load_i(x), magnitude);
  for (int i = 1; i < 4; ++i) m = _mm512_max_epu16(m, and_i(load_i(x + 32 * i), magnitude));
  m = _mm512_max_epu16(m, _mm512_srli_epi32(m, 16));  // each lane's two halves
  const uint32_t top = uint32_t(_mm512_reduce_max_epi32(and_i(m, set1_i(0xFFFF))));
  float f;
  const uint32_t b = top << 16;
  std::memcpy(&f, &b, 4);
  return f;
}

// A block of exactly kHeld lanes (the usual 128) at 512 bits: no tails, its q stored 64 at a
// time, narrowed by saturating packs (exact: |q| <= 127), which interleave 128-bit lanes, put
// back in order by one permutation; their sum by a dot product with ones.
constexpr int kHeld = 128;
inline void quantize_held(const Problem& p, int64_t row, int64_t b) {
  const int64_t k0 = b * p.block;
  const uint16_t* x = p.a + row * p.k + k0;
  const float amax = held_amax(x);
  const VF inverse = set1_f(inverse_of(amax));
  int8_t* q = p.q + row * p.k + k0;
  const VI order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const VI ones = _mm512_set1_epi8(1);
  VI vsum = zero_i();
  for (int h = 0; h < kHeld / 64; ++h) {
    VI qi[4];
    for (int i = 0; i < 4; ++i)
      qi[i] = to_nearest_i(mul_f(load_bf16(x + (4 * h + i) * kLanes), inverse));
    const VI packed = _mm512_packs_epi16(_mm512_packs_epi32(qi[0], qi[1]),
                                         _mm512_packs_epi32(qi[2], qi[3]));
    const VI bytes = _mm512_permutexvar_epi32(order, packed);
    _mm512_storeu_si512(q + 64 * h, bytes);
    vsum = dot(vsum, ones, bytes);
  }
  block_stats(p, row, b, amax, hsum(vsum));
}
#endif

// Any block: two passes over memory, the tail lane by lane.
inline void quantize_block(const Problem& p, int64_t row, int64_t b) {
  const uint16_t* x = p.a + row * p.k;
  int8_t* q = p.q + row * p.k;
  const int64_t k0 = b * p.block, k1 = std::min(p.k, k0 + p.block);
  const int64_t vec_end = k0 + (k1 - k0) / kLanes * kLanes;
  const VI magnitude = set1_i(0x7FFFFFFF);
  VF vmax = zero_f();
  for (int64_t k = k0; k < vec_end; k += kLanes)
    vmax = max_f(vmax, from_bits(and_i(bits(load_bf16(x + k)), magnitude)));
  float amax = hmax(vmax);
  for (int64_t k = vec_end; k < k1; ++k) amax = std::max(amax, std::fabs(bf16_to_f32(x[k])));
  const float inverse = inverse_of(amax);
  VI vsum = zero_i();
  for (int64_t k = k0; k < vec_end; k += kLanes)
    quantize_vec(load_bf16(x + k), set1_f(inverse), q + k, vsum);
  int32_t sum = hsum(vsum);
  for (int64_t k = vec_end; k < k1; ++k) {
    q[k] = int8_t(std::nearbyint(bf16_to_f32(x[k]) * inverse));
    sum += q[k];
  }
  block_stats(p, row, b, amax, sum);
}

// Row `row` of a, quantised block by block into q, with each block's scale and offset.
inline void quantize_row(const Problem& p, int64_t row) {
  for (int64_t b = 0; b < p.blocks; ++b) {
#if DENSE_INT8_WIDE
    if (p.block == kHeld && (b + 1) * kHeld <= p.k) {
      quantize_held(p, row, b);
      continue;
    }
#endif
    quantize_block(p, row, b);
  }
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

// f32 lanes rounded to bf16, to nearest even (as XLA converts), stored as 16-bit words.
inline void store_bf16(uint16_t* p, VF v) {
  const VI b = bits(v);
  const VI odd = and_i(shr_i(b, 16), set1_i(1));
  store_u16(p, shr_i(add_i(b, add_i(set1_i(0x7FFF), odd)), 16));
}

// Writes the f32 results: groups g of a row go to columns 16 g.
struct StoreF32 {
  static constexpr int kRows = DENSE_INT8_WIDE ? 4 : 2, kGroups = DENSE_INT8_WIDE ? 3 : 1;
  template <int G>
  static void row(const VF* acc, void* out, int64_t ld, int64_t row, int64_t group, bool stream) {
    float* o = static_cast<float*>(out) + row * ld + group * 16;
    for (int j = 0; j < G * kVecs; ++j)
      stream ? stream_f(o + j * kLanes, acc[j]) : store_f(o + j * kLanes, acc[j]);
  }
};

// Gated (SwiGLU) output: group pairs (2j, 2j+1) are gate and up of output group j; writes
// bf16(silu(gate) * up).
struct StoreGated {
  static constexpr int kRows = DENSE_INT8_WIDE ? 3 : 1, kGroups = DENSE_INT8_WIDE ? 4 : 2;
  template <int G>
  static void row(const VF* acc, void* out, int64_t ld, int64_t row, int64_t group, bool) {
    uint16_t* o = static_cast<uint16_t*>(out) + row * (ld / 2) + group / 2 * 16;
    for (int g = 0; g + 1 < G; g += 2) {
      for (int v = 0; v < kVecs; ++v) {
        const VF gate = acc[g * kVecs + v], up = acc[(g + 1) * kVecs + v];
        const VF silu = div_f(gate, add_f(set1_f(1.0f), exp_f(sub_f(zero_f(), gate))));
        store_bf16(o + g / 2 * 16 + v * kLanes, mul_f(silu, up));
      }
    }
  }
};

typedef int32_t __attribute__((may_alias)) Quad;  // four int8 values read as one lane

// Rows [row, row + R) by the G column groups starting at `group`: int32 sums per activation
// block (less the block's offset), weighted by the block's scale into f32 totals, then by the
// column scales. The totals live in memory, touched once a block: with them in registers GCC
// ran out and copied accumulators around the dot products (5-10% slower).
template <class Store, int R, int G>
void tile(const Problem& p, int64_t row, int64_t group) {
  constexpr int J = G * kVecs;
  alignas(64) float totals[R][J][kLanes];
  const int64_t quads = p.k / 4, stride = quads * 64;
  const uint8_t* w = p.w + group * stride;
  for (int64_t b = 0; b < p.blocks; ++b) {
    VI acc[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = zero_i();
    const int64_t i1 = std::min(quads, (b + 1) * p.block / 4);
    for (int64_t i = b * p.block / 4; i < i1; ++i) {
      VI wv[J];
      for (int g = 0; g < G; ++g)
        for (int v = 0; v < kVecs; ++v)
          wv[g * kVecs + v] = load_i(w + g * stride + i * 64 + v * kLanes * 4);
      for (int r = 0; r < R; ++r) {
        const VI x = set1_i(reinterpret_cast<const Quad*>(p.q + (row + r) * p.k)[i]);
        for (int j = 0; j < J; ++j) acc[r][j] = dot(acc[r][j], wv[j], x);
      }
    }
    for (int r = 0; r < R; ++r) {
      const VF s = set1_f(p.scales[(row + r) * p.blocks + b]);
      const VI offset = set1_i(p.offsets[(row + r) * p.blocks + b]);
      for (int j = 0; j < J; ++j) {
        const VF part = to_f(sub_i(acc[r][j], offset));
        store_f(totals[r][j], b == 0 ? mul_f(part, s) : fmadd(part, s, load_f(totals[r][j])));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    VF sums[J];
    for (int j = 0; j < J; ++j)
      sums[j] = mul_f(load_f(totals[r][j]), load_f(p.wscale + group * 16 + j * kLanes));
    Store::template row<G>(sums, p.out, p.n, row + r, group, p.stream);
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
  // about 128 KiB of int8 activations per row block, each row quantised just before its tiles
  dense_tiles::run<Problem, Store, Make<Store>>(
      p, p.m, p.n / 16, p.k, 128 * 1024, 128, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) quantize_row(p, r);
      });
}
