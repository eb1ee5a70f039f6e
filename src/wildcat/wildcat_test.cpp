// Tests of the WildCat forward and its baselines: the Lambert-W temperature, the incremental
// inverse and Nyström weights against dense float64 algebra, exactness at r = M, error
// decay with r and against uniform sampling, degenerate inputs, errors, determinism.
#include "subquad/wildcat.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/test_support.h"
#include "wildcat/coreset.h"
#include "wildcat/weighted_attention.h"
#include "wildcat/wildcat_ref.h"
#include "wildcat/wildcat_test_util.h"

namespace subquad {
namespace {

using testing::all_finite;
using testing::expect_within_reference_error;
using testing::max_abs;
using testing::max_abs_diff;
using testing::random_vector;

using Shape = testing::AttentionShape;

struct Inputs {
  Shape s;
  std::vector<float> q, k, v;
};

Inputs random_inputs(const Shape& s, uint64_t seed, double key_spread = 1.0) {
  return {s, random_vector<float>(s.B * s.N * s.H * s.D, seed),
          random_vector<float>(s.B * s.M * s.Hkv * s.D, seed + 1, -key_spread, key_spread),
          random_vector<float>(s.B * s.M * s.Hkv * s.Dv, seed + 2)};
}

// Keys around `clusters` centres (spread `noise`), so a few coreset points represent them.
Inputs clustered_inputs(const Shape& s, int64_t clusters, double noise, uint64_t seed) {
  Inputs in = random_inputs(s, seed);
  std::mt19937_64 generator(seed + 7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> centres(static_cast<size_t>(clusters * s.D));
  for (double& c : centres) c = 2.0 * normal(generator);
  std::uniform_int_distribution<int64_t> pick(0, clusters - 1);
  for (int64_t row = 0; row < s.B * s.M * s.Hkv; ++row) {
    const int64_t c = pick(generator);
    for (int64_t e = 0; e < s.D; ++e)
      in.k[row * s.D + e] = static_cast<float>(centres[c * s.D + e] + noise * normal(generator));
  }
  for (float& x : in.q) x *= 2.0f;
  return in;
}

std::vector<float> run(const Inputs& in, const WildcatOptions& options, int threads = 1) {
  const Shape& s = in.s;
  std::vector<float> out(static_cast<size_t>(s.B * s.N * s.H * s.Dv), -1.0f);
  wildcat_attention(Context{Device::cpu, threads},
                    View4<const float>(in.q.data(), {s.B, s.N, s.H, s.D}),
                    View4<const float>(in.k.data(), {s.B, s.M, s.Hkv, s.D}),
                    View4<const float>(in.v.data(), {s.B, s.M, s.Hkv, s.Dv}), options,
                    View4<float>(out.data(), {s.B, s.N, s.H, s.Dv}));
  return out;
}

template <typename T>
std::vector<T> exact(const Inputs& in) {
  return testing::exact_attention<T>(in.s, in.q, in.k, in.v);
}

// Every key kept (r >= M, or keys that a few pivots represent exactly): WildCat is exact
// attention up to round-off, held to the project's rule against float32 exact attention. The
// Nyström weights are the identity only up to the float32 rounding of the kernel rows and of
// the projection, amplified by G_SS^-1 (norms 1e2-3e3 here) and averaged by the attention:
// up to 13 float32 ulps of the values' scale on these shapes, 7-21x exact attention's own
// error at these sizes. A floor of 16 ulps (instead of 8) covers that.
void expect_exact_attention(const std::vector<float>& out, const Inputs& in) {
  expect_within_reference_error(out, exact<float>(in), exact<double>(in), 2.0, 16.0);
}

// Relative Frobenius error of `approx` against `truth`; `approx` must be finite and not all
// zeros (whose relative error, 1, can beat a poor approximation).
double relative_error(const std::vector<float>& approx, const std::vector<double>& truth) {
  EXPECT_TRUE(all_finite(approx));
  EXPECT_GT(max_abs(approx), 0.0);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < truth.size(); ++i) {
    num += (approx[i] - truth[i]) * (approx[i] - truth[i]);
    den += truth[i] * truth[i];
  }
  return std::sqrt(num / den);
}

// Both W0s are within about a ulp of the root: Halley converges cubically, so after its last
// step (below 4 ulp) only the rounding of the update is left; bisection ends at the root of
// the rounded w e^w. Hence 2 ulp between them (measured: below 1). A relative error delta of
// w moves w e^w by (1 + w) delta relative (its log-derivative), plus the rounding of exp and
// of the product.
TEST(WildcatLambertW, MatchesBisection) {
  constexpr double kUlps = 2.0;
  for (double x : {1e-12, 1e-3, 0.3131, 0.5, 1.0, M_E, 3.0, 10.0, 1e3, 1e10, 1e100, 1e300}) {
    const double w = lambert_w0(x), expected = wildcat::lambert_w0_bisection(x);
    EXPECT_NEAR(w, expected, kUlps * DBL_EPSILON * expected) << "x = " << x;
    EXPECT_NEAR(w * std::exp(w), x, ((1.0 + w) * kUlps + 2.0) * DBL_EPSILON * x) << "x = " << x;
  }
  EXPECT_EQ(lambert_w0(0.0), 0.0);
  EXPECT_THROW(lambert_w0(-0.1), Error);
  EXPECT_THROW(lambert_w0(std::nan("")), Error);
}

TEST(WildcatTemperature, MatchesFormulaWithIndependentLambertW) {
  for (double beta : {0.125, 1.0})
    for (double rq : {0.5, 3.0})
      for (double rk : {0.1, 2.0, 40.0})
        for (int64_t n : {1, 97, 65536}) {
          const double b = std::log(double(n)) / (beta * rq * rk) + 2.0;
          const double expected =
              std::sqrt(rk / rq * b / (2.0 * wildcat::lambert_w0_bisection(b / 6.383202050647408)));
          // The same expression in the same order: only W0 differs, by up to 2 ulp (see
          // above), halved by the square root, plus the rounding of the quotient and the root.
          EXPECT_NEAR(wildcat_temperature(beta, rq, rk, n), expected, 2.0 * DBL_EPSILON * expected);
        }
  EXPECT_EQ(wildcat_temperature(0.125, 2.0, 0.0, 10), 1.0);
  EXPECT_EQ(wildcat_temperature(0.125, 0.0, 3.0, 10), wildcat_temperature(0.125, 3.0, 3.0, 10));
}

// Scaled keys for the factor tests: random keys in [-spread, spread]^D.
std::vector<float> scaled_keys(int64_t n, int64_t D, double spread, uint64_t seed) {
  return random_vector<float>(n * D, seed, -spread, spread);
}

// G(i, j) = exp(<kt_i, kt_j> - sq_i/2 - sq_j/2) evaluated in precision T.
template <typename T>
T gaussian_entry(const std::vector<T>& kt, int64_t D, int64_t i, int64_t j) {
  return std::exp(wildcat::dot_rows(kt, D, i, j) - wildcat::dot_rows(kt, D, i, i) / 2 -
                  wildcat::dot_rows(kt, D, j, j) / 2);
}

TEST(WildcatFactors, IncrementalInverseEqualsExplicitInverse) {
  for (auto method : {CoresetMethod::wildcat, CoresetMethod::uniform_nystrom}) {
    const int64_t n = 97, D = 7, rank = 23;
    const auto kt = scaled_keys(n, D, 0.6, 11);
    std::vector<float> scratch(wildcat::pivoted_factors_scratch_floats(n));
    const auto f = wildcat::pivoted_factors(kt.data(), D, n, D, rank, method, 5, scratch.data());
    ASSERT_EQ(f.pivots.size(), size_t(rank));
    EXPECT_EQ(std::set<int64_t>(f.pivots.begin(), f.pivots.end()).size(), f.pivots.size());
    const auto kt64 = testing::cast_vector<double>(kt);
    // float32 kernel entries perturb G_SS by ~eps, which moves the inverse by ~eps ||M||^2:
    // the error of the same inverse taken in float32.
    expect_within_reference_error(f.inverse, wildcat::gaussian_inverse_reference(kt, D, f.pivots),
                                  wildcat::gaussian_inverse_reference(kt64, D, f.pivots));
    // R holds the kernel rows of the pivots, against the kernel formula in float32 / float64.
    std::vector<float> rows, kernel32;
    std::vector<double> kernel64;
    for (int64_t t = 0; t < rank; ++t)
      for (int64_t l = 0; l < n; l += 5) {
        const int64_t s = f.pivots[t];
        rows.push_back(f.rows[t * n + l]);
        kernel32.push_back(gaussian_entry(kt, D, s, l));
        kernel64.push_back(gaussian_entry(kt64, D, s, l));
      }
    expect_within_reference_error(rows, kernel32, kernel64);
  }
}

TEST(WildcatFactors, ConvertedWeightsEqualDenseNystrom) {
  for (int64_t n : {1, 2, 31, 96}) {
    const int64_t D = 6, Dv = 5, rank = 17;
    const auto kt = scaled_keys(n, D, 0.7, 3 + n);
    const auto values = random_vector<float>(n * Dv, 4 + n);
    std::vector<float> scratch(wildcat::pivoted_factors_scratch_floats(n) +
                               wildcat::nystrom_coreset_scratch_floats(n, rank, D, Dv));
    const auto f = wildcat::pivoted_factors(kt.data(), D, n, D, rank, CoresetMethod::wildcat, 9,
                                            scratch.data());
    const auto bin =
        wildcat::nystrom_coreset(f, kt.data(), D, D, values.data(), Dv, n, Dv, scratch.data());
    std::vector<double> got;
    for (size_t i = 0; i < bin.pivots.size(); ++i) {
      const double scale = std::exp(bin.log_scales[i]);
      for (int64_t c = 0; c < Dv; ++c) got.push_back(scale * bin.values[i * Dv + c]);
      got.push_back(scale * bin.weights[i]);
    }
    SCOPED_TRACE(::testing::Message() << "n = " << n);
    // Held to the float32 error of the same weights formed through an explicit inverse, the
    // fast path's way: a float32 dense solve is backward stable and about 10x more accurate
    // here, a standard no explicit inverse meets (see wildcat_test_util.h).
    expect_within_reference_error(
        got, testing::nystrom_values_by_inverse(kt, D, values, Dv, f.pivots),
        wildcat::nystrom_values_reference(testing::cast_vector<double>(kt), D,
                                          testing::cast_vector<double>(values), Dv, f.pivots));
  }
}

// Scaled norms spread beyond float's exponent range (sq up to ~480, rows of W spanning
// e^{+-100}): each converted row, at its own log scale, against the dense float64 weights
// relative to that row's largest entry. A float32 dot product of D terms errs by up to
// D eps |kt_j| |kt_l| <= D eps sq_max (the standard bound), an absolute error in the exponents
// of the row's terms, hence the relative bound D eps sq_max (measured: below 0.8 eps sq_max).
TEST(WildcatFactors, ConvertedWeightsKeepTheirScaleBeyondFloatRange) {
  for (int64_t n : {29, 96}) {
    const int64_t D = 6, Dv = 4, rank = 13;
    const auto kt = scaled_keys(n, D, 9.0, 20 + n);
    const auto values = random_vector<float>(n * Dv, 21 + n);
    std::vector<float> scratch(wildcat::pivoted_factors_scratch_floats(n) +
                               wildcat::nystrom_coreset_scratch_floats(n, rank, D, Dv));
    const auto f = wildcat::pivoted_factors(kt.data(), D, n, D, rank, CoresetMethod::wildcat, 2,
                                            scratch.data());
    const auto [lo, hi] = std::minmax_element(f.sq.begin(), f.sq.end());
    ASSERT_GT(*hi - *lo, 200.0f) << "the test needs spreads beyond float's exponent range";
    const auto bin =
        wildcat::nystrom_coreset(f, kt.data(), D, D, values.data(), Dv, n, Dv, scratch.data());
    const auto expected = wildcat::nystrom_values_reference(
        testing::cast_vector<double>(kt), D, testing::cast_vector<double>(values), Dv, f.pivots);
    for (size_t i = 0; i < bin.pivots.size(); ++i) {
      const double scale = std::exp(bin.log_scales[i]);
      double error = 0.0, size = 0.0;
      for (int64_t c = 0; c <= Dv; ++c) {
        const double got = scale * (c < Dv ? bin.values[i * Dv + c] : bin.weights[i]);
        error = std::max(error, std::abs(got - expected[i * (Dv + 1) + c]));
        size = std::max(size, std::abs(expected[i * (Dv + 1) + c]));
      }
      EXPECT_GT(size, 0.0);
      EXPECT_LE(error, double(D) * FLT_EPSILON * *hi * size) << "n = " << n << ", row " << i;
    }
  }
}

TEST(WildcatForward, EqualsExactAttentionWhenRankCoversKeys) {
  for (const Shape& s : {Shape{1, 1, 1, 1, 1, 4, 3}, Shape{2, 13, 7, 4, 2, 5, 9},
                         Shape{1, 29, 31, 3, 1, 16, 8}, Shape{1, 17, 64, 2, 2, 59, 4}}) {
    const Inputs in = random_inputs(s, 100 + s.M, 0.5);
    for (auto method : {CoresetMethod::wildcat, CoresetMethod::uniform_nystrom,
                        CoresetMethod::uniform_subsample}) {
      WildcatOptions options;
      options.rank = s.M;
      options.method = method;
      SCOPED_TRACE(::testing::Message() << "M = " << s.M << ", method " << int(method));
      expect_exact_attention(run(in, options), in);
    }
  }
}

TEST(WildcatForward, ErrorFallsWithRankAndBeatsUniformSampling) {
  const Shape s{1, 64, 1024, 1, 1, 16, 8};
  const std::vector<int64_t> ranks = {8, 16, 32, 64, 128};
  const int seeds = 3;
  std::vector<double> wildcat_error(ranks.size()), nystrom_error(ranks.size()),
      subsample_error(ranks.size());
  for (int seed = 0; seed < seeds; ++seed) {
    const Inputs in = clustered_inputs(s, 12, 0.15, 40 + seed);
    const auto truth = exact<double>(in);
    for (size_t i = 0; i < ranks.size(); ++i) {
      WildcatOptions options;
      options.rank = ranks[i];
      options.seed = 1000 + seed;
      wildcat_error[i] += relative_error(run(in, options), truth) / seeds;
      options.method = CoresetMethod::uniform_nystrom;
      nystrom_error[i] += relative_error(run(in, options), truth) / seeds;
      options.method = CoresetMethod::uniform_subsample;
      subsample_error[i] += relative_error(run(in, options), truth) / seeds;
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    SCOPED_TRACE(::testing::Message()
                 << "r = " << ranks[i] << ": wildcat " << wildcat_error[i] << ", uniform nystrom "
                 << nystrom_error[i] << ", uniform subsample " << subsample_error[i]);
    if (i > 0) {
      EXPECT_LT(wildcat_error[i], wildcat_error[i - 1]);
    }
    EXPECT_LT(wildcat_error[i], nystrom_error[i]);
    EXPECT_LT(wildcat_error[i], subsample_error[i]);
  }
  EXPECT_LT(wildcat_error.back(), 0.2 * wildcat_error.front());
}

TEST(WildcatForward, DegenerateKeys) {
  const Shape s{1, 9, 50, 2, 1, 8, 5};
  Inputs in = random_inputs(s, 7);
  // Every key equal: attention is the mean of the values whatever the query; one pivot
  // represents them all (the residual vanishes after it).
  for (int64_t j = 0; j < s.M; ++j)
    std::copy(in.k.begin(), in.k.begin() + s.D, in.k.begin() + j * s.D);
  WildcatOptions options;
  options.rank = 10;
  {
    SCOPED_TRACE("all keys equal");
    expect_exact_attention(run(in, options), in);
  }
  // Rank-deficient keys: 3 distinct keys repeated, in a 2-D subspace. The 3 pivots represent
  // every key exactly, so this too is exact attention up to round-off.
  for (int64_t j = 0; j < s.M; ++j)
    for (int64_t e = 0; e < s.D; ++e)
      in.k[j * s.D + e] = e < 2 ? static_cast<float>((j % 3) * (e + 1)) * 0.7f : 0.0f;
  SCOPED_TRACE("3 distinct keys");
  expect_exact_attention(run(in, options), in);
}

TEST(WildcatForward, EdgeSizesAreFinite) {
  // r > M, M = 1, bins not dividing M or r, bins > M (M bins are used).
  struct Case {
    Shape s;
    int64_t rank, bins;
  };
  for (const Case& c : {Case{{1, 5, 1, 2, 1, 4, 3}, 8, 1}, Case{{1, 5, 1, 2, 2, 4, 3}, 8, 3},
                        Case{{2, 11, 37, 2, 1, 7, 5}, 11, 5}, Case{{1, 8, 40, 1, 1, 9, 2}, 300, 7},
                        Case{{1, 6, 3, 1, 1, 4, 4}, 6, 6}}) {
    const Inputs in = random_inputs(c.s, 3);
    WildcatOptions options;
    options.rank = c.rank;
    options.bins = c.bins;
    const auto out = run(in, options);
    EXPECT_TRUE(all_finite(out));
    EXPECT_GT(max_abs(out), 0.0);
    if (c.rank >= c.s.M) {  // every key is kept
      SCOPED_TRACE(::testing::Message() << "rank " << c.rank << ", bins " << c.bins);
      expect_exact_attention(out, in);
    }
  }
  // M = 0: zeros. N = 0: nothing to do.
  const Inputs empty = random_inputs({1, 3, 0, 1, 1, 4, 2}, 1);
  EXPECT_EQ(max_abs(run(empty, WildcatOptions{})), 0.0);
}

TEST(WildcatForward, BadArgumentsThrow) {
  const Shape s{1, 4, 6, 2, 1, 4, 3};
  const Inputs in = random_inputs(s, 1);
  std::vector<float> out(s.N * s.H * s.Dv);
  auto call = [&](const WildcatOptions& options, std::array<int64_t, 4> q_shape,
                  std::array<int64_t, 4> k_shape, std::array<int64_t, 4> v_shape,
                  std::array<int64_t, 4> out_shape) {
    wildcat_attention(Context{}, View4<const float>(in.q.data(), q_shape),
                      View4<const float>(in.k.data(), k_shape),
                      View4<const float>(in.v.data(), v_shape), options,
                      View4<float>(out.data(), out_shape));
  };
  const std::array<int64_t, 4> q{1, 4, 2, 4}, k{1, 6, 1, 4}, v{1, 6, 1, 3}, o{1, 4, 2, 3};
  WildcatOptions good;
  good.rank = 4;
  EXPECT_NO_THROW(call(good, q, k, v, o));
  WildcatOptions bad = good;
  bad.rank = 0;
  EXPECT_THROW(call(bad, q, k, v, o), Error);
  bad = good;
  bad.bins = 0;
  EXPECT_THROW(call(bad, q, k, v, o), Error);
  bad.bins = 5;  // more bins than points
  EXPECT_THROW(call(bad, q, k, v, o), Error);
  bad = good;
  bad.scale = -1.0;
  EXPECT_THROW(call(bad, q, k, v, o), Error);
  bad.scale = std::nan("");
  EXPECT_THROW(call(bad, q, k, v, o), Error);
  EXPECT_THROW(call(good, q, {1, 6, 1, 3}, v, o), Error);  // D mismatch
  EXPECT_THROW(call(good, q, k, {1, 5, 1, 3}, o), Error);  // M mismatch
  EXPECT_THROW(call(good, {1, 2, 3, 4}, {1, 3, 2, 4}, {1, 3, 2, 3}, {1, 2, 3, 3}), Error);  // GQA
  EXPECT_THROW(call(good, q, k, v, {1, 4, 2, 2}), Error);  // out Dv mismatch
  EXPECT_THROW(call(good, {1, 2, 2, 4}, k, v, o), Error);  // out N mismatch
}

TEST(WildcatForward, DeterministicForSeedAndThreads) {
  const Shape s{2, 40, 300, 4, 2, 16, 8};
  const Inputs in = clustered_inputs(s, 6, 0.3, 5);
  WildcatOptions options;
  options.rank = 24;
  options.bins = 3;
  options.seed = 77;
  for (int threads : {1, 2}) {
    const auto a = run(in, options, threads), b = run(in, options, threads);
    EXPECT_EQ(a, b) << threads << " threads";
    EXPECT_TRUE(all_finite(a));
  }
  const auto first = run(in, options);
  options.seed = 78;
  EXPECT_NE(first, run(in, options));
}

TEST(WildcatForward, StridedViewsGiveTheSameResult) {
  const Shape s{1, 21, 45, 2, 1, 8, 6};
  const Inputs in = random_inputs(s, 9);
  WildcatOptions options;
  options.rank = 12;
  options.bins = 2;
  const auto contiguous = run(in, options);
  // q and out embedded in wider rows (a slice of a bigger tensor): row stride 2 H D.
  std::vector<float> q_wide(s.N * 2 * s.H * s.D, 99.0f), out_wide(s.N * 2 * s.H * s.Dv, 5.0f);
  for (int64_t i = 0; i < s.N; ++i)
    std::copy(in.q.begin() + i * s.H * s.D, in.q.begin() + (i + 1) * s.H * s.D,
              q_wide.begin() + i * 2 * s.H * s.D);
  wildcat_attention(
      Context{}, View4<const float>(q_wide.data(), {1, s.N, s.H, s.D}, {0, 2 * s.H * s.D, s.D, 1}),
      View4<const float>(in.k.data(), {1, s.M, 1, s.D}),
      View4<const float>(in.v.data(), {1, s.M, 1, s.Dv}), options,
      View4<float>(out_wide.data(), {1, s.N, s.H, s.Dv}, {0, 2 * s.H * s.Dv, s.Dv, 1}));
  std::vector<float> strided;
  for (int64_t i = 0; i < s.N; ++i)
    strided.insert(strided.end(), out_wide.begin() + i * 2 * s.H * s.Dv,
                   out_wide.begin() + i * 2 * s.H * s.Dv + s.H * s.Dv);
  // The same numbers in the same order (only the row stride differs): bit-identical.
  EXPECT_TRUE(all_finite(contiguous));
  EXPECT_GT(max_abs(contiguous), 0.0);
  EXPECT_EQ(strided, contiguous);
}

// weighted_attention_reference in precision T over coreset entries given in float64.
template <typename T>
std::vector<T> weighted_attention_in(const std::vector<double>& q, const std::vector<double>& keys,
                                     const std::vector<double>& log_scales,
                                     const std::vector<double>& weighted, const Shape& s,
                                     double beta, const std::vector<double>& vmin,
                                     const std::vector<double>& vmax) {
  using testing::cast_vector;
  const auto r = static_cast<int64_t>(log_scales.size());
  return wildcat::weighted_attention_reference<T>(
      cast_vector<T>(q), s.D, cast_vector<T>(keys), cast_vector<T>(log_scales),
      cast_vector<T>(weighted), s.Dv, T(beta), cast_vector<T>(vmin), cast_vector<T>(vmax),
      T(wildcat::relative_denominator_floor(r)));
}

// The assembly (recentering, bins, rescaling, GQA) against a float64 weighted attention over
// the bins' coresets computed one by one, for either query radius of the temperature.
void expect_weighted_reference_over_coreset(QueryRadius query_radius) {
  const Shape s{1, 19, 53, 4, 2, 8, 5};
  const Inputs in = random_inputs(s, 21);
  WildcatOptions options;
  options.rank = 9;
  options.bins = 2;
  options.seed = 4;
  options.query_radius = query_radius;
  const auto out = run(in, options);
  const double beta = 1.0 / std::sqrt(double(s.D));
  for (int64_t hkv = 0; hkv < s.Hkv; ++hkv) {
    std::vector<double> mean(s.D, 0.0);
    for (int64_t j = 0; j < s.M; ++j)
      for (int64_t e = 0; e < s.D; ++e) mean[e] += in.k[(j * s.Hkv + hkv) * s.D + e] / double(s.M);
    std::vector<float> centered(s.M * s.D), values(s.M * s.Dv);
    std::vector<double> vmin(s.Dv, 1e30), vmax(s.Dv, -1e30);
    for (int64_t j = 0; j < s.M; ++j) {
      for (int64_t e = 0; e < s.D; ++e)
        centered[j * s.D + e] = static_cast<float>(in.k[(j * s.Hkv + hkv) * s.D + e] - mean[e]);
      for (int64_t c = 0; c < s.Dv; ++c) {
        values[j * s.Dv + c] = in.v[(j * s.Hkv + hkv) * s.Dv + c];
        vmin[c] = std::min<double>(vmin[c], values[j * s.Dv + c]);
        vmax[c] = std::max<double>(vmax[c], values[j * s.Dv + c]);
      }
    }
    double radius = 0.0;
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = hkv * 2; h < hkv * 2 + 2; ++h) {
        double sq = 0.0;
        for (int64_t e = 0; e < s.D; ++e) sq += std::pow(in.q[(i * s.H + h) * s.D + e], 2);
        radius = std::max(radius, std::sqrt(sq));
      }
    if (query_radius == QueryRadius::keys) radius = 0.0;  // compress_bin: R_Q = R_K of the bin
    std::vector<double> keys, log_scales, weighted;
    const int64_t spans[2][2] = {{0, 27}, {27, 26}};
    std::vector<wildcat::CoresetBin> bins;
    std::vector<float> scratch(wildcat::compress_bin_scratch_floats(27, s.D, s.Dv, 5));
    for (int64_t c = 0; c < 2; ++c)
      bins.push_back(wildcat::compress_bin(
          centered.data() + spans[c][0] * s.D, s.D, values.data() + spans[c][0] * s.Dv, s.Dv,
          spans[c][1], s.D, s.Dv, beta, radius, c == 0 ? 5 : 4, CoresetMethod::wildcat,
          wildcat::mix_seed(options.seed, hkv * 2 + c), scratch.data()));
    for (int64_t c = 0; c < 2; ++c)
      for (size_t i = 0; i < bins[c].pivots.size(); ++i) {
        const int64_t j = spans[c][0] + bins[c].pivots[i];
        for (int64_t e = 0; e < s.D; ++e) keys.push_back(centered[j * s.D + e]);
        log_scales.push_back(bins[c].log_scales[i]);
        for (int64_t col = 0; col < s.Dv; ++col) weighted.push_back(bins[c].values[i * s.Dv + col]);
        weighted.push_back(bins[c].weights[i]);
      }
    for (int64_t h = hkv * 2; h < hkv * 2 + 2; ++h) {
      std::vector<double> q;
      std::vector<float> got;
      for (int64_t i = 0; i < s.N; ++i) {
        for (int64_t e = 0; e < s.D; ++e) q.push_back(in.q[(i * s.H + h) * s.D + e]);
        for (int64_t c = 0; c < s.Dv; ++c) got.push_back(out[(i * s.H + h) * s.Dv + c]);
      }
      SCOPED_TRACE(::testing::Message() << "head " << h);
      expect_within_reference_error(
          got, weighted_attention_in<float>(q, keys, log_scales, weighted, s, beta, vmin, vmax),
          weighted_attention_in<double>(q, keys, log_scales, weighted, s, beta, vmin, vmax));
    }
  }
}

TEST(WildcatForward, MatchesWeightedReferenceOverItsCoreset) {
  expect_weighted_reference_over_coreset(QueryRadius::queries);
}

TEST(WildcatForward, MatchesWeightedReferenceOverItsCoresetWithKeyRadius) {
  expect_weighted_reference_over_coreset(QueryRadius::keys);
}

TEST(WildcatForward, KeyRadiusCoresetDoesNotDependOnTheQueries) {
  // One outlier query (10x the norm of the others) sets R_Q = max ||q||, hence the temperature
  // and the coreset every query of its group attends to. With R_Q = R_K the coreset is built
  // from the keys alone: the other queries' outputs stay bit-identical.
  const Shape s{1, 17, 200, 2, 1, 8, 4};
  const Inputs in = random_inputs(s, 31);
  Inputs outlier = in;
  for (int64_t e = 0; e < s.D; ++e) outlier.q[e] *= 10.0f;  // query 0 of head 0
  const auto others = [&](const std::vector<float>& out) {
    return std::vector<float>(out.begin() + s.H * s.Dv, out.end());  // queries 1.. of all heads
  };
  WildcatOptions options;
  options.rank = 12;
  options.seed = 3;
  for (QueryRadius query_radius : {QueryRadius::queries, QueryRadius::keys}) {
    options.query_radius = query_radius;
    const auto plain = run(in, options), shifted = run(outlier, options);
    EXPECT_TRUE(all_finite(plain) && all_finite(shifted));
    EXPECT_GT(max_abs(plain), 0.0);
    if (query_radius == QueryRadius::keys)
      EXPECT_EQ(others(plain), others(shifted));
    else
      EXPECT_NE(others(plain), others(shifted));
  }
}

TEST(WildcatWeightedAttention, DenominatorGuardAndClamp) {
  // Two entries whose weights cancel: the denominator vanishes and the row outputs the
  // clamped zero; a negative-weight entry pushing the ratio outside the range is clamped.
  const std::vector<float> keys = {1.0f, 0.0f, 1.0f, 0.0f};      // two equal keys, D = 2
  const std::vector<float> cancel = {5.0f, 1.0f, -5.0f, -1.0f};  // [v, w] rows, Dv = 1
  const std::vector<float> q = {0.3f, -0.2f};
  const float vmin = 0.5f, vmax = 2.0f;
  float out = -7.0f;
  const std::vector<float> log_scales = {0.0f, 0.0f};
  std::vector<float> scratch(wildcat::weighted_attention_scratch_floats(1, 2, 1));
  wildcat::weighted_attention_rows(q.data(), 2, 1, 2, keys.data(), log_scales.data(), 2,
                                   cancel.data(), 1, 1.0f, &vmin, &vmax, &out, 1, scratch.data());
  EXPECT_EQ(out, vmin);
  const std::vector<float> outside = {30.0f, 1.0f, -1.0f, 0.5f};  // ratio 29 / 1.5
  wildcat::weighted_attention_rows(q.data(), 2, 1, 2, keys.data(), log_scales.data(), 2,
                                   outside.data(), 1, 1.0f, &vmin, &vmax, &out, 1,
                                   scratch.data());
  EXPECT_EQ(out, vmax);
}

TEST(WildcatCost, CountsEachBinOnItsOwnKeys) {
  const int64_t D = 16, Dv = 8;
  // One bin, per kv head: residual updates M r^2, kernel rows 2 M r D, Nystrom values
  // 2 M r (Dv + 1); per query head, attention 2 N r (D + Dv + 1).
  EXPECT_DOUBLE_EQ(wildcat_attention_cost(1, 10, 1000, 2, 1, D, Dv, 40, 1).flops,
                   1000.0 * 40 * 40 + 2 * 1000.0 * 40 * D + 2 * 1000.0 * 40 * (Dv + 1) +
                       2 * (2 * 10.0 * 40 * (D + Dv + 1)));
  // 7 bins split 1003 keys (2 of 144, 5 of 143) and 45 points (3 of 7, 4 of 6) as the forward
  // does, each bin compressing its own keys: the sum of those bins' one-bin costs (N = 0
  // leaves compression alone), then attention over all 45 points.
  double bins = 0;
  for (int64_t c = 0; c < 7; ++c)
    bins += wildcat_attention_cost(1, 0, c < 2 ? 144 : 143, 1, 1, D, Dv, c < 3 ? 7 : 6, 1).flops;
  EXPECT_DOUBLE_EQ(wildcat_attention_cost(1, 10, 1003, 2, 1, D, Dv, 45, 7).flops,
                   bins + 2 * (2 * 10.0 * 45 * (D + Dv + 1)));
  // Points covering the keys keep them: no compression, attention over the M keys.
  EXPECT_DOUBLE_EQ(wildcat_attention_cost(1, 10, 30, 1, 1, D, Dv, 64, 1).flops,
                   2 * 10.0 * 30 * (D + Dv + 1));
  // Uniform subsampling draws its points and compresses nothing; uniform Nystrom pays
  // WildCat's compression.
  EXPECT_DOUBLE_EQ(
      wildcat_attention_cost(1, 10, 1000, 2, 1, D, Dv, 40, 1, CoresetMethod::uniform_subsample)
          .flops,
      2 * (2 * 10.0 * 40 * (D + Dv + 1)));
  EXPECT_DOUBLE_EQ(
      wildcat_attention_cost(1, 10, 1000, 2, 1, D, Dv, 40, 1, CoresetMethod::uniform_nystrom)
          .flops,
      wildcat_attention_cost(1, 10, 1000, 2, 1, D, Dv, 40, 1).flops);
}

}  // namespace
}  // namespace subquad
