// Fused packed two-span attention on the CPU: the body, compiled once per instruction set.
//
// attention.cc includes this file inside a namespace per target (AMX, AVX-512, AVX2+FMA,
// baseline) and dispatches at run time, so one build runs everywhere and uses the widest vectors
// there. It expects the standard headers (<type_traits> and <limits> included), <immintrin.h>
// and amx.h to be included already, `Problem`, `Vectors`, `Reusable` and `parallel_for`
// declared in the enclosing scope, and PACKED_ATTENTION_AVX512, PACKED_ATTENTION_BF16,
// PACKED_ATTENTION_AMX and PACKED_ATTENTION_LANES defined: 1 compiles the 512-bit intrinsics
// (horizontal reductions, exp2), the AVX512-BF16 dot-product path for bf16 inputs, and that
// path's two products on AMX tiles (attention_amx.h); LANES is the f32 lanes of the target's
// vector register (16, 8 or 4), the width of every vector here.
//
// Layout: q [T, H, D], k and v [T, Hkv, D] row-major (bf16 or f32), out like q; the context
// region's keys (C of them, before the batch's) are rows of this layer's pool pages
// [P, page, Hkv, D], found through the page table. Work items are
// (query tile of `tile_tokens` tokens, set of kv heads: all of them where the tiles alone give
// every thread work); for each kv head in turn, an item's rows are its tokens times the G query
// heads of that kv head, and what they see of each key tile is worked out once for all its
// heads. Scores never leave a key tile held in cache: QK^T, the mask,
// an online softmax (exp2 with log2(e) folded into the query scale) and PV are fused per tile.
// Rows go in blocks of 4, and each block computes only the key vectors its rows see in the tile:
// short spans (an encoder's texts, a decoder's items) skip most of the tiles they overlap.

// Vectors are exactly one register wide: wider generic vectors are split by the compiler, which
// keeps arrays of them on the stack (an AVX2 build of 16-lane vectors ran at a tenth of its
// matmul speed, moving every accumulator through memory).
constexpr int kLanes = PACKED_ATTENTION_LANES;
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));

// Keys per tile (KT below): 128 where vectors are 512-bit and a tile's prepared K and V fit in
// 64 KB, else 64. On a Zen 5 (AVX-512) 128-key tiles ran the bf16 W2 packing 6-7% faster than
// 64-key ones (the per-row, per-tile work halved), but f32 at head dim 128 (128 KB a tile) 12%
// slower, and 256 keys gained nothing.
constexpr int key_tile(int head_dim, int prepared_bytes) {
  return PACKED_ATTENTION_AVX512 && 2 * 128 * head_dim * prepared_bytes <= 64 * 1024 ? 128 : 64;
}

inline vf splat(float x) { return vf{} + x; }

// Taylor series of 2^r = e^(r ln 2) to degree 7: relative error < 2e-7 on [-0.5, 0.5].
inline vf exp2_fraction(vf r) {
  vf p = splat(1.5252733804059840e-5f);
  p = p * r + splat(1.5403530393381608e-4f);
  p = p * r + splat(1.3333558146428443e-3f);
  p = p * r + splat(9.6181291076284772e-3f);
  p = p * r + splat(5.5504108664821580e-2f);
  p = p * r + splat(2.4022650695910071e-1f);
  p = p * r + splat(6.9314718055994531e-1f);
  return p * r + splat(1.0f);
}

// A row's running max moves only when a score passes it by more than this (log2 units): until
// then probabilities reach at most 2^kMaxSlack, and the row skips its horizontal max and its
// rescale. The softmax is the same for any such shift; only the rounding differs.
constexpr float kMaxSlack = 8.0f;

#if PACKED_ATTENTION_AVX512
// 2^x for x <= kMaxSlack (scores minus a running max); 0 for -inf. Below -160 the result
// underflows to exactly 0; between -160 and -126 it may be a denormal.
inline vf exp2_bounded(vf x) {
  const __m512 clamped = _mm512_max_ps((__m512)x, _mm512_set1_ps(-160.0f));
  const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const vf p = exp2_fraction((vf)_mm512_sub_ps(clamped, n));
  return (vf)_mm512_scalef_ps((__m512)p, n);
}
#else
// 2^x for x <= kMaxSlack (scores minus a running max), exact 0 below -126.
inline vf exp2_bounded(vf x) {
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf clamped = x < splat(-126.0f) ? splat(-126.0f) : x;
  vf shifted = clamped + magic;
  vf n = shifted - magic;
  vf p = exp2_fraction(clamped - n);  // of [-0.5, 0.5]
  vi bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  vi magic_bits;
  std::memcpy(&magic_bits, &magic, sizeof magic_bits);
  vi scale_bits = ((bits - magic_bits) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return x < splat(-126.0f) ? splat(0.0f) : p * scale;
}
#endif

#if PACKED_ATTENTION_AVX512
inline float hmax(vf x) { return _mm512_reduce_max_ps((__m512)x); }
inline bool any_above(vf x, float limit) {
  return _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(limit), _CMP_GT_OQ) != 0;
}
inline float hsum(vf x) { return _mm512_reduce_add_ps((__m512)x); }
#else
inline float hmax(vf x) {
  float m = x[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, x[i]);
  return m;
}

