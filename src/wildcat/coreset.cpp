// One bin to a weighted coreset: randomly pivoted Cholesky with the incremental inverse of
// G_SS (O(n r^2) for the residual updates, O(n r D) for the kernel rows, both as sgemm),
// Nyström weights folded into the values (O(n r Dv)). Reference: wildcat_ref.h.
#include "coreset.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "subquad/buffer.h"
#include "subquad/gemm.h"
#include "subquad/wildcat.h"
#include "weighted_attention.h"

namespace subquad::wildcat {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Counter-based uniform in (0, 1): a pure function of (stream, counter), so the draws of
// a bin do not depend on which thread compresses it or in what order.
float uniform01(uint64_t stream, uint64_t counter) {
  constexpr float kTwoToMinus24 = 0x1p-24f;
  return (static_cast<float>(splitmix64(stream + counter) >> 40) + 0.5f) * kTwoToMinus24;
}

// The same in double precision, for indices into bins longer than 2^24.
double uniform01_double(uint64_t stream, uint64_t counter) {
  constexpr double kTwoToMinus53 = 0x1p-53;
  return (static_cast<double>(splitmix64(stream + counter) >> 11) + 0.5) * kTwoToMinus53;
}

// The first `count` entries of a uniformly random permutation of [0, n) (Fisher-Yates).
std::vector<int64_t> random_order(int64_t n, int64_t count, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t i = 0; i < count; ++i) {
    const auto offset = static_cast<int64_t>(uniform01_double(stream, static_cast<uint64_t>(i)) *
                                             static_cast<double>(n - i));
    std::swap(order[i], order[i + std::min(offset, n - i - 1)]);
  }
  order.resize(static_cast<size_t>(count));
  return order;
}

// Gumbel-max pivot choice among keys with residual d_i > 0: argmax of
// log d_i + sq_i - log(-log U_i), evaluated as the monotone equivalent
// argmax (d_i exp(sq_i - max sq)) / (-log U_i), which needs one logarithm per key.
// `relative` holds exp(sq_i - max sq). Returns -1 when no key has weight left.
int64_t gumbel_pivot(const float* d, const float* relative, int64_t n, uint64_t stream,
                     uint64_t step) {
  int64_t best = -1;
  float best_score = 0.0f;
  const uint64_t base = step * static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    const float p = d[i] * relative[i];
    if (!(p > 0.0f)) continue;
    const float score = p / -std::log(uniform01(stream, base + static_cast<uint64_t>(i)));
    if (score > best_score) {
      best_score = score;
      best = i;
    }
  }
  return best;
}

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t index) { return splitmix64(splitmix64(seed) ^ index); }

NystromFactors pivoted_factors(const float* kt, int64_t ld, int64_t n, int64_t D, int64_t rank,
                               CoresetMethod method, uint64_t stream) {
  const int64_t r = std::min(rank, n);
  NystromFactors f;
  f.sq.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t e = 0; e < D; ++e) s += double(kt[i * ld + e]) * kt[i * ld + e];
    f.sq[i] = static_cast<float>(s);
  }
  const float sq_max = *std::max_element(f.sq.begin(), f.sq.end());
  Buffer<float> relative = Buffer<float>::uninitialized(n);  // exp(sq_i - max sq)
  for (int64_t i = 0; i < n; ++i) relative[i] = std::exp(f.sq[i] - sq_max);

  std::vector<float> d(static_cast<size_t>(n), 1.0f);  // residual diagonal of G
  f.rows.assign(static_cast<size_t>(r * n), 0.0f);
  std::vector<double> inverse(static_cast<size_t>(r * r), 0.0);  // M, row stride r
  std::vector<double> g(static_cast<size_t>(r));
  std::vector<float> g32(static_cast<size_t>(r));
  Buffer<float> y = Buffer<float>::uninitialized(n);

  const bool uniform = method == CoresetMethod::uniform_nystrom;
  const std::vector<int64_t> order = uniform ? random_order(n, n, stream) : std::vector<int64_t>{};
  size_t cursor = 0;
  auto next_uniform = [&]() -> int64_t {
    while (cursor < order.size() && !(d[order[cursor]] > 0.0f)) ++cursor;
    return cursor < order.size() ? order[cursor++] : -1;
  };

  int64_t s = uniform ? next_uniform() : gumbel_pivot(d.data(), relative.data(), n, stream, 0);
  while (s >= 0 && static_cast<int64_t>(f.pivots.size()) < r) {
    const auto t = static_cast<int64_t>(f.pivots.size());
    f.pivots.push_back(s);
    // g = [M a; -1] / sqrt(d_s) with a = G[S, s]; then M <- [[M, 0], [0, 0]] + g g^T is the
    // inverse of G_SS grown by one pivot (a rank-one Schur-complement update).
    const double inv_sqrt_ds = 1.0 / std::sqrt(double(d[s]));
    for (int64_t i = 0; i < t; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < t; ++j) sum += inverse[i * r + j] * f.rows[j * n + s];
      g[i] = sum * inv_sqrt_ds;
    }
    g[t] = -inv_sqrt_ds;
    for (int64_t i = 0; i <= t; ++i)
      for (int64_t j = 0; j <= t; ++j) inverse[i * r + j] += g[i] * g[j];

    // Row t of R: G[s, l] = exp(<kt_s, kt_l> - sq_s/2 - sq_l/2), clamped to 1 since
    // round-off can push it above its Cauchy-Schwarz bound.
    float* row = f.rows.data() + t * n;
    gemm(Transpose::no, Transpose::yes, 1, n, D, 1.0f, kt + s * ld, ld, kt, ld, 0.0f, row, n);
    for (int64_t l = 0; l < n; ++l) row[l] -= 0.5f * f.sq[l];
    exp_shifted(row, n, 0.5f * f.sq[s]);
    for (int64_t l = 0; l < n; ++l) row[l] = std::min(row[l], 1.0f);
    if (t + 1 == r) break;  // the residual is only needed to choose another pivot

    // y = R^T g is the new Cholesky column; d <- max(d - y^2, 0), d_s = 0, and residuals
    // under the tolerance count as exhausted (see kResidualTolerance).
    for (int64_t i = 0; i <= t; ++i) g32[i] = static_cast<float>(g[i]);
    gemm(Transpose::no, Transpose::no, 1, n, t + 1, 1.0f, g32.data(), t + 1, f.rows.data(), n, 0.0f,
         y.data(), n);
    d[s] = 0.0f;
    for (int64_t l = 0; l < n; ++l) {
      const float residual = d[l] - y[l] * y[l];
      d[l] = residual >= kResidualTolerance ? residual : 0.0f;
    }
    s = uniform ? next_uniform()
                : gumbel_pivot(d.data(), relative.data(), n, stream, static_cast<uint64_t>(t + 1));
  }

  const auto kept = static_cast<int64_t>(f.pivots.size());
  f.rows.resize(static_cast<size_t>(kept * n));
  f.inverse.resize(static_cast<size_t>(kept * kept));
  for (int64_t i = 0; i < kept; ++i)
    for (int64_t j = 0; j < kept; ++j) f.inverse[i * kept + j] = inverse[i * r + j];
  return f;
}

