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

using StoreF32 = F32Out<DENSE_INT8_WIDE ? 4 : 2, DENSE_INT8_WIDE ? 3 : 1>;
template <int Act>
using StoreGated = GatedOut<DENSE_INT8_WIDE ? 3 : 1, DENSE_INT8_WIDE ? 4 : 2, Act>;

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