inline bool any_above(vf x, float limit) {
  bool any = false;
  for (int i = 0; i < kLanes; ++i) any = any || x[i] > limit;
  return any;
}

inline float hsum(vf x) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += x[i];
  return s;
}
#endif

// Accumulator registers a register tile keeps: 16 of AVX-512's 32, 12 of the 16 narrower ones
// (the rest hold the loaded vectors and the broadcast; with 8 the AVX2 build ran 1.3x slower,
// its FMA latency not hidden).
constexpr int kAccVecs = PACKED_ATTENTION_AVX512 ? 16 : 12;

// Accumulator sets a PV pass of `accumulators` registers alternates its keys between, summed at
// the end: two where one set fills at most half the registers (a short head: D 32 on AVX-512),
// so its multiply-adds do not wait on each other's latency; else one.
constexpr int accumulator_sets(int accumulators) { return 2 * accumulators <= kAccVecs ? 2 : 1; }

// scores[r][s .. s + W) = q_rows[r] . kt[.][same key vectors] for the 4 rows at q.
template <int KT, int D, int W>
inline void score_pass(const float* q, const vf* kt, int s, vf* scores) {
  constexpr int kKeyVecs = KT / kLanes;
  vf acc[4][W] = {};
  for (int d = 0; d < D; ++d) {
    const vf* key = kt + d * kKeyVecs + s;
    for (int i = 0; i < 4; ++i) {
      float qv = q[i * D + d];
      for (int c = 0; c < W; ++c) acc[i][c] += qv * key[c];
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < W; ++c) scores[i * kKeyVecs + s + c] = acc[i][c];
}

// Calls body(std::integral_constant<int, n>) for n in [N, KV] (n < N runs as N): the vector
// count of a key range as a compile-time constant, so the accumulators stay in registers.
template <int KV, int N = 1, typename Body>
inline void with_vector_count(int n, const Body& body) {
  if constexpr (N < KV) {
    if (n > N) return with_vector_count<KV, N + 1>(n, body);
  }
  body(std::integral_constant<int, N>{});
}

// Calls pass(s, std::integral_constant<int, w>) over vectors [first, first + N) in runs of
// w = Step (the last run the remainder): a register tile's width as a compile-time constant.
template <int N, int Step, typename Pass>
inline void in_passes(int first, const Pass& pass) {
  constexpr int kTail = N % Step;
  for (int s = first; s < first + N - kTail; s += Step)
    pass(s, std::integral_constant<int, Step>{});
  if constexpr (kTail > 0) pass(first + N - kTail, std::integral_constant<int, kTail>{});
}

// Key vectors [c0, c1) of a key tile (empty when c0 >= c1): what a block of 4 rows sees.
struct VectorRange {
  int c0, c1;
};

// scores[r][key vectors c0 .. c0 + NV) = q[r] . kt[.][same keys] for the 4 rows at q, in passes
// of up to kAccVecs / 4 key vectors.
template <int KT, int D, int NV>
inline void block_scores(const float* q, const vf* kt, int c0, vf* scores) {
  in_passes<NV, std::min(NV, kAccVecs / 4)>(c0, [&](int s, auto w) {
    score_pass<KT, D, decltype(w)::value>(q, kt, s, scores);
  });
}

// Calls body(b, c0, std::integral_constant<int, n>) for each block b of 4 rows that sees n > 0
// key vectors from c0: the score kernels' walk over the blocks.
template <int KT, typename Body>
inline void for_blocks_seeing_keys(const VectorRange* blocks, int n_blocks, const Body& body) {
  for (int b = 0; b < n_blocks; ++b) {
    const int c0 = blocks[b].c0, c1 = blocks[b].c1;
    if (c0 < c1) with_vector_count<KT / kLanes>(c1 - c0, [&](auto n) { body(b, c0, n); });
  }
}

// scores[r][key vectors of r's block] = q_rows[r] . kt[.][same keys] for the blocks of 4 rows.
// Keys outside a block's range are neither computed nor written.
template <int KT, int D>
void tile_scores(const float* q_rows, const vf* kt, const VectorRange* blocks, int n_blocks,
                 vf* scores) {
  for_blocks_seeing_keys<KT>(blocks, n_blocks, [&](int b, int c0, auto n) {
    block_scores<KT, D, decltype(n)::value>(q_rows + 4 * b * D, kt, c0,
                                            scores + 4 * b * (KT / kLanes));
  });
}

// out[r][s .. s + W) = out[r][same] * alpha[r] + probs[r][keys] . v_tile[keys][same] for the
// R rows at r, over the keys of vectors [c0, c1), in `accumulator_sets` sets.
template <int KT, int D, int R, int W>
inline void value_pass(const vf* probs, const vf* v_tile, const float* alpha, int r, int s,
                       int c0, int c1, vf* out) {
  constexpr int kVecs = D / kLanes;
  constexpr int kSplit = accumulator_sets(R * W);
  vf acc[kSplit][R][W];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < W; ++c) {
      acc[0][i][c] = out[(r + i) * kVecs + s + c] * alpha[r + i];
      for (int h = 1; h < kSplit; ++h) acc[h][i][c] = vf{};
    }
  // Pointers stepped per key: every broadcast and load is at a constant offset (indices
  // recomputed per broadcast cost two scalar instructions each, a third of the loop).
  const float* p = reinterpret_cast<const float*>(probs) + r * KT + c0 * kLanes;
  const float* const p_end = p + (c1 - c0) * kLanes;
  for (const vf* value = v_tile + c0 * kLanes * kVecs + s; p < p_end;
       p += kSplit, value += kSplit * kVecs)
    for (int h = 0; h < kSplit; ++h)
      for (int i = 0; i < R; ++i) {
        float pv = p[i * KT + h];
        for (int c = 0; c < W; ++c) acc[h][i][c] += pv * value[h * kVecs + c];
      }
  for (int h = 1; h < kSplit; ++h)
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < W; ++c) acc[0][i][c] += acc[h][i][c];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < W; ++c) out[(r + i) * kVecs + s + c] = acc[0][i][c];
}

