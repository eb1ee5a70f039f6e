// Helpers shared by the CAT kernels (cat.cpp, cat_causal.cpp): boundary checks, per-thread
// workspaces, and the gather/scatter between a head's [N, Dv] slice of a [B, N, H, Dv] view
// and contiguous [Dv, N] rows that the FFT runs over.
#pragma once

#include <omp.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include "subquad/buffer.h"
#include "subquad/error.h"
#include "subquad/fft.h"
#include "subquad/view.h"

namespace subquad::cat_detail {

// Rows padded to a multiple of 64 bytes so every row of a batched transform is aligned.
template <typename T>
int64_t padded(int64_t count) {
  constexpr int64_t per_line = static_cast<int64_t>(kBufferAlignment / sizeof(T));
  return (count + per_line - 1) / per_line * per_line;
}

// z [B, N, H] and v [B, N, H, Dv] usable and consistent; every score finite (a NaN or inf
// score would turn the whole head into NaN through the softmax and the FFT).
template <typename T>
void check_scores_and_values(View3<const T> z, View4<const T> v) {
  check_view(z, "z");
  check_view(v, "v");
  check(z.shape[0] == v.shape[0] && z.shape[1] == v.shape[1] && z.shape[2] == v.shape[2],
        "z: expected shape [B, N, H] = ", shape_string(std::array<int64_t, 3>{
                                              v.shape[0], v.shape[1], v.shape[2]}),
        " to match v ", shape_string(v.shape), ", got ", shape_string(z.shape));
  for (int64_t b = 0; b < z.shape[0]; ++b)
    for (int64_t n = 0; n < z.shape[1]; ++n) {
      const T* row = z.row(b, n);
      for (int64_t h = 0; h < z.shape[2]; ++h)
        check(std::isfinite(row[h]), "z: scores must be finite, got ", row[h], " at [", b, ", ",
              n, ", ", h, "]");
    }
}

// check_shape with the expected shape in a non-deduced context (std::array's size_t extent
// does not deduce View's int rank).
template <typename T, int Rank>
void expect_shape(const View<T, Rank>& view, const typename View<T, Rank>::Shape& expected,
                  const char* name) {
  check_shape<T, Rank>(view, expected, name);
}

// One scratch buffer per thread of a parallel_for, indexed by omp_get_thread_num().
template <typename T>
class ThreadScratch {
 public:
  ThreadScratch(int threads, int64_t count) {
    buffers_.reserve(threads);
    for (int t = 0; t < threads; ++t) buffers_.push_back(Buffer<T>::uninitialized(count));
  }
  T* get() { return buffers_[omp_get_thread_num()].data(); }

 private:
  std::vector<Buffer<T>> buffers_;
};

// rows[c * distance + n] = source(b, n, h, c0 + c) for c < count, n < N (the head slice is
// read row by row, each row's `count` values contiguous).
template <typename S, typename T>
void gather_columns(View4<const S> source, int64_t b, int64_t h, int64_t c0, int64_t count,
                    int64_t distance, T* rows) {
  for (int64_t n = 0; n < source.shape[1]; ++n) {
    const S* row = source.row(b, n, h) + c0;
    for (int64_t c = 0; c < count; ++c) rows[c * distance + n] = static_cast<T>(row[c]);
  }
}

// target(b, n, h, c0 + c) = scale * rows[c * distance + n].
template <typename S, typename T>
void scatter_columns(const T* rows, int64_t distance, T scale, int64_t b, int64_t h, int64_t c0,
                     int64_t count, View4<S> target) {
  for (int64_t n = 0; n < target.shape[1]; ++n) {
    S* row = target.row(b, n, h) + c0;
    for (int64_t c = 0; c < count; ++c) row[c] = static_cast<S>(scale * rows[c * distance + n]);
  }
}

// Layout of `batch` contiguous padded rows of real length n.
template <typename T>
RealFftLayout row_layout(int64_t n, int64_t batch) {
  RealFftLayout layout;
  layout.n0 = n;
  layout.batch = batch;
  layout.real_distance = padded<T>(n);
  layout.complex_distance = padded<std::complex<T>>(n / 2 + 1);
  return layout;
}

}  // namespace subquad::cat_detail
