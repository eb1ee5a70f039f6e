// WildCat, CompressKV and weighted KV attention on hostile input: rank = M is exact attention for
// every head dim (the pivoting's early stop once made it a much smaller coreset on
// low-dimensional keys), non-finite keys, values and queries propagate as NaN instead of
// turning into zeros, and a cache is usable right after construction and every method.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/test_support.h"
#include "subquad/wildcat.h"
#include "wildcat/coreset.h"
#include "wildcat/wildcat_test_util.h"

namespace subquad {
namespace {

using Shape = testing::AttentionShape;
using testing::random_vector;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Inputs {
  Shape s;
  std::vector<float> q, k, v;
};

// Standard normal q, k (k optionally around `clusters` centres), uniform v.
Inputs normal_inputs(const Shape& s, uint64_t seed, int64_t clusters = 0) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Inputs in{s, std::vector<float>(s.B * s.N * s.H * s.D), std::vector<float>(s.B * s.M * s.Hkv * s.D),
            random_vector<float>(s.B * s.M * s.Hkv * s.Dv, seed + 1)};
  for (float& x : in.q) x = float(normal(generator));
  std::vector<double> centres(static_cast<size_t>(std::max<int64_t>(clusters, 1) * s.D));
  for (double& c : centres) c = 3.0 * normal(generator);
  for (int64_t row = 0; row < s.B * s.M * s.Hkv; ++row) {
    const int64_t c = clusters ? int64_t(generator() % uint64_t(clusters)) : 0;
    for (int64_t e = 0; e < s.D; ++e)
      in.k[row * s.D + e] =
          float(clusters ? centres[c * s.D + e] + 0.05 * normal(generator) : normal(generator));
  }
  return in;
}

std::vector<float> run(const Inputs& in, const WildcatOptions& options) {
  const Shape& s = in.s;
  std::vector<float> out(static_cast<size_t>(s.B * s.N * s.H * s.Dv), -1.0f);
  wildcat_attention(Context{}, View4<const float>(in.q.data(), {s.B, s.N, s.H, s.D}),
                    View4<const float>(in.k.data(), {s.B, s.M, s.Hkv, s.D}),
                    View4<const float>(in.v.data(), {s.B, s.M, s.Hkv, s.Dv}), options,
                    View4<float>(out.data(), {s.B, s.N, s.H, s.Dv}));
  return out;
}

// The cause, stated as a test: on low-dimensional keys the Gaussian kernel of n = 512 keys
// has few eigenvalues above the residual tolerance, so pivoted Cholesky asked for n pivots
// stops far earlier. rank = M must therefore not go through the pivoting.
TEST(WildcatHostile, PivotingStopsEarlyOnLowDimensionalKeys) {
  const int64_t n = 512, D = 2;
  const Inputs in = normal_inputs(Shape{1, 1, n, 1, 1, D, 1}, 5);
  const double beta = 1.0 / std::sqrt(double(D));
  double radius = 0.0;
  for (int64_t i = 0; i < n; ++i)
    radius = std::max(radius, std::hypot(double(in.k[2 * i]), double(in.k[2 * i + 1])));
  const double tau = wildcat_temperature(beta, radius, radius, n);
  std::vector<float> kt(in.k);
  for (float& x : kt) x = float(x * std::sqrt(beta) / tau);
  std::vector<float> scratch(wildcat::pivoted_factors_scratch_floats(n));
  const wildcat::NystromFactors factors =
      wildcat::pivoted_factors(kt.data(), D, n, D, n, CoresetMethod::wildcat, 1, scratch.data());
  EXPECT_LT(int64_t(factors.pivots.size()), n / 4) << factors.pivots.size() << " pivots";
}

TEST(WildcatHostile, FullRankIsExactForEveryHeadDim) {
  struct Case {
    int64_t D, clusters;
  };
  for (const Case c : {Case{2, 0}, Case{8, 0}, Case{16, 0}, Case{32, 6}}) {
    const Shape s{1, 40, 512, 2, 1, c.D, 4};
    const Inputs in = normal_inputs(s, 40 + c.D, c.clusters);
    const auto exact32 = testing::exact_attention<float>(s, in.q, in.k, in.v);
    const auto exact64 = testing::exact_attention<double>(s, in.q, in.k, in.v);
    for (auto method : {CoresetMethod::wildcat, CoresetMethod::uniform_nystrom}) {
      for (int64_t bins : {1, 4}) {
        WildcatOptions options;
        options.rank = s.M;
        options.bins = bins;
        options.method = method;
        SCOPED_TRACE(::testing::Message() << "D = " << c.D << ", clusters " << c.clusters
                                          << ", method " << int(method) << ", bins " << bins);
        testing::expect_within_reference_error(run(in, options), exact32, exact64, 2.0, 8.0);
      }
    }
  }
}

// Query views whose row stride sgemm would refuse, as torch and NumPy hand them over: one
// query with the N stride 1 (torch's stride for a size-1 dimension over DLPack: the layer
// at T = 1, or a one-token padded row) and queries broadcast over N (stride 0, torch's
// expand). The output is the one of the same queries stored contiguously.
TEST(WildcatHostile, QueryStridesOfLoneAndBroadcastRows) {
  const Shape s{1, 5, 64, 2, 2, 8, 3};
  const Inputs in = normal_inputs(s, 9);
  WildcatOptions options;
  options.rank = 16;
  auto attend = [&](const float* q, int64_t N, int64_t n_stride) {
    std::vector<float> out(static_cast<size_t>(N * s.H * s.Dv), -1.0f);
    wildcat_attention(Context{}, View4<const float>(q, {1, N, s.H, s.D}, {N * s.H * s.D, n_stride, s.D, 1}),
                      View4<const float>(in.k.data(), {1, s.M, s.Hkv, s.D}),
                      View4<const float>(in.v.data(), {1, s.M, s.Hkv, s.Dv}), options,
                      View4<float>(out.data(), {1, N, s.H, s.Dv}));
    return out;
  };
  const std::vector<float> one = attend(in.q.data(), 1, s.H * s.D);
  EXPECT_EQ(attend(in.q.data(), 1, 1), one);
  for (float x : one) EXPECT_TRUE(std::isfinite(x) && x != -1.0f);
  std::vector<float> repeated(static_cast<size_t>(s.N * s.H * s.D));
  for (int64_t i = 0; i < s.N; ++i)
    std::copy_n(in.q.data(), s.H * s.D, repeated.data() + i * s.H * s.D);
  EXPECT_EQ(attend(in.q.data(), s.N, 0), attend(repeated.data(), s.N, s.H * s.D));
}

TEST(WildcatHostile, NonFiniteInputsPropagate) {
  const Shape s{1, 6, 40, 4, 2, 8, 3};  // two kv heads of two query heads each
  for (float bad : {kNaN, kInf, -kInf}) {
    // A bad key in kv head 0: every row of query heads 0 and 1 is NaN; heads 2, 3 untouched.
    Inputs in = normal_inputs(s, 3);
    in.k[(7 * s.Hkv + 0) * s.D + 3] = bad;
    WildcatOptions options;
    options.rank = 16;
    std::vector<float> out = run(in, options);
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t c = 0; c < s.Dv; ++c) {
          const float x = out[((i * s.H) + h) * s.Dv + c];
          if (h < 2) {
            EXPECT_TRUE(std::isnan(x)) << "bad key " << bad << ": row " << i << " head " << h;
          } else {
            EXPECT_TRUE(std::isfinite(x)) << "row " << i << " head " << h;
          }
        }
    // A bad value in kv head 1: query heads 2 and 3 are NaN.
    in = normal_inputs(s, 4);
    in.v[(11 * s.Hkv + 1) * s.Dv + 2] = bad;
    out = run(in, options);
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < s.H; ++h) {
        const float x = out[((i * s.H) + h) * s.Dv + 2];
        EXPECT_EQ(std::isnan(x), h >= 2) << "bad value " << bad << ": row " << i << " head " << h;
      }
    // A bad query: its own row only.
    in = normal_inputs(s, 5);
    in.q[((2 * s.H) + 1) * s.D + 0] = bad;
    out = run(in, options);
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < s.H; ++h) {
        const float x = out[((i * s.H) + h) * s.Dv];
        EXPECT_EQ(std::isnan(x), i == 2 && h == 1) << "bad query " << bad << ": row " << i
                                                   << " head " << h;
      }
  }
}

