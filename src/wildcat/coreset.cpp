// One bin to a weighted coreset: randomly pivoted Cholesky with the incremental inverse of
// G_SS (O(n r^2) for the residual updates, O(n r D) for the kernel rows, both as sgemm),
// Nyström weights folded into the values (O(n r Dv)). Reference: wildcat_ref.h.
#include "coreset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/buffer.h"
#include "common/gemm.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"
#include "weighted_attention.h"

namespace subquad::wildcat {
namespace {

// Pivot rows of the kernel E formed at a time in nystrom_coreset: bounds its buffer to
// kPivotBlock x n floats while keeping the sgemm shapes efficient.
constexpr int64_t kPivotBlock = 64;

// Largest spread (max sq - min sq) / 2 of a bin's scaled norms for which the projection uses
// one common shift: a row's own term is then >= e^{-64} ~ 1.6e-28, and terms lost to float
// underflow (< 1.2e-38) are below eps relative to it.
constexpr float kCommonShiftRange = 64.0f;

// Scratch pieces start on cache lines.
int64_t whole_lines(int64_t floats) {
  constexpr int64_t kPerLine = static_cast<int64_t>(kBufferAlignment / sizeof(float));
  return (floats + kPerLine - 1) / kPerLine * kPerLine;
}

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
    const float u = uniform01(stream, base + static_cast<uint64_t>(i));
    // -log u >= 1 - u, so u <= 1 - 2 p / best_score gives a score below best_score / 2: skip
    // the logarithm. The winning score is about sum_i p_i over an Exp(1) draw, so only a
    // handful of keys per step get past this test (the margin 2 keeps rounding out of it).
    if (best >= 0 && u <= 1.0f - 2.0f * p / best_score) continue;
    const float score = p / -std::log(u);
    if (score > best_score) {
      best_score = score;
      best = i;
    }
  }
  return best;
}

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t index) { return splitmix64(splitmix64(seed) ^ index); }

int64_t pivoted_factors_scratch_floats(int64_t n) { return 2 * whole_lines(n); }

