// Dense references for CAT: each builds the N x N attention matrix of a head explicitly
// (circulant of softmax(z), or the causal lag matrix) and multiplies, O(N^2 Dv) per head.
// Contiguous std::vector tensors, templated on the scalar: the float64 instance is the
// truth every fast path is tested against; the float32 instance sets the tolerances.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "subquad/cat.h"

namespace subquad::reference {

struct CatShape {
  int64_t B, N, H, Dv;
};

// softmax over n of z[b, n, h]: s [N].
template <typename T>
std::vector<T> cat_scores_softmax(const std::vector<T>& z, const CatShape& d, int64_t b,
                                  int64_t h) {
  std::vector<T> s(d.N);
  T high = -std::numeric_limits<T>::infinity();
  for (int64_t n = 0; n < d.N; ++n) high = std::max(high, z[(b * d.N + n) * d.H + h]);
  T total = 0;
  for (int64_t n = 0; n < d.N; ++n) total += s[n] = std::exp(z[(b * d.N + n) * d.H + h] - high);
  for (T& x : s) x /= total;
  return s;
}

// A [N, N] of one head: roll A[i, j] = s[(j - i) mod N], conv A[i, j] = s[(i - j) mod N].
template <typename T>
std::vector<T> cat_matrix(const std::vector<T>& s, CatConvention convention) {
  const int64_t N = static_cast<int64_t>(s.size());
  std::vector<T> A(N * N);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const int64_t lag = convention == CatConvention::roll ? j - i : i - j;
      A[i * N + j] = s[((lag % N) + N) % N];
    }
  return A;
}

// Causal lag matrix P [N, N] of one head: P[i, j] = exp(z[i - j]) / sum_{k <= i} exp(z[k])
// for j <= i, else 0 (value j is weighted by the score of token i - j).
template <typename T>
std::vector<T> cat_causal_matrix(const std::vector<T>& z, const CatShape& d, int64_t b,
                                 int64_t h) {
  const int64_t N = d.N;
  std::vector<T> P(N * N, T(0));
  auto score = [&](int64_t k) { return z[(b * N + k) * d.H + h]; };
  for (int64_t i = 0; i < N; ++i) {
    T high = -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; k <= i; ++k) high = std::max(high, score(k));
    T total = 0;
    for (int64_t k = 0; k <= i; ++k) total += std::exp(score(k) - high);
    for (int64_t j = 0; j <= i; ++j) P[i * N + j] = std::exp(score(i - j) - high) / total;
  }
  return P;
}

// out[b, :, h] = A v[b, :, h] for the head's matrix A.
template <typename T>
void apply_head(const std::vector<T>& A, const std::vector<T>& v, const CatShape& d, int64_t b,
                int64_t h, std::vector<T>& out) {
  for (int64_t i = 0; i < d.N; ++i)
    for (int64_t c = 0; c < d.Dv; ++c) {
      T total = 0;
      for (int64_t j = 0; j < d.N; ++j)
        total += A[i * d.N + j] * v[((b * d.N + j) * d.H + h) * d.Dv + c];
      out[((b * d.N + i) * d.H + h) * d.Dv + c] = total;
    }
}

// dv[b, :, h] = A^T dout[b, :, h] and dA[i, j] = <dout[i], v[j]>.
template <typename T>
std::vector<T> apply_head_backward(const std::vector<T>& A, const std::vector<T>& v,
                                   const std::vector<T>& dout, const CatShape& d, int64_t b,
                                   int64_t h, std::vector<T>& dv) {
  auto at = [&](const std::vector<T>& x, int64_t n, int64_t c) -> T {
    return x[((b * d.N + n) * d.H + h) * d.Dv + c];
  };
  std::vector<T> dA(d.N * d.N);
  for (int64_t i = 0; i < d.N; ++i)
    for (int64_t j = 0; j < d.N; ++j) {
      T total = 0;
      for (int64_t c = 0; c < d.Dv; ++c) total += at(dout, i, c) * at(v, j, c);
      dA[i * d.N + j] = total;
    }
  for (int64_t j = 0; j < d.N; ++j)
    for (int64_t c = 0; c < d.Dv; ++c) {
      T total = 0;
      for (int64_t i = 0; i < d.N; ++i) total += A[i * d.N + j] * at(dout, i, c);
      dv[((b * d.N + j) * d.H + h) * d.Dv + c] = total;
    }
  return dA;
}

template <typename T>
std::vector<T> cat_forward(const std::vector<T>& z, const std::vector<T>& v, const CatShape& d,
                           CatConvention convention) {
  std::vector<T> out(d.B * d.N * d.H * d.Dv);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      apply_head(cat_matrix(cat_scores_softmax(z, d, b, h), convention), v, d, b, h, out);
  return out;
}

