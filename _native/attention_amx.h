// bf16 attention's two products, QK^T and PV, on AMX tiles (TDPBF16PS), in Bf16Tiles' layouts.
//
// Included by attention_kernel.h in the AMX build (PACKED_ATTENTION_AMX), after Bf16Tiles, whose
// prepared K and V are already B tiles: the K pairs of a key tile are 16-key rows of 64 bytes
// per pair of dimensions, the V pairs 16-dimension rows per pair of keys. Rows go in groups of
// 16 (an A tile): a group multiplies the key vectors any of its four blocks of 4 rows sees. A
// row's scores outside its own block's range are written but never read, and its probabilities
// there are zeros, so they add nothing to its output. Softmax and masks stay Bf16Tiles' (the
// vector code), and so does every rounding: probabilities in bf16, f32 sums.

// Calls f(std::integral_constant<int, j>) for j in [J, N): a tile number as a constant.
template <int N, int J = 0, typename F>
inline void each_tile(const F& f) {
  if constexpr (J < N) {
    f(std::integral_constant<int, J>{});
    each_tile<N, J + 1>(f);
  }
}

// Calls f(std::integral_constant<int, n>) for n = min(left, 4): a C tile count as a constant.
template <typename F>
inline void with_c_tiles(int left, const F& f) {
  switch (std::min(left, 4)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

// C tile j's operations (j < 4), its B tile 6 + j % 2: GCC's tile intrinsics write their tile
// numbers into the assembly text, so they take literals only.
template <int C>
struct CTile;
#define PACKED_ATTENTION_C_TILE(C, B)                                             \
  template <>                                                                     \
  struct CTile<C> {                                                               \
    static void zero() { _tile_zero(C); }                                         \
    static void load(const char* c, int64_t stride) { _tile_loadd(C, c, stride); } \
    static void store(char* c, int64_t stride) { _tile_stored(C, c, stride); }    \
    static void add_product(const char* b, int64_t stride) { /* A tile 4 by b */  \
      _tile_loadd(B, b, stride);                                                  \
      _tile_dpbf16ps(C, 4, B);                                                    \
    }                                                                             \
  };
PACKED_ATTENTION_C_TILE(0, 6)
PACKED_ATTENTION_C_TILE(1, 7)
PACKED_ATTENTION_C_TILE(2, 6)
PACKED_ATTENTION_C_TILE(3, 7)
#undef PACKED_ATTENTION_C_TILE

// C [16 x 16 N] f32 (+)= A [16 x 32 steps] bf16 . B in bf16 pairs, on C tiles 0..N-1 (N <= 4),
// A tile 4 and B tiles 6-7 (alternating, so a load overlaps the product before it). a: 16 rows
// `a_stride` bytes apart, step s at byte 64 s; b: step s's 16 rows of pairs at b + 16 s b_stride,
// C tile j's 16 columns at byte 64 j; c: 16 rows `c_stride` bytes apart, tile j at byte 64 j,
// loaded first when accumulating, else zeros.
template <int N, bool kAccumulate>
inline void tile_product(const char* a, int64_t a_stride, const char* b, int64_t b_stride,
                         int steps, char* c, int64_t c_stride) {
  each_tile<N>([&](auto j) {
    using Tile = CTile<decltype(j)::value>;
    if constexpr (kAccumulate) {
      Tile::load(c + 64 * j, c_stride);
    } else {
      Tile::zero();
    }
  });
  for (int s = 0; s < steps; ++s) {
    _tile_loadd(4, a + 64 * s, a_stride);
    const char* rows = b + 16 * s * b_stride;
    each_tile<N>([&](auto j) { CTile<decltype(j)::value>::add_product(rows + 64 * j, b_stride); });
  }
  each_tile<N>([&](auto j) { CTile<decltype(j)::value>::store(c + 64 * j, c_stride); });
}

// The key vectors any of the 4 blocks from `blocks` sees, as one range (empty: c0 >= c1).
inline VectorRange group_vectors(const VectorRange* blocks) {
  VectorRange all{std::numeric_limits<int>::max(), 0};
  for (int b = 0; b < 4; ++b)
    if (blocks[b].c0 < blocks[b].c1)
      all = {std::min(all.c0, blocks[b].c0), std::max(all.c1, blocks[b].c1)};
  return all;
}

template <int D>
struct AmxTiles : Bf16Tiles<D> {
  using Base = Bf16Tiles<D>;
  using Base::kKeyTile, Base::kKeyVecs, Base::kPairs, Base::kVecs;
  static constexpr int kRowStep = 16;  // rows of an A tile
  uint64_t call = 0;  // amx_tiles::configure's: each thread loads the tile layout once a call

  void prepare(const Problem& p, const uint16_t* k, const uint16_t* v) {
    call = amx_tiles::begin_call();
    Base::prepare(p, k, v);
  }

  void scores(const std::vector<uint32_t>& q_rows, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* score) const {
    amx_tiles::configure(call);
    const int64_t at = (int64_t(g) * this->k_tiles + tile) * kPairs * kKeyVecs;  // vectors
    const char* keys = reinterpret_cast<const char*>(this->kp.template as<__m512bh>() + at);
    const vf scale = splat(this->score_scale);
    for (int r0 = 0; r0 < 4 * n_blocks; r0 += kRowStep) {
      const auto [c0, c1] = group_vectors(blocks + r0 / 4);
      const char* a = reinterpret_cast<const char*>(q_rows.data() + r0 * kPairs);
      char* c = reinterpret_cast<char*>(score + r0 * kKeyVecs);
      for (int v = c0; v < c1; v += 4)
        with_c_tiles(c1 - v, [&](auto n) {
          tile_product<decltype(n)::value, false>(a, D * 2, keys + 64 * v, kKeyTile * 4, D / 32,
                                                  c + 64 * v, kKeyTile * 4);
        });
      for (int r = r0; r < r0 + kRowStep; ++r)
        for (int v = c0; v < c1; ++v) score[r * kKeyVecs + v] *= scale;
    }
  }

  void values(const vf* probs, const float* alpha, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* out) const {
    amx_tiles::configure(call);
    const int64_t at = (int64_t(g) * this->k_tiles + tile) * kKeyTile * kVecs / 2;  // vectors
    const char* vals = reinterpret_cast<const char*>(this->vp.template as<__m512bh>() + at);
    thread_local std::vector<uint16_t> p16;  // [rows][kKeyTile] bf16 probabilities
    p16.resize(size_t(n_blocks) * 4 * kKeyTile);
    for (int r0 = 0; r0 < 4 * n_blocks; r0 += kRowStep) {
      const auto [u0, u1] = group_vectors(blocks + r0 / 4);
      if (u0 >= u1) continue;
      const int s0 = u0 / 2, s1 = (u1 + 1) / 2;  // steps of 32 keys: pairs of key vectors
      for (int r = r0; r < r0 + kRowStep; ++r) {
        rescale(alpha[r], out + r * kVecs);
        const auto [c0, c1] = blocks[r / 4];
        for (int v = 2 * s0; v < 2 * s1; ++v) {
          const __m256bh half = v >= c0 && v < c1
                                    ? _mm512_cvtneps_pbh((__m512)probs[r * kKeyVecs + v])
                                    : (__m256bh)_mm256_setzero_si256();
          std::memcpy(p16.data() + r * kKeyTile + v * kLanes, &half, sizeof half);
        }
      }
      const char* a = reinterpret_cast<const char*>(p16.data() + r0 * kKeyTile + s0 * 32);
      const char* b = vals + int64_t(s0) * 16 * D * 4;
      char* c = reinterpret_cast<char*>(out + r0 * kVecs);
      for (int d = 0; d < kVecs; d += 4)
        with_c_tiles(kVecs - d, [&](auto n) {
          tile_product<decltype(n)::value, true>(a, kKeyTile * 2, b + 64 * d, D * 4, s1 - s0,
                                                 c + 64 * d, D * 4);
        });
    }
  }

  // A row's output so far times its rescale (alpha), before this tile's products add to it.
  static void rescale(float alpha, vf* row) {
    if (alpha != 1.0f)
      for (int d = 0; d < kVecs; ++d) row[d] *= alpha;
  }
};
