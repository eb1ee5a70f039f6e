// Helpers shared by the CAT kernels (cat.cpp, cat_causal.cpp): boundary checks, per-thread
// workspaces, and the gather/scatter between a head's [N, Dv] slice of a [B, N, H, Dv] view
// and contiguous [Dv, N] rows that the FFT runs over.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/buffer.h"
#include "common/fft.h"
#include "common/workspace_frame.h"
#include "cpu/column_pairs.h"
#include "cpu/transpose.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad::cat_detail {

// Rows padded to a multiple of 64 bytes so every row of a batched transform is aligned.
template <typename T>
int64_t padded(int64_t count) {
  constexpr int64_t per_line = static_cast<int64_t>(kBufferAlignment / sizeof(T));
  return (count + per_line - 1) / per_line * per_line;
}

// Distance between the rows of a batch: padded, and an odd number of cache lines, so that
// the gather's writes to `batch` rows at once do not all map to one L1 set (rows a power of
// two apart did: the non-causal forward ran 3x slower from N = 1024 on).
template <typename T>
int64_t row_distance(int64_t count) {
  constexpr int64_t per_line = static_cast<int64_t>(kBufferAlignment / sizeof(T));
  const int64_t distance = padded<T>(count);
  return (distance / per_line) % 2 ? distance : distance + per_line;
}

// z [B, N, H] shaped like v [B, N, H, Dv]'s leading dimensions.
template <typename T>
void check_scores_match_values(View3<const T> z, View4<const T> v) {
  check(z.shape[0] == v.shape[0] && z.shape[1] == v.shape[1] && z.shape[2] == v.shape[2],
        "z: expected shape [B, N, H] = ",
        shape_text(std::array<int64_t, 3>{v.shape[0], v.shape[1], v.shape[2]}), " to match v ",
        shape_text(v.shape), ", got ", shape_text(z.shape));
}

// z [B, N, H] and v [B, N, H, Dv] usable and consistent. Values are not scanned: a
// non-finite score or value propagates (docs/conventions.md, "Non-finite inputs").
template <typename T>
void check_scores_and_values(View3<const T> z, View4<const T> v) {
  check_view(z, "z");
  check_view(v, "v");
  check_scores_match_values(z, v);
}

// check_shape with the expected shape in a non-deduced context (std::array's size_t extent
// does not deduce View's int rank).
template <typename T, int Rank>
void expect_shape(const View<T, Rank>& view, const typename View<T, Rank>::Shape& expected,
                  const char* name) {
  check_shape<T, Rank>(view, expected, name);
}

// The backward's views: dout and dv shaped like v, dz like z.
template <typename T>
void check_gradient_views(View3<const T> z, View4<const T> v, View4<const T> dout, View3<T> dz,
                          View4<T> dv) {
  check_view(dout, "dout");
  expect_shape(dout, v.shape, "dout");
  check_view(dz, "dz");
  expect_shape(dz, z.shape, "dz");
  check_view(dv, "dv");
  expect_shape(dv, v.shape, "dv");
}

// One scratch block per thread of a parallel_for, indexed by omp_get_thread_num(), taken
// from the call's workspace frame (Context::workspace: no allocation on repeated calls).
template <typename T>
class ThreadScratch {
 public:
  ThreadScratch(WorkspaceFrame& frame, int threads, int64_t count)
      : stride_(padded<T>(count)), base_(frame.take<T>(threads * stride_)) {}
  T* get() { return base_ + omp_get_thread_num() * stride_; }

 private:
  int64_t stride_;  // elements between threads' blocks, whole cache lines
  T* base_;         // [threads, stride_]
};

// rows[c * distance + p] = source(b, j0 + p, h, c0 + c) for c < count, p < length: a head's
// [length, count] slice, read row by row, moved to contiguous rows in 8 x 8 tiles (scalar
// stores to `count` rows per token ran slower than the transforms).
template <typename S, typename T>
void gather_columns(View4<const S> source, int64_t b, int64_t h, int64_t j0, int64_t length,
                    int64_t c0, int64_t count, int64_t distance, T* rows) {
  const S* src[kTransposeTile];
  T* dst[kTransposeTile];
  for (int64_t p0 = 0; p0 < length; p0 += kTransposeTile) {
    const int64_t tile_rows = std::min(kTransposeTile, length - p0);
    for (int64_t k0 = 0; k0 < count; k0 += kTransposeTile) {
      const int64_t tile_cols = std::min(kTransposeTile, count - k0);
      for (int64_t r = 0; r < tile_rows; ++r) src[r] = source.row(b, j0 + p0 + r, h) + c0 + k0;
      for (int64_t r = p0 + kPrefetchTokens; r < std::min(length, p0 + kPrefetchTokens + tile_rows);
           ++r)
        prefetch_segment(source.row(b, j0 + r, h) + c0 + k0, tile_cols * sizeof(S), false);
      for (int64_t k = 0; k < tile_cols; ++k) dst[k] = rows + (k0 + k) * distance + p0;
      transpose_tile(src, dst, tile_rows, tile_cols, T(1));
    }
  }
}