NystromFactors pivoted_factors(const float* kt, int64_t ld, int64_t n, int64_t D, int64_t rank,
                               CoresetMethod method, uint64_t stream, float* scratch,
                               Interrupt* interrupt) {
  const int64_t r = std::min(rank, n);
  NystromFactors f;
  f.sq.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t e = 0; e < D; ++e) s += double(kt[i * ld + e]) * kt[i * ld + e];
    f.sq[i] = static_cast<float>(s);
  }
  // exp(sq_i - shift), set by the first pivot choice below.
  float* const relative = scratch;  // [n]
  std::fill(relative, relative + n, 0.0f);
  float shift = std::numeric_limits<float>::infinity();

  std::vector<float> d(static_cast<size_t>(n), 1.0f);  // residual diagonal of G
  f.rows.assign(static_cast<size_t>(r * n), 0.0f);
  std::vector<double> inverse(static_cast<size_t>(r * r), 0.0);  // M, row stride r
  std::vector<double> g(static_cast<size_t>(r));
  std::vector<float> g32(static_cast<size_t>(r));
  float* const y = scratch + whole_lines(n);  // [n]

  const bool uniform = method == CoresetMethod::uniform_nystrom;
  const std::vector<int64_t> order = uniform ? random_order(n, n, stream) : std::vector<int64_t>{};
  size_t cursor = 0;
  auto next_uniform = [&]() -> int64_t {
    while (cursor < order.size() && !(d[order[cursor]] > 0.0f)) ++cursor;
    return cursor < order.size() ? order[cursor++] : -1;
  };

  // Gumbel-max over the keys with residual left. exp(sq_i - shift) underflows for keys whose
  // sq is ~100 below the shift; once every key near the shift is exhausted the shift moves
  // down to the largest sq still in play, so such keys remain reachable (r = M stays exact).
  auto next_gumbel = [&](uint64_t step) -> int64_t {
    for (;;) {
      const int64_t pick = gumbel_pivot(d.data(), relative, n, stream, step);
      if (pick >= 0) return pick;
      float live_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i)
        if (d[i] > 0.0f) live_max = std::max(live_max, f.sq[i]);
      // No residual left, or nothing to gain from rescaling.
      if (live_max == -std::numeric_limits<float>::infinity() || !(live_max < shift)) return -1;
      shift = live_max;
      for (int64_t i = 0; i < n; ++i) relative[i] = std::exp(f.sq[i] - shift);
    }
  };

  int64_t s = uniform ? next_uniform() : next_gumbel(0);
  while (s >= 0 && static_cast<int64_t>(f.pivots.size()) < r) {
    if (interrupt != nullptr && interrupt->poll()) throw Interrupted();
    const auto t = static_cast<int64_t>(f.pivots.size());
    f.pivots.push_back(s);
    // g = [M a; -1] / sqrt(d_s) with a = G[S, s]; then M <- [[M, 0], [0, 0]] + g g^T is the
    // inverse of G_SS grown by one pivot (a rank-one Schur-complement update).
    // M is exactly symmetric (every update adds g_i g_j to both M[i, j] and M[j, i]), so
    // M a is formed as a sum of M's rows scaled by a_j: unit-stride and vectorised, where the
    // dot-product form was a scalar dependency chain that took ~90% of pivoted_factors'
    // time at N = 1024, r = 512 (docs/perf/wildcat.md).
    const double inv_sqrt_ds = 1.0 / std::sqrt(double(d[s]));
    std::fill(g.begin(), g.begin() + t, 0.0);
    for (int64_t j = 0; j < t; ++j) {
      const double a_j = f.rows[j * n + s];
      const double* m_row = inverse.data() + j * r;
      for (int64_t i = 0; i < t; ++i) g[i] += m_row[i] * a_j;
    }
    for (int64_t i = 0; i < t; ++i) g[i] *= inv_sqrt_ds;
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
         y, n);
    d[s] = 0.0f;
    for (int64_t l = 0; l < n; ++l) {
      const float residual = d[l] - y[l] * y[l];
      d[l] = residual >= kResidualTolerance ? residual : 0.0f;
    }
    s = uniform ? next_uniform() : next_gumbel(static_cast<uint64_t>(t + 1));
  }

  const auto kept = static_cast<int64_t>(f.pivots.size());
  f.rows.resize(static_cast<size_t>(kept * n));
  f.inverse.resize(static_cast<size_t>(kept * kept));
  for (int64_t i = 0; i < kept; ++i)
    for (int64_t j = 0; j < kept; ++j) f.inverse[i * kept + j] = inverse[i * r + j];
  return f;
}

int64_t nystrom_coreset_scratch_floats(int64_t n, int64_t r, int64_t D, int64_t Dv) {
  const int64_t block = std::min(r, kPivotBlock);
  return whole_lines(n * (Dv + 1)) + whole_lines(block * D) + whole_lines(block * n);
}

