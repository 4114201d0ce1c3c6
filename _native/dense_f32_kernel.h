// The f32 dense kernel of one instruction-set build (dense_f32.cc includes it inside each
// build's namespace): simd.h's vectors and `Store`, the f32 epilogue whose size is the
// build's register tile, come from the includer.

// Rows [r0, r1) of a copied into their tiles' chunks.
inline void copy_rows(const Problem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float* tile = p.tiles + r / Store::kRows * Store::kRows * p.k + r % Store::kRows * kChunk;
    for (int64_t c = 0; c < p.k; c += kChunk)
      std::memcpy(tile + c * Store::kRows, p.a + r * p.k + c, kChunk * sizeof(float));
  }
}

// Rows [row, row + R) (the first R of a tile: row is a multiple of kRows) by the G groups from
// `group`: per column of a, G groups of weights loaded once and each row's value broadcast.
template <int R, int G>
void tile(const Problem& p, int64_t row, int64_t group) {
  constexpr int V = G * kVecs;
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero_f();
  const float* x = p.tiles + row * p.k;
  const float* w = p.w + group * p.k * 16;
  for (int64_t c = 0; c < p.k; c += kChunk, x += kChunk * Store::kRows) {
#pragma GCC unroll 1  // unrolled, GCC 12 kept two of AVX2's 12 accumulators on the stack
    for (int i = 0; i < kChunk; ++i) {
      VF b[V];
      for (int v = 0; v < V; ++v)
        b[v] = load_f(w + v / kVecs * p.k * 16 + (c + i) * 16 + v % kVecs * kLanes);
      for (int r = 0; r < R; ++r) {
        const VF xr = set1_f(x[r * kChunk + i]);
        for (int v = 0; v < V; ++v) acc[r][v] = fmadd(xr, b[v], acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r) Store::template row<G>(acc[r], p.out, p.n, row + r, group, p.stream);
}

struct Make {
  template <int R, int G>
  static constexpr dense_tiles::Tile<Problem> of() {
    return &tile<R, G>;
  }
};

// About 256 KiB of activations per row block, beside one weight panel.
inline void run(const Problem& p) {
  dense_tiles::run<Problem, Store, Make>(p, p.m, p.n / 16, 4 * p.k, 256 * 1024, 64,
                                         [&](int64_t r0, int64_t r1) { copy_rows(p, r0, r1); });
}