// out[r] = out[r] * alpha[r] + probs[r][keys] . v_tile[keys] over the key vectors of r's block,
// in passes of kRows rows by up to kAccVecs / kRows head-dim vectors. Blocks that see no key are
// skipped: their rows' alpha is 1.
template <int KT, int D>
void tile_values(const vf* probs, const vf* v_tile, const float* alpha,
                 const VectorRange* blocks, int n_blocks, vf* out) {
  constexpr int kVecs = D / kLanes;
  constexpr int kRows = PACKED_ATTENTION_AVX512 && kVecs >= 8 ? 2 : 4;
  for (int b = 0; b < n_blocks; ++b) {
    const auto [c0, c1] = blocks[b];
    if (c0 >= c1) continue;
    for (int r = 4 * b; r < 4 * b + 4; r += kRows)
      in_passes<kVecs, std::min(kVecs, kAccVecs / kRows)>(0, [&](int s, auto w) {
        value_pass<KT, D, kRows, decltype(w)::value>(probs, v_tile, alpha, r, s, c0, c1, out);
      });
  }
}

enum class Visible { kNone, kPartial, kAll };

template <int KT>
inline Visible classify(const Problem& p, int token, int key0) {
  int key1 = key0 + KT;  // exclusive
  int ps = p.prefix_start[token], pe = p.prefix_end[token], os = p.own_start[token];
  int oe = p.own_end[token];
  bool prefix_all = ps <= key0 && key1 <= pe;
  bool own_all = os <= key0 && key1 <= oe;
  if (prefix_all || own_all) return Visible::kAll;
  bool prefix_any = ps < pe && ps < key1 && key0 < pe;
  bool own_any = os < key1 && key0 < oe;
  return prefix_any || own_any ? Visible::kPartial : Visible::kNone;
}

inline void mask_row(const Problem& p, int token, int key0, int c0, int c1, vf* row) {
  vi lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  int ps = p.prefix_start[token], pe = p.prefix_end[token], os = p.own_start[token];
  int oe = p.own_end[token];
  for (int c = c0; c < c1; ++c) {
    vi key = lane + (key0 + c * kLanes);
    vi visible = ((key >= ps) & (key < pe)) | ((key >= os) & (key < oe));
    row[c] = visible ? row[c] : splat(-INFINITY);
  }
}

// The key vectors of the tile at key0 that the tokens [t0, t1) can see, as one range.
template <int KT>
inline VectorRange visible_vectors(const Problem& p, int t0, int t1, int key0) {
  int lo = key0 + KT, hi = key0;  // visible keys [lo, hi), empty so far
  auto cover = [&](int start, int end) {  // [start, end) clipped to the tile
    start = std::max(start, key0);
    end = std::min(end, key0 + KT);
    if (start < end) lo = std::min(lo, start), hi = std::max(hi, end);
  };
  for (int t = t0; t < t1; ++t) {
    cover(p.prefix_start[t], p.prefix_end[t]);
    cover(p.own_start[t], p.own_end[t]);
  }
  if (lo >= hi) return {0, 0};
  return {(lo - key0) / kLanes, (hi - key0 + kLanes - 1) / kLanes};
}

// blocks[b] = the key vectors of the tile at key0 that rows [4b, 4b + 4) see (row r is token
// tok0 + r / group; rows past the tokens' see nothing), for the `padded` rows; returns whether
// any block sees a key.
template <int KT>
inline bool block_vectors(const Problem& p, int tok0, int tok1, int group, int key0, int padded,
                          VectorRange* blocks) {
  const int rows = (tok1 - tok0) * group;
  bool any = false;
  for (int b = 0; b < padded / 4; ++b) {
    int first = 4 * b, last = std::min(4 * b + 4, rows);  // real rows [first, last)
    blocks[b] = first < last ? visible_vectors<KT>(p, tok0 + first / group,
                                                   tok0 + (last - 1) / group + 1, key0)
                             : VectorRange{0, 0};
    any = any || blocks[b].c0 < blocks[b].c1;
  }
  return any;
}