CoresetBin nystrom_coreset(const NystromFactors& f, const float* kt, int64_t ld, int64_t D,
                           const float* values, int64_t ldv, int64_t n, int64_t Dv,
                           float* scratch) {
  const auto r = static_cast<int64_t>(f.pivots.size());
  const int64_t width = Dv + 1;  // values and the all-ones column that yields w = W 1
  // Row j of the projection R diag(e^{sq/2}) [V, 1] is stored as e^{a_j} projected[j].
  std::vector<float> projected(static_cast<size_t>(r * width));  // [r, Dv + 1]
  std::vector<double> row_log_scale(static_cast<size_t>(r));     // a  [r]
  const auto [sq_min, sq_max] = std::minmax_element(f.sq.begin(), f.sq.end());
  const float half_sq_max = 0.5f * *sq_max;
  float* const scaled_values = scratch;  // [n, Dv + 1]
  if (half_sq_max - 0.5f * *sq_min <= kCommonShiftRange) {
    // Common case: one shift a_j = max sq / 2 for every row, on the pivoting's rows R. Row j
    // holds the term l = p_j of size e^{(sq_j - max sq)/2} >= e^{-kCommonShiftRange}, so the
    // terms that underflow (< 1e-38) are below eps relative to it.
    for (int64_t l = 0; l < n; ++l) {
      const float e = std::exp(0.5f * f.sq[l] - half_sq_max);
      for (int64_t c = 0; c < Dv; ++c) scaled_values[l * width + c] = e * values[l * ldv + c];
      scaled_values[l * width + Dv] = e;
    }
    gemm(Transpose::no, Transpose::no, r, width, n, 1.0f, f.rows.data(), n, scaled_values,
         width, 0.0f, projected.data(), width);
    std::fill(row_log_scale.begin(), row_log_scale.end(), double(half_sq_max));
  } else {
    // Scaled norms spread beyond float's exponent range: G[p_j, l] e^{sq_l/2} =
    // e^{kt_j.kt_l - sq_j/2}, so row j is e^{a_j} (E [V, 1])[j] with a_j = max_l kt_j.kt_l -
    // sq_j/2 and E <= 1 (one entry = 1). Forming E from the dot products, not from G (whose
    // entries underflow where the factor e^{sq_l/2} is largest), keeps every row's dominant
    // terms; the scales a_j stay in double.
    for (int64_t l = 0; l < n; ++l) {
      std::copy(values + l * ldv, values + l * ldv + Dv, scaled_values + l * width);
      scaled_values[l * width + Dv] = 1.0f;
    }
    const int64_t block = std::min(r, kPivotBlock);
    float* const pivot_keys = scaled_values + whole_lines(n * width);  // kt_S  [block, D]
    float* const kernel = pivot_keys + whole_lines(block * D);         // E     [block, n]
    for (int64_t first = 0; first < r; first += block) {
      const int64_t rows = std::min(block, r - first);
      for (int64_t j = 0; j < rows; ++j)
        std::copy(kt + f.pivots[first + j] * ld, kt + f.pivots[first + j] * ld + D,
                  pivot_keys + j * D);
      gemm(Transpose::no, Transpose::yes, rows, n, D, 1.0f, pivot_keys, D, kt, ld, 0.0f,
           kernel, n);
      for (int64_t j = 0; j < rows; ++j) {
        float* row = kernel + j * n;
        const float row_max = max_of(row, n);
        exp_shifted(row, n, row_max);
        row_log_scale[first + j] = double(row_max) - 0.5 * f.sq[f.pivots[first + j]];
      }
      gemm(Transpose::no, Transpose::no, rows, width, n, 1.0f, kernel, n,
           scaled_values, width, 0.0f, projected.data() + first * width, width);
    }
  }

  // Row i of W [V, 1] is e^{-sq_i/2} sum_j M[i, j] e^{a_j} (E [V, 1])[j]. Each term's log
  // magnitude c_j = log|M[i, j]| + a_j is shifted by the row's largest, C_i, so the sum is
  // formed in double from terms <= 1 in magnitude; the row is then normalised by its largest
  // entry mu_i and the rest goes into log_scales[i] = C_i - sq_i/2 + log mu_i.
  CoresetBin bin;
  bin.pivots = f.pivots;
  bin.values.resize(static_cast<size_t>(r * Dv));
  bin.weights.resize(static_cast<size_t>(r));
  bin.log_scales.resize(static_cast<size_t>(r));
  std::vector<double> term_log(static_cast<size_t>(r)), sum(static_cast<size_t>(width));
  for (int64_t i = 0; i < r; ++i) {
    double largest = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < r; ++j) {
      term_log[j] = std::log(std::abs(f.inverse[i * r + j])) + row_log_scale[j];
      largest = std::max(largest, term_log[j]);
    }
    std::fill(sum.begin(), sum.end(), 0.0);
    if (largest > -std::numeric_limits<double>::infinity()) {
      for (int64_t j = 0; j < r; ++j) {
        const double term = std::copysign(std::exp(term_log[j] - largest), f.inverse[i * r + j]);
        for (int64_t c = 0; c < width; ++c) sum[c] += term * projected[j * width + c];
      }
    }
    double magnitude = 0.0;
    for (double x : sum) magnitude = std::max(magnitude, std::abs(x));
    if (magnitude == 0.0) {  // W's row is zero (or negligible beyond double): no contribution
      std::fill(bin.values.begin() + i * Dv, bin.values.begin() + (i + 1) * Dv, 0.0f);
      bin.weights[i] = 0.0f;
      bin.log_scales[i] = -std::numeric_limits<double>::infinity();
      continue;
    }
    for (int64_t c = 0; c < Dv; ++c)
      bin.values[i * Dv + c] = static_cast<float>(sum[c] / magnitude);
    bin.weights[i] = static_cast<float>(sum[Dv] / magnitude);
    bin.log_scales[i] = largest - 0.5 * f.sq[f.pivots[i]] + std::log(magnitude);
  }
  return bin;
}

