// Activations staged as f32 for the register tiles of the FMA kernels (dense_f32.cc's builds and
// dense.cc's AVX2 build), compiled once per instruction set: the includer has included simd.h
// in its namespace, and <cstring> and <vector> at file scope.
//
// Each register tile of kRows rows reads its activations from a copy laid out
// [K / kChunk][kRows][kChunk] (a last, partial chunk's unused columns unset), so it streams one
// contiguous run instead of kRows strided rows (5-20% faster at MiniLM's shapes on AVX2), and
// bf16 inputs are widened once instead of once per column group. A row block is copied inside
// its work item into a buffer its worker thread keeps (about 256 KiB); a batch small enough that
// the columns are split too (at most 4 row blocks per thread) is copied whole first, into a
// buffer the calling thread keeps. A Problem has the kernel's m, n, k and a, and `float* tiles`
// and `int64_t first_row` (the row the copy starts at, a multiple of kRows).

constexpr int kChunk = 8;  // columns of a row in one chunk

inline int64_t padded(int64_t k) { return (k + kChunk - 1) / kChunk * kChunk; }

inline void stage_chunk(float* to, const float* from, int n) {
  std::memcpy(to, from, n * sizeof(float));
}

// bf16 widened to f32, which is exact
inline void stage_chunk(float* to, const uint16_t* from, int n) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) store_f(to + j, load_bf16(from + j));
  for (; j < n; ++j) to[j] = bf16_to_f32(from[j]);
}

// Rows [r0, r1) of p.a into p.tiles.
template <class Store, class Problem>
void stage_rows(const Problem& p, int64_t r0, int64_t r1) {
  const int64_t k = padded(p.k);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r - p.first_row;
    float* tile = p.tiles + t / Store::kRows * Store::kRows * k + t % Store::kRows * kChunk;
    for (int64_t c = 0; c < p.k; c += kChunk) {
      const int n = int(std::min<int64_t>(kChunk, p.k - c));
      stage_chunk(tile + c * Store::kRows, p.a + r * p.k + c, n);
    }
  }
}

// The copy of the tile whose first row is `row` (a multiple of kRows).
template <class Problem>
const float* staged(const Problem& p, int64_t row) {
  return p.tiles + (row - p.first_row) * padded(p.k);
}

// The kernel's tiles over all of p, its rows staged as above.
template <class Problem, class Store, class Make>
void run_staged(Problem p) {
  const int64_t k = padded(p.k);
  const dense_tiles::Plan plan = dense_tiles::plan<Store>(p.m, p.n / 16, 4 * k, 256 * 1024, 64);
  thread_local std::vector<float> whole;
  if (plan.splits > 1) {
    whole.resize((p.m + Store::kRows - 1) / Store::kRows * Store::kRows * k);
    p.tiles = whole.data();
    p.first_row = 0;
  }
  dense_tiles::run<Problem, Store, Make>(p, plan, [&](int64_t r0, int64_t r1) {
    if (plan.splits > 1) {
      stage_rows<Store>(p, r0, r1);
      return p;
    }
    thread_local std::vector<float> block;
    block.resize(plan.block_rows * k);
    Problem q = p;
    q.tiles = block.data();
    q.first_row = r0;
    stage_rows<Store>(q, r0, r1);
    return q;
  });
}
