// Per-head pieces of non-causal CAT shared by its two layouts (cat.cpp: the last axis
// contiguous; cat_sequence_last.cpp: the sequence axis contiguous): the scores' softmax in
// float64, the direct path's partner index, and the softmax Jacobian of the backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "subquad/cat.h"
#include "subquad/view.h"

namespace subquad::cat_detail {

// Below this N the direct gather beats the FFT path. Measured with subquad_cat_bench
// (BM_CatForward/direct vs BM_CatForward/fft, one thread, Dv = 64, CPU times, packed FFT
// path): 2.9 vs 3.6 us at N = 16, 7.5 vs 3.8 us at N = 32, 24.3 vs 6.0 us at N = 64.
constexpr int64_t kDirectMaxN = 24;

inline bool use_direct(CatPath path, int64_t N) {
  return path == CatPath::direct || (path == CatPath::automatic && N <= kDirectMaxN);
}

// e[n] = exp(z[b, n, h] - max_n z[b, n, h]), computed in double; returns sum_n e[n], so the
// softmax is e / total. z may have any strides.
template <typename T>
double exp_scores(View3<const T> z, int64_t b, int64_t h, T* e) {
  const int64_t N = z.shape[1];
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n < N; ++n) high = std::max(high, static_cast<double>(z(b, n, h)));
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double value = std::exp(static_cast<double>(z(b, n, h)) - high);
    e[n] = static_cast<T>(value);
    total += value;
  }
  return total;
}

// s[n] = softmax over n of z[b, n, h], computed in double.
template <typename T>
void softmax_scores(View3<const T> z, int64_t b, int64_t h, T* s) {
  const int64_t N = z.shape[1];
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n < N; ++n) high = std::max(high, static_cast<double>(z(b, n, h)));
  double total = 0;
  for (int64_t n = 0; n < N; ++n) total += std::exp(static_cast<double>(z(b, n, h)) - high);
  for (int64_t n = 0; n < N; ++n)
    s[n] = static_cast<T>(std::exp(static_cast<double>(z(b, n, h)) - high) / total);
}

// Index of the value that weight s[n] multiplies in row i: roll v[i + n], conv v[i - n].
inline int64_t partner(CatConvention convention, int64_t i, int64_t n, int64_t N) {
  const int64_t j = convention == CatConvention::roll ? i + n : i - n + N;
  return j >= N ? j - N : j;
}

// dz = s * (ds - <s, ds>): the softmax Jacobian applied to ds.
template <typename T>
void softmax_backward(const T* s, const double* ds, int64_t N, int64_t b, int64_t h, View3<T> dz) {
  double inner = 0;
  for (int64_t n = 0; n < N; ++n) inner += s[n] * ds[n];
  for (int64_t n = 0; n < N; ++n) dz(b, n, h) = static_cast<T>(s[n] * (ds[n] - inner));
}

}  // namespace subquad::cat_detail