// Ascending key tiles any token of [tok0, tok1) sees.
template <int KT>
inline void visited_tiles(const Problem& p, int tok0, int tok1, std::vector<int>* tiles,
                          std::vector<std::pair<int, int>>* spans) {
  spans->clear();
  for (int t = tok0; t < tok1; ++t) {
    spans->emplace_back(p.own_start[t], p.own_end[t]);
    if (p.prefix_end[t] > p.prefix_start[t])
      spans->emplace_back(p.prefix_start[t], p.prefix_end[t]);
  }
  std::sort(spans->begin(), spans->end());
  tiles->clear();
  for (const auto& [lo, hi] : *spans) {
    int first = lo / KT, last = (hi - 1) / KT;
    if (!tiles->empty()) first = std::max(first, tiles->back() + 1);
    for (int tile = first; tile <= last; ++tile) tiles->push_back(tile);
  }
}

// The K or V row of kv head `g` at `key` of the key space: keys [0, context) live in the pool's
// pages through the page table, the rest in the batch.
template <typename In>
inline const In* key_row(const Problem& p, const In* batch, const void* pool, int key, int g) {
  if (key >= p.context)
    return batch + (int64_t(key - p.context) * p.kv_heads + g) * p.head_dim;
  int64_t slot = int64_t(p.pages[key / p.page_size]) * p.page_size + key % p.page_size;
  return static_cast<const In*>(pool) + (slot * p.kv_heads + g) * p.head_dim;
}