CoresetBin nystrom_coreset(const NystromFactors& f, const float* values, int64_t ldv, int64_t n,
                           int64_t Dv) {
  const auto r = static_cast<int64_t>(f.pivots.size());
  const int64_t width = Dv + 1;  // values and the all-ones column that yields w = W 1
  // W[s, l] = W_G[s, l] exp(sq_l/2) exp(-sq_s/2): the right factor goes into the values
  // (shifted by its max), the left one onto the rows (shifted by its min over S); the two
  // shifts add up to log_scale, a factor common to every entry.
  const float half_sq_max = 0.5f * *std::max_element(f.sq.begin(), f.sq.end());
  Buffer<float> weighted = Buffer<float>::uninitialized(n * width);  // [n, Dv + 1]
  for (int64_t l = 0; l < n; ++l) {
    const float e = std::exp(0.5f * f.sq[l] - half_sq_max);
    for (int64_t c = 0; c < Dv; ++c) weighted[l * width + c] = e * values[l * ldv + c];
    weighted[l * width + Dv] = e;
  }
  std::vector<float> projected(static_cast<size_t>(r * width));  // R [diag(e) V, e]
  gemm(Transpose::no, Transpose::no, r, width, n, 1.0f, f.rows.data(), n, weighted.data(), width,
       0.0f, projected.data(), width);

  double half_sq_min = 0.5 * f.sq[f.pivots[0]];
  for (int64_t p : f.pivots) half_sq_min = std::min(half_sq_min, 0.5 * f.sq[p]);
  CoresetBin bin;
  bin.pivots = f.pivots;
  bin.values.resize(static_cast<size_t>(r * Dv));
  bin.weights.resize(static_cast<size_t>(r));
  bin.log_scale = half_sq_max - half_sq_min;
  std::vector<double> row(static_cast<size_t>(width));
  for (int64_t i = 0; i < r; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t j = 0; j < r; ++j) {
      const double m = f.inverse[i * r + j];
      for (int64_t c = 0; c < width; ++c) row[c] += m * projected[j * width + c];
    }
    const double left = std::exp(half_sq_min - 0.5 * f.sq[f.pivots[i]]);
    for (int64_t c = 0; c < Dv; ++c) bin.values[i * Dv + c] = static_cast<float>(left * row[c]);
    bin.weights[i] = static_cast<float>(left * row[Dv]);
  }
  return bin;
}

CoresetBin compress_bin(const float* keys, int64_t ldk, const float* values, int64_t ldv, int64_t n,
                        int64_t D, int64_t Dv, double beta, double query_radius, int64_t rank,
                        CoresetMethod method, uint64_t stream) {
  const int64_t r = std::min(rank, n);
  if (method == CoresetMethod::uniform_subsample) {
    // Horvitz-Thompson weights n / r: unbiased for both sums of the weighted attention, and
    // with one bin the same as plain attention over the sampled keys.
    CoresetBin bin;
    bin.pivots = random_order(n, r, stream);
    const float weight = static_cast<float>(double(n) / double(r));
    for (int64_t p : bin.pivots) {
      for (int64_t c = 0; c < Dv; ++c) bin.values.push_back(weight * values[p * ldv + c]);
      bin.weights.push_back(weight);
    }
    return bin;
  }
  double key_radius = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t e = 0; e < D; ++e) s += double(keys[i * ldk + e]) * keys[i * ldk + e];
    key_radius = std::max(key_radius, s);
  }
  key_radius = std::sqrt(key_radius);
  const double tau = wildcat_temperature(beta, query_radius, key_radius, n);
  const auto multiplier = static_cast<float>(std::sqrt(beta) / tau);
  Buffer<float> scaled = Buffer<float>::uninitialized(n * D);  // kt [n, D]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < D; ++e) scaled[i * D + e] = multiplier * keys[i * ldk + e];
  const NystromFactors factors = pivoted_factors(scaled.data(), D, n, D, r, method, stream);
  return nystrom_coreset(factors, values, ldv, n, Dv);
}

}  // namespace subquad::wildcat
