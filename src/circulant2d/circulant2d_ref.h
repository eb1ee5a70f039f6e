// Dense 2D circulant attention, forward and backward, templated on float/double: the oracle
// of the FFT path (circulant2d.cpp). Per (b, h) it builds the N x N logits Q K^T, projects
// them onto BCCB matrices (sums along each 2D circulant diagonal), builds the N x N BCCB
// attention matrix A[i, j] = s[j (-) i] explicitly and multiplies. O(N^2 (D + Dv)) per head.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "subquad/view.h"

namespace subquad::reference {

// Flat token index of n (+) m (sign = +1) or n (-) m (sign = -1) on an Hg x Wg torus.
inline int64_t torus_shift(int64_t n, int64_t m, int sign, int64_t Hg, int64_t Wg) {
  const int64_t row = ((n / Wg + sign * (m / Wg)) % Hg + Hg) % Hg;
  const int64_t col = ((n % Wg + sign * (m % Wg)) % Wg + Wg) % Wg;
  return row * Wg + col;
}

// x[b, :, :, h, :] as a dense row-major [N, C] matrix.
template <typename T>
std::vector<T> head_matrix(View5<const T> x, int64_t b, int64_t h) {
  const int64_t Hg = x.dim(1), Wg = x.dim(2), C = x.dim(4);
  std::vector<T> m(static_cast<size_t>(Hg * Wg * C));
  for (int64_t i = 0; i < Hg; ++i)
    for (int64_t j = 0; j < Wg; ++j)
      for (int64_t c = 0; c < C; ++c) m[(i * Wg + j) * C + c] = x(b, i, j, h, c);
  return m;
}

template <typename T>
void store_head_matrix(const std::vector<T>& m, int64_t b, int64_t h, View5<T> x) {
  const int64_t Hg = x.dim(1), Wg = x.dim(2), C = x.dim(4);
  for (int64_t i = 0; i < Hg; ++i)
    for (int64_t j = 0; j < Wg; ++j)
      for (int64_t c = 0; c < C; ++c) x(b, i, j, h, c) = m[(i * Wg + j) * C + c];
}

// Dense product [N, N] x [N, C] (transpose_a: A^T x).
template <typename T>
std::vector<T> dense_apply(const std::vector<T>& a, const std::vector<T>& x, int64_t N,
                           int64_t C, bool transpose_a) {
  std::vector<T> y(static_cast<size_t>(N * C), T(0));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const T w = transpose_a ? a[j * N + i] : a[i * N + j];
      for (int64_t c = 0; c < C; ++c) y[i * C + c] += w * x[j * C + c];
    }
  return y;
}

// The softmax weights s [N] of head (b, h): a[m] = c * sum_n (Q K^T)[n, n (+) m].
template <typename T>
std::vector<T> circulant2d_weights(View5<const T> q, View5<const T> k, int64_t b, int64_t h,
                                   T scale) {
  const int64_t Hg = q.dim(1), Wg = q.dim(2), D = q.dim(4), N = Hg * Wg;
  const std::vector<T> qm = head_matrix(q, b, h), km = head_matrix(k, b, h);
  std::vector<T> logits(static_cast<size_t>(N * N));  // Q K^T [N, N]
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < N; ++p) {
      T dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += qm[n * D + d] * km[p * D + d];
      logits[n * N + p] = dot;
    }
  std::vector<T> s(static_cast<size_t>(N), T(0));
  for (int64_t m = 0; m < N; ++m) {
    for (int64_t n = 0; n < N; ++n) s[m] += logits[n * N + torus_shift(n, m, +1, Hg, Wg)];
    s[m] *= scale;
  }
  const T max = *std::max_element(s.begin(), s.end());
  T sum = 0;
  for (T& x : s) sum += (x = std::exp(x - max));
  for (T& x : s) x /= sum;
  return s;
}

// The BCCB matrix [N, N] with A[i, j] = first_row[j (-) i].
template <typename T>
std::vector<T> bccb_matrix(const std::vector<T>& first_row, int64_t Hg, int64_t Wg) {
  const int64_t N = Hg * Wg;
  std::vector<T> a(static_cast<size_t>(N * N));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j) a[i * N + j] = first_row[torus_shift(j, i, -1, Hg, Wg)];
  return a;
}

// q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv]; weights
// [B, H, Hg, Wg] may be empty. No input checks: callers pass consistent shapes.
template <typename T>
void circulant2d_forward(View5<const T> q, View5<const T> k, View5<const T> v, T scale,
                         View5<T> out, View4<T> weights) {
  const int64_t B = q.dim(0), Hg = q.dim(1), Wg = q.dim(2), H = q.dim(3), Dv = v.dim(4);
  const int64_t N = Hg * Wg;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<T> s = circulant2d_weights(q, k, b, h, scale);
      if (!weights.empty())
        for (int64_t n = 0; n < N; ++n) weights(b, h, n / Wg, n % Wg) = s[n];
      const std::vector<T> a = bccb_matrix(s, Hg, Wg);
      store_head_matrix(dense_apply(a, head_matrix(v, b, h), N, Dv, false), b, h, out);
    }
}

// Gradients of sum(out * dout) with respect to q, k, v (all overwritten).
template <typename T>
void circulant2d_backward(View5<const T> q, View5<const T> k, View5<const T> v,
                          View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                          View5<T> dv) {
  const int64_t B = q.dim(0), Hg = q.dim(1), Wg = q.dim(2), H = q.dim(3), D = q.dim(4);
  const int64_t Dv = v.dim(4), N = Hg * Wg;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<T> s = circulant2d_weights(q, k, b, h, scale);
      const std::vector<T> vm = head_matrix(v, b, h), gm = head_matrix(dout, b, h);
      // out = A v: dv = A^T dout, dA[i, j] = <dout[i], v[j]>.
      store_head_matrix(dense_apply(bccb_matrix(s, Hg, Wg), gm, N, Dv, true), b, h, dv);
      // A[i, j] = s[j (-) i]: ds[m] = sum_i dA[i, i (+) m].
      std::vector<T> ds(static_cast<size_t>(N), T(0));
      for (int64_t i = 0; i < N; ++i)
        for (int64_t m = 0; m < N; ++m) {
          const int64_t j = torus_shift(i, m, +1, Hg, Wg);
          T dot = 0;
          for (int64_t c = 0; c < Dv; ++c) dot += gm[i * Dv + c] * vm[j * Dv + c];
          ds[m] += dot;
        }
      // s = softmax(a): da = s * (ds - <s, ds>).
      T s_dot_ds = 0;
      for (int64_t m = 0; m < N; ++m) s_dot_ds += s[m] * ds[m];
      std::vector<T> da(static_cast<size_t>(N));
      for (int64_t m = 0; m < N; ++m) da[m] = s[m] * (ds[m] - s_dot_ds);
      // a[m] = c sum_n (Q K^T)[n, n (+) m]: the logit gradient G = c * BCCB(da),
      // G[n, p] = c da[p (-) n]; dq = G k, dk = G^T q.
      for (T& x : da) x *= scale;
      const std::vector<T> g = bccb_matrix(da, Hg, Wg);
      store_head_matrix(dense_apply(g, head_matrix(k, b, h), N, D, false), b, h, dq);
      store_head_matrix(dense_apply(g, head_matrix(q, b, h), N, D, true), b, h, dk);
    }
}

}  // namespace subquad::reference