template <typename In>
inline float load(const In* x, int64_t i) {
  if constexpr (sizeof(In) == 2) {
    uint32_t bits = uint32_t(x[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  } else {
    return x[i];
  }
}

template <typename In>
inline void store(In* x, int64_t i, float f) {
  if constexpr (sizeof(In) == 2) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even (inputs are finite)
    x[i] = In(bits >> 16);
  } else {
    x[i] = f;
  }
}

// K/V prepared as f32 tiles and the f32 FMA tile kernels: every target, every dtype.
template <typename In, int D>
struct F32Tiles {
  using QueryWord = float;
  static constexpr int kQueryWords = D;
  static constexpr int kRowStep = 4;  // rows are padded to a multiple of this
  static constexpr int kVecs = D / kLanes;
  static constexpr int kKeyTile = key_tile(D, sizeof(float));
  static constexpr int kKeyVecs = kKeyTile / kLanes;
  int k_tiles = 0;
  // kt[g][tile][d][kKeyTile] (transposed for the score kernel), vt[g][tile][kKeyTile][d]
  Vectors kt, vt;

  void prepare(const Problem& p, const In* k, const In* v) {
    k_tiles = (p.keys + kKeyTile - 1) / kKeyTile;
    size_t vecs = size_t(p.kv_heads) * k_tiles * kKeyTile * D / kLanes;
    kt.resize<vf>(vecs);
    vt.resize<vf>(vecs);
    parallel_for(k_tiles * p.kv_heads, [&](int item) {
      int tile = item / p.kv_heads, g = item % p.kv_heads;  // heads of a tile: adjacent rows
      float* kt_tile = kt.as<float>() + (int64_t(g) * k_tiles + tile) * D * kKeyTile;
      float* v_tile = vt.as<float>() + (int64_t(g) * k_tiles + tile) * kKeyTile * D;
      int real = std::min(kKeyTile, p.keys - tile * kKeyTile);
      for (int j = 0; j < real; ++j) {
        const In* k_row = key_row(p, k, p.pool_k, tile * kKeyTile + j, g);
        const In* v_row = key_row(p, v, p.pool_v, tile * kKeyTile + j, g);
        for (int d = 0; d < D; ++d) {
          kt_tile[d * kKeyTile + j] = load(k_row, d);
          v_tile[j * D + d] = load(v_row, d);
        }
      }
      for (int j = real; j < kKeyTile; ++j)
        for (int d = 0; d < D; ++d) kt_tile[d * kKeyTile + j] = v_tile[j * D + d] = 0.0f;
    });
  }

  // Query rows scaled into log2 units; q_rows holds `padded` rows of D floats.
  void load_queries(const Problem& p, const In* q, int tok0, int tok1, int g, int group,
                    std::vector<float>* q_rows) const {
    const float q_scale = p.scale * 1.4426950408889634f;
    for (int t = tok0; t < tok1; ++t)
      for (int i = 0; i < group; ++i) {
        int64_t base = (int64_t(t) * p.heads + g * group + i) * D;
        float* row = q_rows->data() + ((t - tok0) * group + i) * D;
        for (int d = 0; d < D; ++d) row[d] = load(q, base + d) * q_scale;
      }
  }

  void scores(const std::vector<float>& q_rows, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* score) const {
    const vf* kt_tile = kt.as<vf>() + (int64_t(g) * k_tiles + tile) * D * kKeyVecs;
    tile_scores<kKeyTile, D>(q_rows.data(), kt_tile, blocks, n_blocks, score);
  }

  void values(const vf* probs, const float* alpha, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* out) const {
    const vf* v_tile = vt.as<vf>() + (int64_t(g) * k_tiles + tile) * kKeyTile * kVecs;
    tile_values<kKeyTile, D>(probs, v_tile, alpha, blocks, n_blocks, out);
  }
};

#if PACKED_ATTENTION_BF16
// bf16 K/V kept in bf16 and multiplied with AVX512-BF16 dot products (two products per f32 lane
// per instruction), accumulating in f32. Probabilities are rounded to bf16 for PV, as the XLA
// kernel does; scores, softmax and sums stay f32.
// The row a key past the last reads (as zeros): the widest head.
alignas(64) inline constexpr uint16_t kZeroRow[128] = {};

template <int D>
struct Bf16Tiles {
  static constexpr int kVecs = D / kLanes;
  static constexpr int kPairs = D / 2;
  using QueryWord = uint32_t;
  static constexpr int kQueryWords = kPairs;
  static constexpr int kRowStep = 4;
  static constexpr int kKeyTile = key_tile(D, sizeof(uint16_t));
  static constexpr int kKeyVecs = kKeyTile / kLanes;
  int k_tiles = 0;
  float score_scale = 0.0f;
  // kp[g][tile][D/2][kKeyTile]: the 32-bit (d, d+1) pair of each key;
  // vp[g][tile][kKeyTile/2][D][2]: the (2k, 2k+1) key pair of each dimension.
  Vectors kp, vp;

  void prepare(const Problem& p, const uint16_t* k, const uint16_t* v) {
    k_tiles = (p.keys + kKeyTile - 1) / kKeyTile;
    score_scale = p.scale * 1.4426950408889634f;
    size_t vecs = size_t(p.kv_heads) * k_tiles * kKeyTile * D / (2 * kLanes);
    kp.resize<__m512bh>(vecs);
    vp.resize<__m512bh>(vecs);
    parallel_for(k_tiles * p.kv_heads, [&](int item) {
      int tile = item / p.kv_heads, g = item % p.kv_heads;  // heads of a tile: adjacent rows
      uint32_t* kp_tile = kp.as<uint32_t>() + (int64_t(g) * k_tiles + tile) * kPairs * kKeyTile;
      uint16_t* vp_tile = vp.as<uint16_t>() + (int64_t(g) * k_tiles + tile) * kKeyTile * D;
      for (int j0 = 0; j0 < kKeyTile; j0 += 16) {
        const uint16_t *k_rows[16], *v_rows[16];
        for (int j = 0; j < 16; ++j) {
          int key = tile * kKeyTile + j0 + j;  // keys past the last read as zeros
          k_rows[j] = key < p.keys ? key_row(p, k, p.pool_k, key, g) : kZeroRow;
          v_rows[j] = key < p.keys ? key_row(p, v, p.pool_v, key, g) : kZeroRow;
        }
        for (int c = 0; c < kPairs; c += 16)
          transpose_pairs(k_rows, c, kp_tile + c * kKeyTile + j0);
        for (int j = 0; j < 16; j += 2)
          interleave_keys(v_rows[j], v_rows[j + 1], vp_tile + (j0 + j) * D);
      }
    });
  }

  // Pairs [c, c + 16) of 16 keys' rows, transposed: pair c + i of the 16 keys to out + i
  // kKeyTile (16 32-bit words each). Unpacks build each 128-bit lane's 4 x 4 blocks, then
  // lane shuffles move the blocks.
  static void transpose_pairs(const uint16_t* const* rows, int c, uint32_t* out) {
    __m512i r[16], t[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(rows[j] + 2 * c);
    for (int j = 0; j < 16; j += 2) {
      t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
      t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
    }
    for (int q = 0; q < 16; q += 4) {  // u[q + e]: element 4 L + e of rows q .. q + 3, lane L
      r[q] = _mm512_unpacklo_epi64(t[q], t[q + 2]);
      r[q + 1] = _mm512_unpackhi_epi64(t[q], t[q + 2]);
      r[q + 2] = _mm512_unpacklo_epi64(t[q + 1], t[q + 3]);
      r[q + 3] = _mm512_unpackhi_epi64(t[q + 1], t[q + 3]);
    }
    for (int e = 0; e < 4; ++e) {
      const __m512i a = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44);
      const __m512i b = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
      const __m512i c2 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
      const __m512i d = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
      _mm512_storeu_si512(out + (0 + e) * kKeyTile, _mm512_shuffle_i32x4(a, c2, 0x88));
      _mm512_storeu_si512(out + (4 + e) * kKeyTile, _mm512_shuffle_i32x4(a, c2, 0xDD));
      _mm512_storeu_si512(out + (8 + e) * kKeyTile, _mm512_shuffle_i32x4(b, d, 0x88));
      _mm512_storeu_si512(out + (12 + e) * kKeyTile, _mm512_shuffle_i32x4(b, d, 0xDD));
    }
  }

  // Two keys' value rows as the pairs (a[d], b[d]) of each dimension d, into out [D][2].
  static void interleave_keys(const uint16_t* a, const uint16_t* b, uint16_t* out) {
    const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                         40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                         32, 0);
    const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (int d = 0; d < D; d += 32) {
      const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
      _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(x, low, y));
      _mm512_storeu_si512(out + 2 * d + 32, _mm512_permutex2var_epi16(x, high, y));
    }
  }

  // Query rows as raw bf16 (D/2 pairs each); the scale is applied to the f32 scores.
  void load_queries(const Problem& p, const uint16_t* q, int tok0, int tok1, int g, int group,
                    std::vector<uint32_t>* q_rows) const {
    for (int t = tok0; t < tok1; ++t)
      for (int i = 0; i < group; ++i) {
        int64_t base = (int64_t(t) * p.heads + g * group + i) * D;
        std::memcpy(q_rows->data() + ((t - tok0) * group + i) * kPairs, q + base, D * 2);
      }
  }

  // score[i][key vectors s .. s + W) for the 4 rows at q.
  template <int W>
  void score_pass(const uint32_t* q, const __m512bh* keys, int s, vf* score) const {
    __m512 acc[4][W];
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < W; ++c) acc[i][c] = _mm512_setzero_ps();
    for (int dp = 0; dp < kPairs; ++dp) {
      const __m512bh* key = keys + dp * kKeyVecs + s;
      for (int i = 0; i < 4; ++i) {
        __m512bh qv = (__m512bh)_mm512_set1_epi32(int(q[i * kPairs + dp]));
        for (int c = 0; c < W; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], key[c], qv);
      }
    }
    const __m512 scale = _mm512_set1_ps(score_scale);
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < W; ++c)
        score[i * kKeyVecs + s + c] = (vf)_mm512_mul_ps(acc[i][c], scale);
  }

  // score[i][key vectors c0 .. c0 + NV) for the 4 rows at q, in passes of up to kAccVecs / 4.
  template <int NV>
  void block_scores(const uint32_t* q, const __m512bh* keys, int c0, vf* score) const {
    in_passes<NV, std::min(NV, kAccVecs / 4)>(c0, [&](int s, auto w) {
      score_pass<decltype(w)::value>(q, keys, s, score);
    });
  }

  void scores(const std::vector<uint32_t>& q_rows, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* score) const {
    const __m512bh* keys = kp.as<__m512bh>() + (int64_t(g) * k_tiles + tile) * kPairs * kKeyVecs;
    for_blocks_seeing_keys<kKeyTile>(blocks, n_blocks, [&](int b, int c0, auto n) {
      block_scores<decltype(n)::value>(q_rows.data() + 4 * b * kPairs, keys, c0,
                                       score + 4 * b * kKeyVecs);
    });
  }

  void values(const vf* probs, const float* alpha, int g, int tile, const VectorRange* blocks,
              int n_blocks, vf* out) const {
    const __m512bh* vals = vp.as<__m512bh>() + (int64_t(g) * k_tiles + tile) * kKeyTile * kVecs / 2;
    thread_local std::vector<uint32_t> p16;  // [rows][kKeyTile / 2] bf16 probability pairs
    p16.resize(size_t(n_blocks) * 4 * kKeyTile / 2);
    for (int r = 0; r < n_blocks * 4; ++r) {
      const auto [c0, c1] = blocks[r / 4];
      const vf* from = probs + r * kKeyVecs;
      __m256i* to = reinterpret_cast<__m256i*>(p16.data() + r * kKeyTile / 2);
      for (int c = c0; c < c1; ++c)
        _mm256_storeu_si256(to + c, (__m256i)_mm512_cvtneps_pbh((__m512)from[c]));
    }
    for (int r = 0; r < n_blocks * 4; r += kRows) {
      const auto [c0, c1] = blocks[r / 4];
      if (c0 < c1)
        value_rows(p16.data() + r * kKeyTile / 2, vals, alpha + r, c0, c1, out + r * kVecs);
    }
  }

 private:
  static constexpr int kRows = kVecs >= 8 ? 2 : 4;
  static constexpr int kSplit = accumulator_sets(kRows * kVecs);

  // out[i] = out[i] * alpha[i] + p[i][pairs] . vals[pairs] for the kRows rows of bf16
  // probability pairs at p (kKeyTile / 2 a row), over the pairs of key vectors [c0, c1), in
  // `accumulator_sets` sets.
  static void value_rows(const uint32_t* p, const __m512bh* vals, const float* alpha, int c0,
                         int c1, vf* out) {
    __m512 acc[kSplit][kRows][kVecs];
    for (int i = 0; i < kRows; ++i)
      for (int c = 0; c < kVecs; ++c) {
        acc[0][i][c] = (__m512)(out[i * kVecs + c] * alpha[i]);
        for (int h = 1; h < kSplit; ++h) acc[h][i][c] = _mm512_setzero_ps();
      }
    // Pointers stepped per pair: every broadcast and load at a constant offset.
    const __m512bh* value = vals + c0 * kLanes / 2 * kVecs;
    const uint32_t* const end = p + c1 * kLanes / 2;
    for (p += c0 * kLanes / 2; p < end; p += kSplit, value += kSplit * kVecs)
      for (int h = 0; h < kSplit; ++h)
        for (int i = 0; i < kRows; ++i) {
          const __m512bh pv = (__m512bh)_mm512_set1_epi32(int(p[i * kKeyTile / 2 + h]));
          for (int c = 0; c < kVecs; ++c)
            acc[h][i][c] = _mm512_dpbf16_ps(acc[h][i][c], value[h * kVecs + c], pv);
        }
    for (int h = 1; h < kSplit; ++h)
      for (int i = 0; i < kRows; ++i)
        for (int c = 0; c < kVecs; ++c) acc[0][i][c] = _mm512_add_ps(acc[0][i][c], acc[h][i][c]);
    for (int i = 0; i < kRows; ++i)
      for (int c = 0; c < kVecs; ++c) out[i * kVecs + c] = (vf)acc[0][i][c];
  }
};
#endif