TEST(WeightedKVHostile, EntriesWithoutARangeAttendWithoutTheClamp) {
  const float keys[2][2] = {{1, 0}, {0, 1}};
  const float values[2][3] = {{4, -4, 1}, {8, 2, 1}};  // [v, w]
  const float log_scales[2] = {0, 0};
  const float q[2] = {0.5f, -0.25f};
  float out[2] = {};
  WeightedKV kv;
  kv.keys = View4<const float>(&keys[0][0], {1, 1, 2, 2});
  kv.values = View4<const float>(&values[0][0], {1, 1, 2, 3});
  kv.log_scales = View3<const float>(log_scales, {1, 1, 2});
  weighted_kv_attention(Context{}, View4<const float>(q, {1, 1, 1, 2}), kv,
                        View4<float>(out, {1, 1, 1, 2}), 1.0);
  const double p0 = std::exp(0.5), p1 = std::exp(-0.25);
  EXPECT_NEAR(out[0], (p0 * 4 + p1 * 8) / (p0 + p1), 1e-5);
  EXPECT_NEAR(out[1], (p0 * -4 + p1 * 2) / (p0 + p1), 1e-5);
  // Heads with no entries: zeros.
  const int64_t none[2] = {0, 0};
  kv.keys = View4<const float>(&keys[0][0], {2, 1, 1, 2}, {2, 2, 2, 1});
  kv.values = View4<const float>(&values[0][0], {2, 1, 1, 3}, {3, 3, 3, 1});
  kv.log_scales = View3<const float>(log_scales, {2, 1, 1});
  kv.lengths = View2<const int64_t>(none, {2, 1});
  float zeros[4] = {1, 1, 1, 1};
  const float q2[4] = {1, 2, 3, 4};
  weighted_kv_attention(Context{}, View4<const float>(q2, {2, 1, 1, 2}), kv,
                        View4<float>(zeros, {2, 1, 1, 2}));
  for (float x : zeros) EXPECT_EQ(x, 0.0f);
}

