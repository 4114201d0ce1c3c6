// The register-tile table and cache blocking the dense kernels share (dense.cc, dense_int8.cc,
// dense_f32.cc).
//
// A kernel brings its Problem, a Store (the epilogue, with its largest tile kRows x kGroups) and
// Make, whose `of<R, G>()` is its function computing R rows by G 16-column groups from
// (problem, first row, first group). `run` covers an m x (16 groups) output with such tiles on
// the thread pool.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "cpu_pool.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dense_tiles {

// f32 outputs at least this large are written with streaming stores, past the caches: they
// cannot stay cached for their reader anyway, and an ordinary store first reads every line it
// writes from memory (measured: the int8 kernel 5-7% faster at 11,264 x 576 and x 960).
constexpr int64_t kStreamBytes = int64_t(16) << 20;

// Whether an f32 output of `bytes` at `out` (rows of 16-float groups) is streamed.
inline bool streams(const void* out, int64_t bytes) {
  return bytes >= kStreamBytes && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
}

template <class Problem>
using Tile = void (*)(const Problem&, int64_t, int64_t);

// Tiles<...>::get(r, g) computes r rows by g groups, for every r and g up to the tile size.
template <class Problem, class Store, class Make>
struct Tiles {
  template <int G, int... R>
  static constexpr std::array<Tile<Problem>, sizeof...(R)> rows(std::integer_sequence<int, R...>) {
    return {Make::template of<R + 1, G>()...};
  }
  template <int... G>
  static constexpr auto table(std::integer_sequence<int, G...>) {
    return std::array<std::array<Tile<Problem>, Store::kRows>, sizeof...(G)>{
        rows<G + 1>(std::make_integer_sequence<int, Store::kRows>{})...};
  }
  static Tile<Problem> get(int r, int g) {
    static const auto TABLE = table(std::make_integer_sequence<int, Store::kGroups>{});
    return TABLE[g - 1][r - 1];
  }
};

// Rows [r0, r1) by column panels [p0, p1) of Store::kGroups groups: each panel of weights stays
// in cache while the rows' register tiles stream past it.
template <class Problem, class Store, class Make>
void block(const Problem& p, int64_t groups, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t g0 = panel * Store::kGroups;
    const int g = int(std::min<int64_t>(Store::kGroups, groups - g0));
    for (int64_t r = r0; r < r1; r += Store::kRows) {
      const int rows = int(std::min<int64_t>(Store::kRows, r1 - r));
      Tiles<Problem, Store, Make>::get(rows, g)(p, r, g0);
    }
  }
}

// How `run` covers m rows by `groups` groups: rows in blocks of about `block_bytes` of
// activations (`row_bytes` a row, at most `max_tiles` tiles high), beside one weight panel in L2;
// small batches split the columns too, so every thread has work.
struct Plan {
  int64_t m, groups, panels, block_rows, row_blocks, splits;
};

template <class Store>
Plan plan(int64_t m, int64_t groups, int64_t row_bytes, int64_t block_bytes, int64_t max_tiles) {
  const int64_t panels = (groups + Store::kGroups - 1) / Store::kGroups;
  const int64_t block_rows = std::clamp<int64_t>(
      (block_bytes / row_bytes) / Store::kRows * Store::kRows, Store::kRows,
      max_tiles * Store::kRows);
  const int64_t row_blocks = (m + block_rows - 1) / block_rows;
  const int64_t wanted = 4 * native_cpu::thread_count();
  const int64_t splits = std::clamp<int64_t>((wanted + row_blocks - 1) / row_blocks, 1, panels);
  return {m, groups, panels, block_rows, row_blocks, splits};
}

// All rows by all groups as `plan` says. `prepare(r0, r1)` readies rows [r0, r1) before any tile
// reads them and returns the problem those tiles take: inside each row block's work item, while
// its rows are in cache, when the columns are not split; in a pass of its own before the tiles
// when they are (the tiles then take `p`).
template <class Problem, class Store, class Make, class Prepare>
void run(const Problem& p, const Plan& plan, const Prepare& prepare) {
  const int64_t m = plan.m, splits = plan.splits;
  if (splits > 1) {
    constexpr int64_t kRowsPerItem = 16;
    native_cpu::parallel_for(int((m + kRowsPerItem - 1) / kRowsPerItem), [&](int item) {
      prepare(item * kRowsPerItem, std::min(m, (item + 1) * kRowsPerItem));
    });
  }
  native_cpu::parallel_for(int(plan.row_blocks * splits), [&](int item) {
    const int64_t rb = item / splits, s = item % splits;
    const int64_t r0 = rb * plan.block_rows, r1 = std::min(m, r0 + plan.block_rows);
    const int64_t p0 = s * plan.panels / splits, p1 = (s + 1) * plan.panels / splits;
    if (splits == 1) {
      block<Problem, Store, Make>(prepare(r0, r1), plan.groups, r0, r1, p0, p1);
    } else {
      block<Problem, Store, Make>(p, plan.groups, r0, r1, p0, p1);
    }
#if defined(__x86_64__)
    _mm_sfence();  // streamed stores land before the item counts as done
#endif
  });
}

// `run` with rows that need no preparing.
template <class Problem, class Store, class Make>
void run(const Problem& p, int64_t m, int64_t groups, int64_t row_bytes, int64_t block_bytes,
         int64_t max_tiles) {
  run<Problem, Store, Make>(p, plan<Store>(m, groups, row_bytes, block_bytes, max_tiles),
                            [&](int64_t, int64_t) -> const Problem& { return p; });
}

}  // namespace dense_tiles
