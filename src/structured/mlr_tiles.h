// Score tiles of MLR attention, shared by the fast forward and backward: for a pair of
// query and key tiles, the levels whose one block holds both tiles form a prefix 1..m
// (blocks nest), so their scores are one product over the first r_1 + ... + r_m columns of
// the pre-scaled queries; deeper levels that meet the pair only in part (blocks smaller than
// a tile) add small rectangles. Cost per tile pair: bq bk (r_1 + ... + r_m) plus the rectangles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "structured/mlr_levels.h"

namespace subquad::mlr {

struct TilePair {
  int64_t i0, i1, j0, j1;  // query rows [i0, i1), key rows [j0, j1)
  int64_t rows() const { return i1 - i0; }
  int64_t cols() const { return j1 - j0; }
};

// Number of levels whose single block contains every row and column of the pair.
inline int64_t covering_levels(const Levels& levels, const TilePair& tile) {
  int64_t m = 0;
  while (m < levels.count) {
    const int64_t s = levels.block_sizes[m], block = tile.i0 / s;
    if ((tile.i1 - 1) / s != block || tile.j0 / s != block || (tile.j1 - 1) / s != block) break;
    ++m;
  }
  return m;
}

// Calls f(level, r0, r1, c0, c1) for each level-l block (l >= first) that meets both the
// rows and the columns of the pair, with the intersected row and column ranges.
template <typename F>
void for_each_partial_block(const Levels& levels, int64_t first, const TilePair& tile, F&& f) {
  for (int64_t l = first; l < levels.count; ++l) {
    const int64_t s = levels.block_sizes[l];
    const int64_t lo = std::max(tile.i0 / s, tile.j0 / s);
    const int64_t hi = std::min((tile.i1 - 1) / s, (tile.j1 - 1) / s);
    if (lo > hi) return;  // no shared block here, hence none at the finer levels either
    for (int64_t block = lo; block <= hi; ++block)
      f(l, std::max(tile.i0, block * s), std::min(tile.i1, (block + 1) * s),
        std::max(tile.j0, block * s), std::min(tile.j1, (block + 1) * s));
  }
}

// How the scores of one pair are weighted under block_divide: uniformly by 1/m, or per
// entry (weights[r * ld + c]) when partial blocks give entries different level counts.
template <typename T>
struct TileWeights {
  int64_t covering = 0;
  bool per_entry = false;
  T uniform = T(1);
};

// scores [rows, ld] = sum over the levels shared by (i, j) of qs_l[i] . k_l[j], unweighted,
// with qs [rows, ldq] the tile's queries pre-multiplied by 1/r_l and kt [D, ldk] the key
// tile transposed (key j0 + c in column c). prefix(width) must write
// scores = qs[:, :width] kt[:width, :] (the covering levels); the levels met in part are
// added here, as vector loops along the keys. Returns the block_divide weights (weights
// [rows, ld] receives 1/count where it varies); the caller applies them and the causal mask.
template <typename T, typename Prefix>
TileWeights<T> form_scores(const Levels& levels, const MlrOptions& options, const TilePair& tile,
                           const T* qs, int64_t ldq, const T* kt, int64_t ldk, Prefix&& prefix,
                           T* scores, T* weights, int64_t ld) {
  TileWeights<T> result;
  result.covering = covering_levels(levels, tile);
  prefix(levels.offsets[result.covering]);
  bool partial = false;
  for_each_partial_block(levels, result.covering, tile,
                         [&](int64_t l, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                           if (options.block_divide && !partial)
                             std::fill(weights, weights + tile.rows() * ld, T(result.covering));
                           partial = true;
                           const int64_t begin = c0 - tile.j0, end = c1 - tile.j0;
                           for (int64_t i = r0; i < r1; ++i) {
                             const T* qrow = qs + (i - tile.i0) * ldq;
                             T* srow = scores + (i - tile.i0) * ld;
                             for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d) {
                               const T qd = qrow[d];
                               const T* kd = kt + d * ldk;
                               for (int64_t c = begin; c < end; ++c) srow[c] += qd * kd[c];
                             }
                             if (options.block_divide) {
                               T* wrow = weights + (i - tile.i0) * ld;
                               for (int64_t c = begin; c < end; ++c) wrow[c] += T(1);
                             }
                           }
                         });
  if (options.block_divide) {
    result.per_entry = partial;
    if (partial)
      for (int64_t e = 0; e < tile.rows() * ld; ++e) weights[e] = T(1) / weights[e];
    else
      result.uniform = T(1) / T(result.covering);
  }
  return result;
}

}  // namespace subquad::mlr