// target(b, n, h, c0 + c) = scale * rows[c * distance + n] for n < N, c < count. Tokens in
// the outer loop: the tiles of one token's `count` channels are written back to back, so a
// cache line of the target is completed while it is still in L1 (channels outer wrote half
// lines and, once the target left L2, read and wrote every line twice: 2x slower at N = 16384).
template <typename S, typename T>
void scatter_columns(const T* rows, int64_t distance, T scale, int64_t b, int64_t h, int64_t c0,
                     int64_t count, View4<S> target) {
  const T* src[kTransposeTile];
  S* dst[kTransposeTile];
  for (int64_t n0 = 0; n0 < target.shape[1]; n0 += kTransposeTile) {
    const int64_t tile_cols = std::min(kTransposeTile, target.shape[1] - n0);
    for (int64_t k0 = 0; k0 < count; k0 += kTransposeTile) {
      const int64_t tile_rows = std::min(kTransposeTile, count - k0);
      for (int64_t r = 0; r < tile_rows; ++r) src[r] = rows + (k0 + r) * distance + n0;
      for (int64_t k = 0; k < tile_cols; ++k) dst[k] = target.row(b, n0 + k, h) + c0 + k0;
      for (int64_t k = n0 + kPrefetchTokens;
           k < std::min(target.shape[1], n0 + kPrefetchTokens + tile_cols); ++k)
        prefetch_segment(target.row(b, k, h) + c0 + k0, tile_rows * sizeof(S), true);
      transpose_tile(src, dst, tile_rows, tile_cols, static_cast<S>(scale));
    }
  }
}

// Column pairs of a head as complex rows (see cpu/column_pairs.h): rows[p * distance + n]
// = source(b, n, h, c0 + 2p) + i source(b, n, h, c0 + 2p + 1), for p < (count + 1) / 2.
template <typename T>
void gather_column_pairs(View4<const T> source, int64_t b, int64_t h, int64_t c0, int64_t count,
                         int64_t distance, std::complex<T>* rows) {
  subquad::gather_column_pairs(
      [&](int64_t n) { return source.row(b, n, h) + c0; }, source.shape[1], count, distance, rows);
}

// The inverse move, into target(b, :, h, c0 : c0 + count).
template <typename T>
void scatter_column_pairs(const std::complex<T>* rows, int64_t distance, int64_t b, int64_t h,
                          int64_t c0, int64_t count, View4<T> target) {
  subquad::scatter_column_pairs(rows, distance, target.shape[1], count,
                                [&](int64_t n) { return target.row(b, n, h) + c0; });
}

// Spectral products written out in real arithmetic: std::complex's operator* handles
// inf/NaN corner cases through a library call per element (no -ffast-math here), which cost
// more than the transforms themselves (non-finite inputs become NaN, as propagation asks).
// x[f] = x[f] * conj?(y[f]) for f < count.
template <typename T>
void multiply_spectrum(std::complex<T>* x, const std::complex<T>* y, int64_t count,
                       bool conjugate_y) {
  T* a = reinterpret_cast<T*>(x);
  const T* b = reinterpret_cast<const T*>(y);
  const T sign = conjugate_y ? T(-1) : T(1);
#pragma omp simd
  for (int64_t f = 0; f < count; ++f) {
    const T ar = a[2 * f], ai = a[2 * f + 1], br = b[2 * f], bi = sign * b[2 * f + 1];
    a[2 * f] = ar * br - ai * bi;
    a[2 * f + 1] = ar * bi + ai * br;
  }
}

// x[f] = scale * conj?(x[f]) for f < count.
template <typename T>
void scale_spectrum(std::complex<T>* x, int64_t count, T scale, bool conjugate) {
  T* a = reinterpret_cast<T*>(x);
  const T imaginary_scale = conjugate ? -scale : scale;
#pragma omp simd
  for (int64_t f = 0; f < count; ++f) {
    a[2 * f] *= scale;
    a[2 * f + 1] *= imaginary_scale;
  }
}

// acc[f] += conj(x[f]) * y[f] for f < count.
template <typename T, typename A>
void accumulate_conj_product(std::complex<A>* acc, const std::complex<T>* x,
                             const std::complex<T>* y, int64_t count) {
  A* s = reinterpret_cast<A*>(acc);
  const T* a = reinterpret_cast<const T*>(x);
  const T* b = reinterpret_cast<const T*>(y);
#pragma omp simd
  for (int64_t f = 0; f < count; ++f) {
    const T ar = a[2 * f], ai = a[2 * f + 1], br = b[2 * f], bi = b[2 * f + 1];
    s[2 * f] += ar * br + ai * bi;
    s[2 * f + 1] += ar * bi - ai * br;
  }
}

// x[f] = x[f] * y[f] for f < n, where y is the spectrum of a real signal given by its half
// y[0 .. n / 2] (y[n - f] = conj(y[f])): the filter stays half the size in cache.
template <typename T>
void multiply_by_real_spectrum(std::complex<T>* x, const std::complex<T>* y, int64_t n) {
  multiply_spectrum(x, y, n / 2 + 1, /*conjugate_y=*/false);
  T* a = reinterpret_cast<T*>(x);
  const T* b = reinterpret_cast<const T*>(y);
#pragma omp simd
  for (int64_t g = 1; g < (n + 1) / 2; ++g) {
    const int64_t f = n - g;
    const T ar = a[2 * f], ai = a[2 * f + 1], br = b[2 * g], bi = -b[2 * g + 1];
    a[2 * f] = ar * br - ai * bi;
    a[2 * f + 1] = ar * bi + ai * br;
  }
}

// One complex signal of length n, out of place: the transform of one packed column pair.
inline ComplexFftLayout complex_row_layout(int64_t n) {
  ComplexFftLayout layout;
  layout.n0 = n;
  return layout;
}

// Layout of `batch` contiguous padded rows of real length n.
template <typename T>
RealFftLayout row_layout(int64_t n, int64_t batch) {
  RealFftLayout layout;
  layout.n0 = n;
  layout.batch = batch;
  layout.real_distance = row_distance<T>(n);
  layout.complex_distance = row_distance<std::complex<T>>(n / 2 + 1);
  return layout;
}

}  // namespace subquad::cat_detail