#if PACKED_ATTENTION_AMX
#include "attention_amx.h"
#endif

// Online-softmax step over one key tile, each row over its block's vectors: scores become
// probabilities (masked keys 0), alpha the rescale of each row's accumulator; rows [rows,
// padded) and rows that see no key here get zeros and alpha 1. seen[t - tok0]: what token t
// sees of the tile (`classify`).
template <int KT>
void softmax_tile(const Problem& p, int tok0, int tok1, int group, int key0,
                  const Visible* seen, const VectorRange* blocks, int padded, vf* score,
                  float* row_max, vf* row_sum, float* alpha) {
  constexpr int kKeyVecs = KT / kLanes;
  const int rows = (tok1 - tok0) * group;
  auto no_keys = [&](int r) {
    const auto [c0, c1] = blocks[r / 4];
    for (int c = c0; c < c1; ++c) score[r * kKeyVecs + c] = vf{};
    alpha[r] = 1.0f;
  };
  for (int t = tok0; t < tok1; ++t) {
    for (int i = 0; i < group; ++i) {
      int r = (t - tok0) * group + i;
      if (seen[t - tok0] == Visible::kNone) {
        no_keys(r);
        continue;
      }
      vf* s = score + r * kKeyVecs;
      const auto [c0, c1] = blocks[r / 4];
      if (seen[t - tok0] == Visible::kPartial) mask_row(p, t, key0, c0, c1, s);
      vf top = s[c0];
      for (int c = c0 + 1; c < c1; ++c) top = top > s[c] ? top : s[c];
      float m = row_max[r], a = 1.0f;
      if (any_above(top, m + kMaxSlack)) {  // the max moves: rescale by 2^(old - new)
        float moved = std::max(m, hmax(top));
        a = std::exp2(m - moved);  // 0 while the old max is -inf
        row_max[r] = m = moved;
      }
      vf sum{};
      for (int c = c0; c < c1; ++c) {
        s[c] = exp2_bounded(s[c] - m);
        sum += s[c];
      }
      row_sum[r] = row_sum[r] * a + sum;  // per lane: reduced once, after the last tile
      alpha[r] = a;
    }
  }
  for (int r = rows; r < padded; ++r) no_keys(r);
}

