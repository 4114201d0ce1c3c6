// The bf16 dense kernel on AMX tiles: f32 sums of exact bf16 products, as the AVX512-BF16 build
// computes them, from tile dot products.
//
// Included by dense.cc inside the AMX build's namespace, after simd.h (the epilogues). A tile
// call computes 32 rows by two 16-column groups: C tiles 0-3 (rows 0-15 and 16-31 by group 0
// and 1) take A tiles 4-5 (16 rows of 32 activations each) times B tiles 6-7 (16 pairs of rows
// of K by the group's 16 columns: the packed weights as they are), 32 values of K a step. A tile
// reads 16 whole rows, so rows at and past `Problem::from` (the last partial 32 rows, or every
// row when k is not a multiple of 32) come from a zero-padded copy (`stage`); what a tile reads
// past m meets rows of C that are never stored.

constexpr int kAmxRows = 32;  // rows of a tile call: two A tiles
constexpr int kAmxStep = 32;  // values of K a tile dot product takes

using AmxF32 = F32Out<kAmxRows, 2>;
using AmxAdd = AddOut<kAmxRows, 2>;
template <int Act>
using AmxGated = GatedOut<kAmxRows, 2, Act>;
template <int Act>
using AmxAct = ActOut<kAmxRows, 2, Act>;
using AmxQkv = QkvOut<kAmxRows, 2>;

// The weights' B tile for K step [k0, k0 + 32) of a group (pairs of K rows).
inline const void* b_rows(const Problem& p, const uint16_t* group_w, int64_t k0,
                          uint8_t (&tail)[16][64]) {
  return amx_tiles::b_rows(group_w + k0 * 16, (p.k - k0) / 2, tail);
}

// Rows [row, row + 32) (those below m) by the G groups from `group`, stored by `Store`.
template <class Store, int G>
void amx_tile(const Problem& p, int64_t row, int64_t group) {
  amx_tiles::configure(p.call);
  const bool copied = row >= p.from;
  const uint16_t* a = copied ? p.staged + (row - p.from) * p.ld : p.a + row * p.k;
  const int64_t lda = copied ? p.ld : p.k;
  const uint16_t* w = p.w + group * p.k * 16;
  uint8_t tail[G][16][64];
  amx_tiles::zero_c<G>();
  for (int64_t k0 = 0; k0 < p.k; k0 += kAmxStep) {
    _tile_loadd(4, a + k0, lda * 2);
    _tile_loadd(5, a + 16 * lda + k0, lda * 2);
    _tile_loadd(6, b_rows(p, w, k0, tail[0]), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (G > 1) {
      _tile_loadd(7, b_rows(p, w + p.k * 16, k0, tail[G - 1]), 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[2][G][16][16];
  amx_tiles::store_c<G>(c);
  const int rows = int(std::min<int64_t>(kAmxRows, p.m - row));
  for (int r = 0; r < rows; ++r) {
    VF sums[G];
    for (int g = 0; g < G; ++g) sums[g] = load_f(c[r / 16][g][r % 16]);
    Store::template row<G>(sums, p, row + r, group);
  }
}

// Every row count takes the same function: it stores only the rows below m.
template <class Store>
struct MakeAmx {
  template <int R, int G>
  static constexpr dense_tiles::Tile<Problem> of() {
    return &amx_tile<Store, G>;
  }
};

// The problem with its rows from `p.from` copied into `copy`, padded with zero rows to a
// multiple of 32 and with zeros to a multiple of 32 values a row: the rows whose tiles would
// read past the `held` rows of a, or all of them when k is not a multiple of 32.
inline Problem stage(Problem p, std::vector<uint16_t>& copy) {
  p.from = p.k % kAmxStep == 0 ? p.held / kAmxRows * kAmxRows : 0;
  p.ld = (p.k + kAmxStep - 1) / kAmxStep * kAmxStep;
  const int64_t staged = std::max<int64_t>(0, p.m - p.from);
  copy.assign((staged + kAmxRows - 1) / kAmxRows * kAmxRows * p.ld, 0);
  for (int64_t r = p.from; r < p.m; ++r)
    std::memcpy(copy.data() + (r - p.from) * p.ld, p.a + r * p.k, p.k * 2);
  p.staged = copy.data();
  return p;
}

template <class Store>
void run_amx(const Problem& p) {
  thread_local std::vector<uint16_t> copy;
  const Problem staged = stage(p, copy);
  // about 256 KiB of bf16 activations per row block
  dense_tiles::run<Problem, Store, MakeAmx<Store>>(staged, p.m, p.n / 16, 2 * p.k, 256 * 1024,
                                                    64);
}
