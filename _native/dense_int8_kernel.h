// The int8 dense kernel's body, compiled once per instruction set.
//
// dense_int8.cc includes this file inside a namespace per target, after defining
// DENSE_INT8_WIDE (1: 512-bit vectors, AVX512-VNNI; 0: 256-bit) and DENSE_INT8_VNNI (1: the
// hardware u8 x s8 dot product; 0: AVX2's exact emulation of it through 16-bit products).
// The arithmetic is `score_kernels/quant.py`'s: activations quantised per row block here, weights per
// column at load (stored as q + 128, unsigned, for the dot product's unsigned operand).

#define SIMD_WIDE DENSE_INT8_WIDE
#include "simd.h"
#undef SIMD_WIDE

#if DENSE_INT8_WIDE
// acc += w (u8) . x (s8) per lane. In asm: GCC copies the accumulator of the intrinsic out and
// back on every call in a loop, two extra moves per dot product
inline VI dot(VI acc, VI w, VI x) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
  return acc;
}
#elif DENSE_INT8_VNNI
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

// Whether a block of this width is rotated: a power of two (every full block of 128, and the
// usual tails), as `quant.rotated` says.
inline bool rotated(int64_t width) { return (width & (width - 1)) == 0; }

// (v + s) where `mask` is clear, (s - v) where it is set: one butterfly stage inside a vector
// whose partner lanes `s` holds (lane i's partner is i ^ h, the set lanes the upper of a pair).
#if DENSE_INT8_WIDE
inline VF butterfly(VF v, VF s, __mmask16 upper) {
  return _mm512_mask_blend_ps(upper, add_f(v, s), sub_f(s, v));
}
#else
template <int kUpper>
inline VF butterfly(VF v, VF s) {
  return _mm256_blend_ps(add_f(v, s), sub_f(s, v), kUpper);
}
#endif

// The stages of pairs closer than a vector, in registers: h = 1, 2, 4 (and 8 at 512 bits).
inline VF hadamard_lanes(VF v) {
#if DENSE_INT8_WIDE
  v = butterfly(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);
  v = butterfly(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);
  v = butterfly(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);
  return butterfly(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);
#else
  v = butterfly<0xAA>(v, _mm256_permute_ps(v, 0xB1));
  v = butterfly<0xCC>(v, _mm256_permute_ps(v, 0x4E));
  return butterfly<0xF0>(v, _mm256_permute2f128_ps(v, v, 1));
#endif
}

// x[0, n) times the n x n Hadamard matrix (+-1 entries, Sylvester's order), n a power of two, in
// place: log2(n) butterfly stages turning each pair (a, b) into (a + b, a - b), the additions
// `quant.hadamard` does in XLA, so both give the same floats. Pairs within a vector in
// registers, wider ones vector by vector; blocks narrower than a vector lane by lane.
inline void hadamard(float* x, int64_t n) {
  if (n < kLanes) {
    for (int64_t h = 1; h < n; h *= 2)
      for (int64_t i = 0; i < n; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
    return;
  }
  for (int64_t i = 0; i < n; i += kLanes) store_f(x + i, hadamard_lanes(load_f(x + i)));
  for (int64_t h = kLanes; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; j += kLanes) {
        const VF a = load_f(x + j), b = load_f(x + j + h);
        store_f(x + j, add_f(a, b));
        store_f(x + j + h, sub_f(a, b));
      }
}

// Block b of a row: widened to f32, rotated where its width is a power of two (spreading an
// outlier channel over the block before it sets the block's scale), then quantised.
inline void quantize_block(const Problem& p, int64_t row, int64_t b, float* x) {
  const int64_t k0 = b * p.block, n = std::min(p.k, k0 + p.block) - k0;
  const uint16_t* a = p.a + row * p.k + k0;
  const int64_t vec_end = n / kLanes * kLanes;
  for (int64_t i = 0; i < vec_end; i += kLanes) store_f(x + i, load_bf16(a + i));
  for (int64_t i = vec_end; i < n; ++i) x[i] = bf16_to_f32(a[i]);
  if (rotated(n)) hadamard(x, n);
  const VI magnitude = set1_i(0x7FFFFFFF);
  VF vmax = zero_f();
  for (int64_t i = 0; i < vec_end; i += kLanes)
    vmax = max_f(vmax, from_bits(and_i(bits(load_f(x + i)), magnitude)));
  float amax = hmax(vmax);
  for (int64_t i = vec_end; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inverse = inverse_of(amax);
  int8_t* q = p.q + row * p.k + k0;
  VI vsum = zero_i();
  for (int64_t i = 0; i < vec_end; i += kLanes)
    quantize_vec(load_f(x + i), set1_f(inverse), q + i, vsum);
  int32_t sum = hsum(vsum);
  for (int64_t i = vec_end; i < n; ++i) {
    q[i] = int8_t(std::nearbyint(x[i] * inverse));
    sum += q[i];
  }
  block_stats(p, row, b, amax, sum);
}

// Row `row` of a, quantised block by block into q, with each block's scale and offset.
inline void quantize_row(const Problem& p, int64_t row) {
  thread_local std::vector<float> x;  // one block, widened
  x.resize(p.block);
  for (int64_t b = 0; b < p.blocks; ++b) quantize_block(p, row, b, x.data());
}

using StoreF32 = F32Out<DENSE_INT8_WIDE ? 4 : 2, DENSE_INT8_WIDE ? 3 : 1>;
using StoreAdd = AddOut<DENSE_INT8_WIDE ? 4 : 2, DENSE_INT8_WIDE ? 3 : 1>;
using StoreQkv = QkvOut<DENSE_INT8_WIDE ? 4 : 2, DENSE_INT8_WIDE ? 3 : 1>;
template <int Act>
using StoreGated = GatedOut<DENSE_INT8_WIDE ? 3 : 1, DENSE_INT8_WIDE ? 4 : 2, Act>;
template <int Act>
using StoreAct = ActOut<DENSE_INT8_WIDE ? 4 : 2, DENSE_INT8_WIDE ? 3 : 1, Act>;

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
  Store::template prefetch<R, G>(p, row, group);
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
    for (int j = 0; j < J; ++j) {
      sums[j] = mul_f(load_f(totals[r][j]), load_f(p.wscale + group * 16 + j * kLanes));
      asm("" : "+v"(sums[j]));  // rounded here: not contracted into the residual's add
    }
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
  // about 128 KiB of int8 activations per row block, each row quantised just before its tiles
  const auto plan = dense_tiles::plan<Store>(p.m, p.n / 16, p.k, 128 * 1024, 128);
  dense_tiles::run<Problem, Store, Make<Store>>(
      p, plan, [&](int64_t r0, int64_t r1) -> const Problem& {
        for (int64_t r = r0; r < r1; ++r) quantize_row(p, r);
        return p;
      });
}