// Backward through the dense matrix: dv = A^T dout; every entry of A is some s[n], so
// ds[n] sums dA over the entries equal to s[n]; dz = s * (ds - <s, ds>).
template <typename T>
void cat_backward(const std::vector<T>& z, const std::vector<T>& v, const std::vector<T>& dout,
                  const CatShape& d, CatConvention convention, std::vector<T>& dz,
                  std::vector<T>& dv) {
  dz.assign(d.B * d.N * d.H, T(0));
  dv.assign(d.B * d.N * d.H * d.Dv, T(0));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const std::vector<T> s = cat_scores_softmax(z, d, b, h);
      const std::vector<T> dA = apply_head_backward(cat_matrix(s, convention), v, dout, d, b, h, dv);
      std::vector<T> ds(d.N, T(0));
      for (int64_t i = 0; i < d.N; ++i)
        for (int64_t j = 0; j < d.N; ++j) {
          const int64_t lag = convention == CatConvention::roll ? j - i : i - j;
          ds[((lag % d.N) + d.N) % d.N] += dA[i * d.N + j];
        }
      T inner = 0;
      for (int64_t n = 0; n < d.N; ++n) inner += s[n] * ds[n];
      for (int64_t n = 0; n < d.N; ++n) dz[(b * d.N + n) * d.H + h] = s[n] * (ds[n] - inner);
    }
}

template <typename T>
std::vector<T> cat_causal_forward(const std::vector<T>& z, const std::vector<T>& v,
                                  const CatShape& d) {
  std::vector<T> out(d.B * d.N * d.H * d.Dv);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) apply_head(cat_causal_matrix(z, d, b, h), v, d, b, h, out);
  return out;
}

// Row i is a softmax over the scores z[0..i], score k placed at column i - k:
// dz[k] = sum_{i >= k} P[i, i-k] (dP[i, i-k] - sum_j P[i, j] dP[i, j]).
template <typename T>
void cat_causal_backward(const std::vector<T>& z, const std::vector<T>& v,
                         const std::vector<T>& dout, const CatShape& d, std::vector<T>& dz,
                         std::vector<T>& dv) {
  dz.assign(d.B * d.N * d.H, T(0));
  dv.assign(d.B * d.N * d.H * d.Dv, T(0));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const std::vector<T> P = cat_causal_matrix(z, d, b, h);
      const std::vector<T> dP = apply_head_backward(P, v, dout, d, b, h, dv);
      for (int64_t i = 0; i < d.N; ++i) {
        T inner = 0;
        for (int64_t j = 0; j <= i; ++j) inner += P[i * d.N + j] * dP[i * d.N + j];
        for (int64_t j = 0; j <= i; ++j)
          dz[(b * d.N + (i - j)) * d.H + h] += P[i * d.N + j] * (dP[i * d.N + j] - inner);
      }
    }
}

// Averaged-key scores: z[b, i, h] = scale <q[b, i, h], mean_j k[b, j, h]>. q, k [B, N, H, D].
template <typename T>
std::vector<T> cat_avgkey_scores(const std::vector<T>& q, const std::vector<T>& k,
                                 const CatShape& d, int64_t D, T scale) {
  std::vector<T> z(d.B * d.N * d.H);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      std::vector<T> mean(D, T(0));
      for (int64_t j = 0; j < d.N; ++j)
        for (int64_t e = 0; e < D; ++e) mean[e] += k[((b * d.N + j) * d.H + h) * D + e] / T(d.N);
      for (int64_t i = 0; i < d.N; ++i) {
        T total = 0;
        for (int64_t e = 0; e < D; ++e) total += q[((b * d.N + i) * d.H + h) * D + e] * mean[e];
        z[(b * d.N + i) * d.H + h] = scale * total;
      }
    }
  return z;
}

// Chain rule through the scores: dq[i] = scale dz[i] kbar, dk[j] = scale / N sum_i dz[i] q[i].
template <typename T>
void cat_avgkey_backward(const std::vector<T>& q, const std::vector<T>& k,
                         const std::vector<T>& v, const std::vector<T>& dout, const CatShape& d,
                         int64_t D, T scale, CatConvention convention, std::vector<T>& dq,
                         std::vector<T>& dk, std::vector<T>& dv) {
  const std::vector<T> z = cat_avgkey_scores(q, k, d, D, scale);
  std::vector<T> dz;
  cat_backward(z, v, dout, d, convention, dz, dv);
  dq.assign(q.size(), T(0));
  dk.assign(k.size(), T(0));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      std::vector<T> mean(D, T(0)), dmean(D, T(0));
      for (int64_t j = 0; j < d.N; ++j)
        for (int64_t e = 0; e < D; ++e) mean[e] += k[((b * d.N + j) * d.H + h) * D + e] / T(d.N);
      for (int64_t i = 0; i < d.N; ++i) {
        const T g = scale * dz[(b * d.N + i) * d.H + h];
        for (int64_t e = 0; e < D; ++e) {
          dq[((b * d.N + i) * d.H + h) * D + e] = g * mean[e];
          dmean[e] += g * q[((b * d.N + i) * d.H + h) * D + e];
        }
      }
      for (int64_t j = 0; j < d.N; ++j)
        for (int64_t e = 0; e < D; ++e) dk[((b * d.N + j) * d.H + h) * D + e] = dmean[e] / T(d.N);
    }
}

}  // namespace subquad::reference
