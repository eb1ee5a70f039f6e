// Naive references for WildCat, templated on the scalar type: Lambert W0 by bisection,
// dense Nyström weights H_SS^-1 H_S: of the exponential kernel (Gaussian elimination,
// O(r^3 + r^2 n)), the dense inverse of G_SS, and weighted attention with the denominator
// guard and the clamp (O(N r (D + Dv))). The fast paths are coreset.cpp and
// weighted_attention.cpp; exact attention's reference is src/exact/exact_ref.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace subquad::wildcat {

// W0(x) for x >= 0 by bisection on w e^w = x: slow, independent of lambert_w0's iteration.
inline double lambert_w0_bisection(double x) {
  double lo = 0.0, hi = std::max(1.0, std::log1p(x));  // w e^w is increasing on w >= 0
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (mid * std::exp(mid) < x ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Solves A X = Bm in place for square A [r, r] and Bm [r, cols] (row-major), by Gaussian
// elimination with partial pivoting. Returns X in Bm.
template <typename T>
void solve_dense(std::vector<T> a, std::vector<T>& rhs, int64_t r, int64_t cols) {
  for (int64_t p = 0; p < r; ++p) {
    int64_t best = p;
    for (int64_t i = p + 1; i < r; ++i)
      if (std::abs(a[i * r + p]) > std::abs(a[best * r + p])) best = i;
    for (int64_t j = 0; j < r; ++j) std::swap(a[p * r + j], a[best * r + j]);
    for (int64_t j = 0; j < cols; ++j) std::swap(rhs[p * cols + j], rhs[best * cols + j]);
    for (int64_t i = p + 1; i < r; ++i) {
      const T factor = a[i * r + p] / a[p * r + p];
      for (int64_t j = p; j < r; ++j) a[i * r + j] -= factor * a[p * r + j];
      for (int64_t j = 0; j < cols; ++j) rhs[i * cols + j] -= factor * rhs[p * cols + j];
    }
  }
  for (int64_t p = r - 1; p >= 0; --p) {
    for (int64_t j = 0; j < cols; ++j) {
      T sum = rhs[p * cols + j];
      for (int64_t i = p + 1; i < r; ++i) sum -= a[p * r + i] * rhs[i * cols + j];
      rhs[p * cols + j] = sum / a[p * r + p];
    }
  }
}

// <kt_i, kt_j> for scaled keys kt [n, D].
template <typename T>
T dot_rows(const std::vector<T>& kt, int64_t D, int64_t i, int64_t j) {
  T sum = 0;
  for (int64_t e = 0; e < D; ++e) sum += kt[i * D + e] * kt[j * D + e];
  return sum;
}

// G_SS^-1 [r, r] for the Gaussian kernel G(i, j) = exp(<kt_i, kt_j> - sq_i/2 - sq_j/2).
template <typename T>
std::vector<T> gaussian_inverse_reference(const std::vector<T>& kt, int64_t D,
                                          const std::vector<int64_t>& pivots) {
  const auto r = static_cast<int64_t>(pivots.size());
  std::vector<T> g(static_cast<size_t>(r * r)), inverse(static_cast<size_t>(r * r), T(0));
  for (int64_t i = 0; i < r; ++i) {
    inverse[i * r + i] = 1;
    for (int64_t j = 0; j < r; ++j) {
      const int64_t a = pivots[i], b = pivots[j];
      g[i * r + j] =
          std::exp(dot_rows(kt, D, a, b) - dot_rows(kt, D, a, a) / 2 - dot_rows(kt, D, b, b) / 2);
    }
  }
  solve_dense(g, inverse, r, r);
  return inverse;
}

// Compressed values [r, Dv + 1]: W [V, 1] with W = H_SS^-1 H_S: for the exponential kernel
// H(i, j) = exp(<kt_i, kt_j>), scaled keys kt [n, D], values [n, Dv].
template <typename T>
std::vector<T> nystrom_values_reference(const std::vector<T>& kt, int64_t D,
                                        const std::vector<T>& values, int64_t Dv,
                                        const std::vector<int64_t>& pivots) {
  const auto r = static_cast<int64_t>(pivots.size());
  const auto n = static_cast<int64_t>(kt.size()) / D;
  std::vector<T> h_ss(static_cast<size_t>(r * r)), h_s(static_cast<size_t>(r * n));
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < r; ++j)
      h_ss[i * r + j] = std::exp(dot_rows(kt, D, pivots[i], pivots[j]));
    for (int64_t l = 0; l < n; ++l) h_s[i * n + l] = std::exp(dot_rows(kt, D, pivots[i], l));
  }
  solve_dense(h_ss, h_s, r, n);  // h_s <- W
  std::vector<T> out(static_cast<size_t>(r * (Dv + 1)), T(0));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t l = 0; l < n; ++l) {
      for (int64_t c = 0; c < Dv; ++c) out[i * (Dv + 1) + c] += h_s[i * n + l] * values[l * Dv + c];
      out[i * (Dv + 1) + Dv] += h_s[i * n + l];
    }
  return out;
}

// Weighted attention: q [N, D], keys [r, D], log scales [r], weighted values [r, Dv + 1]
// (w last), vmin / vmax [Dv] -> out [N, Dv]; entry s weighs e^{beta q.k_s + log_scales[s]};
// rows whose denominator is <= relative_floor * sum_s p_s |w_s| output 0, then every output
// is clamped to [vmin, vmax].
template <typename T>
std::vector<T> weighted_attention_reference(const std::vector<T>& q, int64_t D,
                                            const std::vector<T>& keys,
                                            const std::vector<T>& log_scales,
                                            const std::vector<T>& weighted_values, int64_t Dv,
                                            T beta, const std::vector<T>& vmin,
                                            const std::vector<T>& vmax, T relative_floor) {
  const auto N = static_cast<int64_t>(q.size()) / D;
  const auto r = static_cast<int64_t>(keys.size()) / D;
  std::vector<T> out(static_cast<size_t>(N * Dv), T(0)), scores(static_cast<size_t>(r));
  for (int64_t i = 0; i < N; ++i) {
    T row_max = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < r; ++j) {
      T s = 0;
      for (int64_t e = 0; e < D; ++e) s += q[i * D + e] * keys[j * D + e];
      scores[j] = beta * s + log_scales[j];
      row_max = std::max(row_max, scores[j]);
    }
    std::vector<T> sum(static_cast<size_t>(Dv + 1), T(0));
    T abs_sum = 0;
    if (row_max > -std::numeric_limits<T>::infinity()) {
      for (int64_t j = 0; j < r; ++j) {
        const T p = std::exp(scores[j] - row_max);
        for (int64_t c = 0; c <= Dv; ++c) sum[c] += p * weighted_values[j * (Dv + 1) + c];
        abs_sum += p * std::abs(weighted_values[j * (Dv + 1) + Dv]);
      }
    }
    for (int64_t c = 0; c < Dv; ++c) {
      const T value = sum[Dv] > relative_floor * abs_sum ? sum[c] / sum[Dv] : T(0);
      out[i * Dv + c] = std::clamp(value, vmin[c], vmax[c]);
    }
  }
  return out;
}

}  // namespace subquad::wildcat