// What the rows of one query tile see, key tile by key tile: the same for every kv head, so
// worked out once per work item and read by each of its heads.
template <int KT>
struct TileWalk {
  std::vector<int> tiles;                  // the key tiles any token sees, ascending
  std::vector<VectorRange> blocks;         // [tile][padded / 4]: each row block's key vectors
  std::vector<Visible> seen;               // [tile][token]: `classify`
  std::vector<std::pair<int, int>> spans;  // scratch of `visited_tiles`

  // For tokens [tok0, tok1) and `padded` rows; tiles no row block sees are dropped.
  void plan(const Problem& p, int tok0, int tok1, int group, int padded) {
    visited_tiles<KT>(p, tok0, tok1, &tiles, &spans);
    const int n_blocks = padded / 4, tokens = tok1 - tok0;
    blocks.resize(tiles.size() * n_blocks);
    seen.resize(tiles.size() * tokens);
    size_t kept = 0;
    for (int tile : tiles) {
      const int key0 = tile * KT;
      VectorRange* b = blocks.data() + kept * n_blocks;
      if (!block_vectors<KT>(p, tok0, tok1, group, key0, padded, b)) continue;
      for (int t = tok0; t < tok1; ++t) seen[kept * tokens + t - tok0] = classify<KT>(p, t, key0);
      tiles[kept++] = tile;
    }
    tiles.resize(kept);
  }
};

// Work items per query tile: the kv heads split into this many sets, enough items for every
// thread (4 each) when the tiles alone are too few; the heads of one item share its TileWalk.
inline int head_sets(int q_tiles, int kv_heads) {
  const int wanted = 4 * native_cpu::thread_count();
  return std::clamp((wanted + q_tiles - 1) / q_tiles, 1, kv_heads);
}

// A work item's rows for one kv head at a time: their queries and running online softmax
// (max, per-lane sum, rescale) and output accumulators, kept per thread and reset per head.
template <typename QueryWord, int kVecs>
struct HeadRows {
  std::vector<QueryWord> q_rows;  // [rows][words]
  std::vector<float> row_max, alpha;
  Vectors acc, sums;

  // Room for `rows` rows of `words` query words each, every row at its start state.
  void reset(int rows, int words) {
    q_rows.assign(size_t(rows) * words, QueryWord{});
    row_max.assign(rows, -INFINITY);
    alpha.assign(rows, 1.0f);
    vf* const row_sum = sums.resize<vf>(rows);
    std::fill(row_sum, row_sum + rows, vf{});
    vf* const out_rows = acc.resize<vf>(size_t(rows) * kVecs);
    std::fill(out_rows, out_rows + size_t(rows) * kVecs, vf{});
  }
  vf* row_sum() const { return sums.as<vf>(); }
  vf* out_rows() const { return acc.as<vf>(); }
};