TEST(WeightedKVHostile, EntriesRefuseBadWeightsAndLogScales) {
  const std::vector<float> k{1, 0, 0, 1}, v{1, 2};  // M = 2 tokens, D = 2, Dv = 1
  const View4<const float> keys(k.data(), {1, 2, 1, 2}), values(v.data(), {1, 2, 1, 1});
  auto entries = [&](float weight, float log_scale) {
    KVSelection selection;
    selection.batch = selection.kv_heads = selection.value_dim = 1;
    selection.heads.push_back({{1}, {3.0f}, {weight}, {log_scale}});
    return weighted_kv_entries(keys, values, selection);
  };
  EXPECT_THROW(entries(kNaN, 0.0f), Error);
  EXPECT_THROW(entries(kInf, 0.0f), Error);
  EXPECT_THROW(entries(1.0f, kNaN), Error);
  EXPECT_THROW(entries(1.0f, kInf), Error);
  const WeightedKVEntries e = entries(-0.5f, -kInf);  // Nyström weights may be negative
  EXPECT_EQ(e.lengths[0], 1);
  EXPECT_EQ(e.keys, (std::vector<float>{0, 1}));  // token 1's key
  EXPECT_EQ(e.values, (std::vector<float>{3.0f, -0.5f}));
  EXPECT_EQ(e.value_min, (std::vector<float>{1}));
  EXPECT_EQ(e.value_max, (std::vector<float>{2}));
}

TEST(WeightedKVHostile, NonFiniteKeysAndValuesPropagate) {
  const int64_t B = 1, M = 96, Hkv = 2, D = 4, Dv = 3, N = 5, H = 2;
  // An inf key is not in the list: exact attention gives it weight 0 in rows whose score is
  // -inf, so "propagate" there means finite rows, which the cache reproduces by keeping the
  // poisoned head's middle exactly (tested by the NaN key).
  for (float bad : {kNaN, kInf}) {
    for (bool in_value : {false, true}) {
      if (!in_value && std::isinf(bad)) continue;
      std::vector<float> k = random_vector<float>(B * M * Hkv * D, 7);
      std::vector<float> v = random_vector<float>(B * M * Hkv * Dv, 8);
      // Token 50 of kv head 0: in the compressed middle of CompressKV (sink 8, window 8).
      (in_value ? v[(50 * Hkv) * Dv + 1] : k[(50 * Hkv) * D + 2]) = bad;
      CompressKVOptions options;
      options.sink = 8;
      options.window = 8;
      options.bin_rank = 4;
      const View4<const float> kk(k.data(), {B, M, Hkv, D}), vv(v.data(), {B, M, Hkv, Dv});
      const WeightedKVEntries entries =
          weighted_kv_entries(kk, vv, CompressKV(options).select(Context{}, kk, vv));
      const std::vector<float> q = random_vector<float>(B * N * H * D, 9);
      std::vector<float> out(B * N * H * Dv);
      weighted_kv_attention(Context{}, View4<const float>(q.data(), {B, N, H, D}),
                            entries.view(), View4<float>(out.data(), {B, N, H, Dv}));
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < Dv; ++c) {
          const bool poisoned = !in_value || c == 1;
          EXPECT_EQ(!std::isfinite(out[(i * H + 0) * Dv + c]), poisoned)
              << "bad " << (in_value ? "value " : "key ") << bad << " row " << i << " col " << c;
          EXPECT_TRUE(std::isfinite(out[(i * H + 1) * Dv + c])) << "other kv head";
        }
    }
  }
}

TEST(CompressKVHostile, BinsRefusesNegativeLengths) {
  EXPECT_THROW(CompressKV(CompressKVOptions{}).bins(-1), Error);
  EXPECT_EQ(CompressKV(CompressKVOptions{}).bins(0), 0);
}

}  // namespace
}  // namespace subquad
