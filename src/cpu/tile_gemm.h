// Register-blocked tile products for the exact-attention kernels:
//   C[r, c] (+)= sum_k A(r, k) B[k, c],  A(r, k) = a[r * a_row + k * a_depth]
// A is read one scalar at a time (broadcast), so it may be any strided matrix (Q rows,
// or P read transposed); B rows are contiguous vectors. O(rows * cols * depth).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/simd.h"

namespace subquad::cpu {

// Accumulators: kTileRows x kTileVectors vectors plus kTileVectors loads of B and one
// broadcast fit in the 32 AVX-512 registers (16 with AVX2: fewer columns).
inline constexpr int kTileRows = 6;
inline constexpr int kTileVectors = kVectorBytes == 64 ? 4 : 2;

template <typename T, int R, int C>
void tile_kernel(int64_t depth, const T* a, int64_t a_row, int64_t a_depth, const T* b,
                 int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  using S = Simd<T>;
  using Vec = typename S::Vec;
  // Unrolled explicitly: otherwise GCC keeps acc in memory around the loop.
  Vec acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j)
      acc[r][j] = accumulate ? S::load(c + r * ldc + j * S::kLanes) : S::splat(T(0));
  for (int64_t k = 0; k < depth; ++k) {
    Vec row[C];
    for (int j = 0; j < C; ++j) row[j] = S::load(b + k * ldb + j * S::kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec x = S::splat(a[r * a_row + k * a_depth]);
      for (int j = 0; j < C; ++j) acc[r][j] += x * row[j];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) S::store(c + r * ldc + j * S::kLanes, acc[r][j]);
}

// One group of R rows across all columns: full column chunks, then the remainder.
template <typename T, int R>
void tile_rows(int64_t vectors, int64_t depth, const T* a, int64_t a_row, int64_t a_depth,
               const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  constexpr int lanes = Simd<T>::kLanes;
  int64_t v = 0;
  for (; v + kTileVectors <= vectors; v += kTileVectors)
    tile_kernel<T, R, kTileVectors>(depth, a, a_row, a_depth, b + v * lanes, ldb,
                                    c + v * lanes, ldc, accumulate);
  const int64_t rest = vectors - v;
  b += v * lanes;
  c += v * lanes;
  if (rest == 1) tile_kernel<T, R, 1>(depth, a, a_row, a_depth, b, ldb, c, ldc, accumulate);
  if constexpr (kTileVectors > 2) {
    if (rest == 2) tile_kernel<T, R, 2>(depth, a, a_row, a_depth, b, ldb, c, ldc, accumulate);
    if (rest == 3) tile_kernel<T, R, 3>(depth, a, a_row, a_depth, b, ldb, c, ldc, accumulate);
  }
}

template <typename T, int R = kTileRows>
void tile_rows_tail(int64_t rows, int64_t vectors, int64_t depth, const T* a, int64_t a_row,
                    int64_t a_depth, const T* b, int64_t ldb, T* c, int64_t ldc,
                    bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R)
      tile_rows<T, R>(vectors, depth, a, a_row, a_depth, b, ldb, c, ldc, accumulate);
    else
      tile_rows_tail<T, R - 1>(rows, vectors, depth, a, a_row, a_depth, b, ldb, c, ldc,
                               accumulate);
  }
}

// Depth is split into slices so that one slice of a column chunk of B (kDepthSlice x 64
// floats, 32 KiB) stays in L1 while every row group of A passes over it (128 measured
// slightly faster than 64 at D = 128: fewer reloads of the accumulators).
inline constexpr int64_t kDepthSlice = 128;

// C [rows, cols] (+)= A [rows, depth] B [depth, cols]; cols a multiple of the lane count,
// B and C rows hold at least cols elements. accumulate = false overwrites C.
template <typename T>
void tile_multiply(int64_t rows, int64_t cols, int64_t depth, const T* a, int64_t a_row,
                   int64_t a_depth, const T* b, int64_t ldb, T* c, int64_t ldc,
                   bool accumulate) {
  constexpr int64_t chunk = kTileVectors * Simd<T>::kLanes;
  for (int64_t k0 = 0; k0 < std::max<int64_t>(depth, 1); k0 += kDepthSlice) {
    const int64_t slice = std::min(kDepthSlice, depth - k0);
    const bool add = accumulate || k0 > 0;
    const T* a_slice = a + k0 * a_depth;
    const T* b_slice = b + k0 * ldb;
    for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
      const int64_t vectors = std::min(chunk, cols - c0) / Simd<T>::kLanes;
      int64_t r = 0;
      for (; r + kTileRows <= rows; r += kTileRows)
        tile_rows<T, kTileRows>(vectors, slice, a_slice + r * a_row, a_row, a_depth,
                                b_slice + c0, ldb, c + r * ldc + c0, ldc, add);
      if (r < rows)
        tile_rows_tail<T>(rows - r, vectors, slice, a_slice + r * a_row, a_row, a_depth,
                          b_slice + c0, ldb, c + r * ldc + c0, ldc, add);
    }
  }
}

}  // namespace subquad::cpu