int64_t compress_bin_scratch_floats(int64_t n, int64_t D, int64_t Dv, int64_t rank) {
  // The scaled keys, then the factors' scratch or (after it) the coreset's in the same place.
  return whole_lines(n * D) + std::max(pivoted_factors_scratch_floats(n),
                                       nystrom_coreset_scratch_floats(n, std::min(rank, n), D, Dv));
}

CoresetBin compress_bin(const float* keys, int64_t ldk, const float* values, int64_t ldv, int64_t n,
                        int64_t D, int64_t Dv, double beta, double query_radius, int64_t rank,
                        CoresetMethod method, uint64_t stream, float* scratch,
                        Interrupt* interrupt) {
  const int64_t r = std::min(rank, n);
  if (r == n) {
    // Every key fits: the coreset is the bin itself, weight 1 (W = G_SS^-1 G_S = I). The
    // Nyström path would not get there: it stops once every residual is below
    // kResidualTolerance, and on low-dimensional or clustered keys the Gaussian kernel's
    // spectrum falls below that long before n pivots (D = 2, n = 512: a few dozen), so
    // "r = M" carried the truncation error of a much smaller coreset (relative error 0.44).
    CoresetBin bin;
    for (int64_t p = 0; p < n; ++p) {
      bin.pivots.push_back(p);
      bin.values.insert(bin.values.end(), values + p * ldv, values + p * ldv + Dv);
      bin.weights.push_back(1.0f);
      bin.log_scales.push_back(0.0);
    }
    return bin;
  }
  if (method == CoresetMethod::uniform_subsample) {
    // Horvitz-Thompson weights n / r: unbiased for both sums of the weighted attention, and
    // with one bin the same as plain attention over the sampled keys.
    CoresetBin bin;
    bin.pivots = random_order(n, r, stream);
    const double log_weight = std::log(double(n) / double(r));
    for (int64_t p : bin.pivots) {
      bin.values.insert(bin.values.end(), values + p * ldv, values + p * ldv + Dv);
      bin.weights.push_back(1.0f);
      bin.log_scales.push_back(log_weight);
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
  float* const scaled = scratch;  // kt [n, D]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < D; ++e) scaled[i * D + e] = multiplier * keys[i * ldk + e];
  float* const rest = scratch + whole_lines(n * D);
  const NystromFactors factors =
      pivoted_factors(scaled, D, n, D, r, method, stream, rest, interrupt);
  return nystrom_coreset(factors, scaled, D, D, values, ldv, n, Dv, rest);
}

}  // namespace subquad::wildcat
