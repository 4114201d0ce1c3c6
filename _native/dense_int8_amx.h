// The int8 dense kernel on AMX tiles: the arithmetic of dense_int8_kernel.h (and of
// `score_kernels/quant.py`), its int32 block sums from tile dot products.
//
// Included by dense_int8.cc after dense_int8_kernel.h, inside the AMX build's namespace, whose
// activation quantising and epilogues it uses. A tile call computes 32 rows by two 16-column
// groups: C tiles 0-3 (rows 0-15 and 16-31 by group 0 and 1) take A tiles 4-5 (the rows' signed
// q) times B tiles 6-7 (the groups' unsigned q + 128, already in the tiles' layout), 64 values
// of K a step. After each activation block's steps the C tiles go to memory, and each row's
// block sums, less the block's offset, are weighted by its scale into f32 totals, as the VNNI
// tile does. The quantised activations have room for a multiple of 32 rows and 64 bytes more,
// so every A tile reads inside them: what it reads past m rows or past a row's k values meets
// rows of C that are never stored, or zero rows of B.

constexpr int kAmxRows = 32;   // rows of a tile call: two A tiles
constexpr int kAmxStep = 64;   // values of K a tile dot product takes

using AmxF32 = F32Out<kAmxRows, 2>;
using AmxAdd = AddOut<kAmxRows, 2>;
using AmxQkv = QkvOut<kAmxRows, 2>;
template <int Act>
using AmxGated = GatedOut<kAmxRows, 2, Act>;
template <int Act>
using AmxAct = ActOut<kAmxRows, 2, Act>;

// The weights' B tile for K step [k0, k0 + 64) of a group (quads of K rows).
inline const void* b_rows(const Problem& p, const uint8_t* group_w, int64_t k0,
                          uint8_t (&tail)[16][64]) {
  return amx_tiles::b_rows(group_w + k0 / 4 * 64, (p.k - k0) / 4, tail);
}

// One activation block's int32 sums of rows [row, row + 32) by G groups into c (tiles stored).
template <int G>
inline void block_sums(const Problem& p, int64_t row, const uint8_t* w, int64_t b,
                       int32_t (&c)[2][G][16][16]) {
  const int64_t stride = p.k / 4 * 64;  // bytes of one group's weights
  const int8_t* a = p.q + row * p.k;
  uint8_t tail[G][16][64];
  amx_tiles::zero_c<G>();
  const int64_t k1 = std::min(p.k, (b + 1) * p.block);
  for (int64_t k0 = b * p.block; k0 < k1; k0 += kAmxStep) {
    _tile_loadd(4, a + k0, p.k);
    _tile_loadd(5, a + 16 * p.k + k0, p.k);
    _tile_loadd(6, b_rows(p, w, k0, tail[0]), 64);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(2, 5, 6);
    if (G > 1) {
      _tile_loadd(7, b_rows(p, w + stride, k0, tail[G - 1]), 64);
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(3, 5, 7);
    }
  }
  amx_tiles::store_c<G>(c);
}

// Rows [row, row + 32) (those below m) by the G groups from `group`, stored by `Store`.
template <class Store, int G>
void amx_tile(const Problem& p, int64_t row, int64_t group) {
  amx_tiles::configure(p.call);
  const int rows = int(std::min<int64_t>(kAmxRows, p.m - row));
  const uint8_t* w = p.w + group * (p.k / 4 * 64);
  alignas(64) float totals[kAmxRows][G][16];
  alignas(64) int32_t c[2][G][16][16];
  for (int64_t b = 0; b < p.blocks; ++b) {
    block_sums<G>(p, row, w, b, c);
    for (int r = 0; r < rows; ++r) {
      const VF s = set1_f(p.scales[(row + r) * p.blocks + b]);
      const VI offset = set1_i(p.offsets[(row + r) * p.blocks + b]);
      for (int g = 0; g < G; ++g) {
        const VF part = to_f(sub_i(load_i(c[r / 16][g][r % 16]), offset));
        store_f(totals[r][g], b == 0 ? mul_f(part, s) : fmadd(part, s, load_f(totals[r][g])));
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    VF sums[G];
    for (int g = 0; g < G; ++g) {
      sums[g] = mul_f(load_f(totals[r][g]), load_f(p.wscale + (group + g) * 16));
      asm("" : "+v"(sums[g]));  // rounded here: not contracted into the residual's add
    }
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

template <class Store>
void run_amx(const Problem& p) {
  const auto plan = dense_tiles::plan<Store>(p.m, p.n / 16, p.k, 128 * 1024, 64);
  dense_tiles::run<Problem, Store, MakeAmx<Store>>(
      p, plan, [&](int64_t r0, int64_t r1) -> const Problem& {
        for (int64_t r = r0; r < r1; ++r) quantize_row(p, r);
        return p;
      });
}
