// The f32 dense kernel of one instruction-set build (dense_f32.cc includes it inside each
// build's namespace): simd.h's vectors, dense_staged.h's copy of the activations and `Store`,
// the f32 epilogue whose size is the build's register tile, come from the includer.

// Rows [row, row + R) (the first R of a tile: row is a multiple of kRows) by the G groups from
// `group`: per column of a, G groups of weights loaded once and each row's value broadcast.
template <int R, int G>
void tile(const Problem& p, int64_t row, int64_t group) {
  constexpr int V = G * kVecs;
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero_f();
  const float* x = staged(p, row);
  const float* w = p.w + group * p.k * 16;
  for (int64_t c = 0; c < p.k; c += kChunk, x += kChunk * Store::kRows) {
    const int columns = int(std::min<int64_t>(kChunk, p.k - c));
    const float* xi = x;  // pointers stepped, not indices: constant offsets from them
    const float* wi = w + c * 16;
#pragma GCC unroll 1  // unrolled, GCC 12 kept two of AVX2's 12 accumulators on the stack
    for (int i = 0; i < columns; ++i, ++xi, wi += 16) {
      VF b[V];
      for (int v = 0; v < V; ++v) b[v] = load_f(wi + v / kVecs * p.k * 16 + v % kVecs * kLanes);
      for (int r = 0; r < R; ++r) {
        const VF xr = set1_f(xi[r * kChunk]);
        for (int v = 0; v < V; ++v) acc[r][v] = fmadd(xr, b[v], acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r) Store::template row<G>(acc[r], p, row + r, group);
}

struct Make {
  template <int R, int G>
  static constexpr dense_tiles::Tile<Problem> of() {
    return &tile<R, G>;
  }
};

inline void run(const Problem& p) { run_staged<Problem, Store, Make>(p); }