// Writes the finished rows of kv head g for tokens [tok0, tok1): each row's accumulator over
// its softmax sum, at query head g * group + i of its token.
template <typename In, int D>
void write_rows(const Problem& p, int tok0, int tok1, int g, int group, const vf* out_rows,
                const vf* row_sum, In* out) {
  constexpr int kVecs = D / kLanes;
  for (int t = tok0; t < tok1; ++t)
    for (int i = 0; i < group; ++i) {
      const int r = (t - tok0) * group + i;
      const int64_t base = (int64_t(t) * p.heads + g * group + i) * D;
      const float* o = reinterpret_cast<const float*>(out_rows + r * kVecs);
      const float inv = 1.0f / hsum(row_sum[r]);
      for (int d = 0; d < D; ++d) store(out, base + d, o[d] * inv);
    }
}

// One work item per (query tile, set of kv heads); `Tiles` supplies the score and value kernels.
// Row r = (token - tok0) * group + i of an item holds query head g * group + i of that token.
template <typename In, int D, typename Tiles>
void attend(const Problem& p, const In* q, const Tiles& tiles, In* out) {
  constexpr int KT = Tiles::kKeyTile;
  constexpr int kRowStep = Tiles::kRowStep;
  const int group = p.heads / p.kv_heads;
  const int tile_tokens = std::max(1, 64 / group);
  const int q_tiles = (p.tokens + tile_tokens - 1) / tile_tokens;
  const int sets = head_sets(q_tiles, p.kv_heads);
  const int max_rows = (tile_tokens * group + kRowStep - 1) / kRowStep * kRowStep;
  parallel_for(q_tiles * sets, [&](int item) {
    const int set = item % sets;
    const int tok0 = (item / sets) * tile_tokens;
    const int tok1 = std::min(p.tokens, tok0 + tile_tokens);
    const int padded = ((tok1 - tok0) * group + kRowStep - 1) / kRowStep * kRowStep;
    const int n_blocks = padded / 4, tokens = tok1 - tok0;
    thread_local HeadRows<typename Tiles::QueryWord, D / kLanes> rows;
    thread_local Vectors scores;
    thread_local TileWalk<KT> walk;
    walk.plan(p, tok0, tok1, group, padded);
    vf* const score = scores.resize<vf>(size_t(max_rows) * Tiles::kKeyVecs);
    for (int g = set * p.kv_heads / sets; g < (set + 1) * p.kv_heads / sets; ++g) {
      rows.reset(max_rows, Tiles::kQueryWords);
      tiles.load_queries(p, q, tok0, tok1, g, group, &rows.q_rows);
      for (size_t j = 0; j < walk.tiles.size(); ++j) {
        const int tile = walk.tiles[j];
        const VectorRange* blocks = walk.blocks.data() + j * n_blocks;
        tiles.scores(rows.q_rows, g, tile, blocks, n_blocks, score);
        softmax_tile<KT>(p, tok0, tok1, group, tile * KT, walk.seen.data() + j * tokens, blocks,
                         padded, score, rows.row_max.data(), rows.row_sum(), rows.alpha.data());
        tiles.values(score, rows.alpha.data(), g, tile, blocks, n_blocks, rows.out_rows());
      }
      write_rows<In, D>(p, tok0, tok1, g, group, rows.out_rows(), rows.row_sum(), out);
    }
  });
}

// Prepares the tiles of one call and attends with them. The tiles are reused from call to call
// (one set per concurrent call, each at the size of the largest layer it served): allocated
// afresh, every layer's K/V copy was page-faulted in, a sixth of the kernel's time on short
// texts.
template <typename Tiles, typename In, int D>
void run_tiles(const Problem& p, const In* q, const In* k, const In* v, In* out) {
  static Reusable<Tiles> reusable;
  auto tiles = reusable.take();
  tiles->prepare(p, k, v);
  attend<In, D>(p, q, *tiles, out);
  reusable.give(std::move(tiles));
}

template <typename In, int D>
void run_head_dim(const Problem& p, const In* q, const In* k, const In* v, In* out) {
#if PACKED_ATTENTION_AMX
  if constexpr (sizeof(In) == 2) return run_tiles<AmxTiles<D>, In, D>(p, q, k, v, out);
#elif PACKED_ATTENTION_BF16
  if constexpr (sizeof(In) == 2) return run_tiles<Bf16Tiles<D>, In, D>(p, q, k, v, out);
#endif
  run_tiles<F32Tiles<In, D>, In, D>(p, q, k, v, out);
}

template <typename In>
bool run(const Problem& p, const In* q, const In* k, const In* v, In* out) {
  if (p.head_dim == 32) {  // MiniLM cross-encoders
    run_head_dim<In, 32>(p, q, k, v, out);
  } else if (p.head_dim == 64) {
    run_head_dim<In, 64>(p, q, k, v, out);
  } else if (p.head_dim == 128) {
    run_head_dim<In, 128>(p, q, k, v, out);
  } else {
    return false;
  }
  return true;
}
