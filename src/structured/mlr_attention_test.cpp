// MLR attention: the dense reference against float64 finite differences, the fast kernel
// against the reference (forward and backward, sizes around tiles and blocks, GQA,
// block_divide, causal), one level against exact attention, decoding against the causal
// forward, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/test_support.h"
#include "exact/exact_ref.h"
#include "structured/mlr_ref.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::cast_vector;
using testing::expect_close_to_reference;
using testing::random_vector;

struct Shape {
  int64_t B, T, H, Hkv, Dv;
  std::vector<int64_t> ranks;
  bool causal, block_divide;
  int64_t D() const {
    int64_t d = 0;
    for (int64_t r : ranks) d += r;
    return d;
  }
};

// Inputs of one shape in precision T, from fixed seeds.
template <typename T>
struct Tensors {
  std::vector<T> q, k, v, dout;
  explicit Tensors(const Shape& s)
      : q(random_vector<T>(s.B * s.T * s.H * s.D(), 1, -2, 2)),
        k(random_vector<T>(s.B * s.T * s.Hkv * s.D(), 2, -2, 2)),
        v(random_vector<T>(s.B * s.T * s.Hkv * s.Dv, 3)),
        dout(random_vector<T>(s.B * s.T * s.H * s.Dv, 4)) {}
};

template <typename T>
struct Results {
  std::vector<T> out, lse, dq, dk, dv;
  explicit Results(const Shape& s)
      : out(s.B * s.T * s.H * s.Dv), lse(s.B * s.H * s.T), dq(s.B * s.T * s.H * s.D()),
        dk(s.B * s.T * s.Hkv * s.D()), dv(s.B * s.T * s.Hkv * s.Dv) {}
};

template <typename T>
View4<const T> view4(const std::vector<T>& data, std::array<int64_t, 4> shape) {
  return View4<const T>(data.data(), shape);
}
template <typename T>
View4<T> view4(std::vector<T>& data, std::array<int64_t, 4> shape) {
  return View4<T>(data.data(), shape);
}

template <typename T>
MlrOptions options_of(const Shape& s) {
  return MlrOptions{s.ranks, s.causal, s.block_divide};
}

// Runs the reference (fast = false) or the fast kernel in precision T (the fast kernel
// exists for float and double; long double runs the reference only).
template <typename T>
Results<T> run(const Shape& s, bool fast, const Context& context = {}) {
  const Tensors<T> in(s);
  Results<T> r(s);
  const int64_t D = s.D();
  const auto q = view4(in.q, {s.B, s.T, s.H, D}), k = view4(in.k, {s.B, s.T, s.Hkv, D});
  const auto v = view4(in.v, {s.B, s.T, s.Hkv, s.Dv}), dout = view4(in.dout, {s.B, s.T, s.H, s.Dv});
  const auto out = view4(r.out, {s.B, s.T, s.H, s.Dv});
  const View3<T> lse(r.lse.data(), {s.B, s.H, s.T});
  const auto dq = view4(r.dq, {s.B, s.T, s.H, D}), dk = view4(r.dk, {s.B, s.T, s.Hkv, D});
  const auto dv = view4(r.dv, {s.B, s.T, s.Hkv, s.Dv});
  const MlrOptions options = options_of<T>(s);
  if constexpr (!std::is_same_v<T, long double>) {
    if (fast) {
      mlr_attention_forward<T>(context, q, k, v, options, out, lse);
      mlr_attention_backward<T>(context, q, k, v, out, lse, dout, options, dq, dk, dv);
      return r;
    }
  }
  EXPECT_FALSE(fast);
  mlr_attention_reference_forward<T>(q, k, v, options, out, lse);
  mlr_attention_reference_backward<T>(q, k, v, dout, options, dq, dk, dv);
  return r;
}

void expect_fast_matches_reference(const Shape& s) {
  SCOPED_TRACE(::testing::Message() << "T = " << s.T << ", levels = " << s.ranks.size()
                                    << ", H = " << s.H << ", Hkv = " << s.Hkv
                                    << ", causal = " << s.causal
                                    << ", block_divide = " << s.block_divide);
  const Results<float> fast = run<float>(s, true);
  const Results<float> ref32 = run<float>(s, false);
  const Results<double> ref64 = run<double>(s, false);
  expect_close_to_reference(fast.out, ref32.out, ref64.out);
  expect_close_to_reference(fast.lse, ref32.lse, ref64.lse);
  expect_close_to_reference(fast.dq, ref32.dq, ref64.dq);
  expect_close_to_reference(fast.dk, ref32.dk, ref64.dk);
  expect_close_to_reference(fast.dv, ref32.dv, ref64.dv);
  EXPECT_GT(testing::max_abs(fast.out), 0.0);
  // With one token P = 1 and dS = P (dP - D_i) = 0: dq is exactly zero there.
  if (s.T > 1) {
    EXPECT_GT(testing::max_abs(fast.dq), 0.0);
  }
}

TEST(MlrReference, BackwardMatchesFiniteDifferences) {
  for (bool causal : {false, true})
    for (bool block_divide : {false, true}) {
      const Shape s{1, 12, 2, 1, 3, {2, 1, 1}, causal, block_divide};
      const Tensors<double> in(s);
      const Results<double> ref = run<double>(s, false);
      const int64_t D = s.D();
      // loss = <out, dout> as a function of the concatenation (q, k, v).
      std::vector<double> x = in.q;
      x.insert(x.end(), in.k.begin(), in.k.end());
      x.insert(x.end(), in.v.begin(), in.v.end());
      const size_t nq = in.q.size(), nk = in.k.size();
      auto loss = [&](const std::vector<double>& z) {
        std::vector<double> out(in.dout.size());
        mlr_attention_reference_forward<double>(
            View4<const double>(z.data(), {s.B, s.T, s.H, D}),
            View4<const double>(z.data() + nq, {s.B, s.T, s.Hkv, D}),
            View4<const double>(z.data() + nq + nk, {s.B, s.T, s.Hkv, s.Dv}), options_of<double>(s),
            View4<double>(out.data(), {s.B, s.T, s.H, s.Dv}), View3<double>());
        double total = 0;
        for (size_t i = 0; i < out.size(); ++i) total += out[i] * in.dout[i];
        return total;
      };
      const std::vector<double> numeric = testing::finite_difference_gradient(x, loss);
      std::vector<double> analytic = ref.dq;
      analytic.insert(analytic.end(), ref.dk.begin(), ref.dk.end());
      analytic.insert(analytic.end(), ref.dv.begin(), ref.dv.end());
      EXPECT_LT(testing::max_abs_diff(numeric, analytic), 1e-7)
          << "causal " << causal << " block_divide " << block_divide;
    }
}

TEST(MlrFast, MatchesReferenceOneLevelAnyLength) {
  for (int64_t T : {1, 2, 7, 63, 64, 65, 97})
    for (bool causal : {false, true}) expect_fast_matches_reference({1, T, 2, 2, 5, {6}, causal, false});
}

TEST(MlrFast, MatchesReferenceThreeLevelsOddBlocks) {
  for (int64_t T : {24, 40, 132})
    for (bool causal : {false, true})
      for (bool block_divide : {false, true})
        expect_fast_matches_reference({1, T, 2, 1, 3, {4, 2, 2}, causal, block_divide});
}

TEST(MlrFast, MatchesReferenceAcrossTileBoundaries) {
  // Finest blocks of 65, 48 and 96 tokens straddle the 64-token tiles.
  expect_fast_matches_reference({1, 130, 1, 1, 4, {3, 2}, true, true});
  expect_fast_matches_reference({1, 192, 2, 2, 4, {3, 3, 2}, false, true});
  expect_fast_matches_reference({1, 192, 2, 2, 4, {3, 3}, true, false});
}

TEST(MlrFast, MatchesReferenceEightLevelsGqa) {
  expect_fast_matches_reference({2, 256, 4, 2, 16, {32, 8, 6, 4, 4, 4, 4, 2}, true, true});
  expect_fast_matches_reference({1, 128, 3, 1, 7, {5, 3, 1, 1, 1, 1, 1, 1}, false, false});
}

// The tolerance rule one precision up: the fast float64 result against a long double
// reference, at most 2x the float64 reference's own error plus a few float64 ulps.
void expect_double_close(const std::vector<double>& fast, const std::vector<double>& reference64,
                         const std::vector<long double>& reference80) {
  ASSERT_TRUE(testing::all_finite(fast));
  const double reference_error = testing::max_abs_diff(reference64, reference80);
  const double floor =
      8 * std::numeric_limits<double>::epsilon() * std::max(1.0, testing::max_abs(reference80));
  EXPECT_LE(testing::max_abs_diff(fast, reference80), 2 * reference_error + floor)
      << "float64 reference error " << reference_error;
}

TEST(MlrFast, DoubleMatchesLongDoubleReference) {
  // Two key blocks, a finest level of 48 tokens straddling them, D = 9 (not whole vectors).
  for (bool causal : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "causal = " << causal);
    const Shape s{1, 192, 2, 1, 5, {4, 3, 2}, causal, true};
    const Results<double> fast = run<double>(s, true), ref64 = run<double>(s, false);
    const Results<long double> ref80 = run<long double>(s, false);
    expect_double_close(fast.out, ref64.out, ref80.out);
    expect_double_close(fast.lse, ref64.lse, ref80.lse);
    expect_double_close(fast.dq, ref64.dq, ref80.dq);
    expect_double_close(fast.dk, ref64.dk, ref80.dk);
    expect_double_close(fast.dv, ref64.dv, ref80.dv);
    EXPECT_GT(testing::max_abs(fast.dk), 0.0);
  }
}

TEST(MlrFast, OneFullLevelEqualsExactAttentionWithScaleOneOverD) {
  const Shape s{1, 70, 2, 1, 6, {9}, true, false};
  const Results<float> fast = run<float>(s, true);
  const Tensors<double> in(s);
  std::vector<double> out(s.B * s.T * s.H * s.Dv), lse(s.B * s.H * s.T);
  ExactOptions exact;
  exact.scale = 1.0 / 9;
  exact.causal = true;
  exact_attention_reference_forward<double>(
      view4(in.q, {s.B, s.T, s.H, 9}), view4(in.k, {s.B, s.T, s.Hkv, 9}),
      view4(in.v, {s.B, s.T, s.Hkv, s.Dv}), exact, view4(out, {s.B, s.T, s.H, s.Dv}),
      View3<double>(lse.data(), {s.B, s.H, s.T}));
  const Results<float> ref32 = run<float>(s, false);
  expect_close_to_reference(fast.out, ref32.out, out);
  expect_close_to_reference(fast.lse, ref32.lse, lse);
}

TEST(MlrFast, DeterministicAcrossRunsWithThreads) {
  const Shape s{1, 208, 2, 1, 8, {4, 2, 2, 2, 2}, true, true};
  const Context context{Device::cpu, 2};
  const Results<float> a = run<float>(s, true, context), b = run<float>(s, true, context);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

TEST(MlrFast, AcceptsNonContiguousViews) {
  // q, k, v are the first head-dim columns of wider rows, as a slice of a fused QKV buffer.
  const Shape s{1, 40, 2, 2, 4, {3, 1, 2}, true, false};
  const int64_t D = s.D(), width = 3 * D;
  const Tensors<float> in(s);
  std::vector<float> fused(s.T * s.H * width, 7.0f);
  for (int64_t i = 0; i < s.T * s.H; ++i)
    for (int64_t c = 0; c < D; ++c) {
      fused[i * width + c] = in.q[i * D + c];
      fused[i * width + D + c] = in.k[i * D + c];
    }
  const std::array<int64_t, 4> shape{1, s.T, s.H, D}, strides{s.T * s.H * width, s.H * width, width, 1};
  const View4<const float> q(fused.data(), shape, strides), k(fused.data() + D, shape, strides);
  std::vector<float> out(s.T * s.H * s.Dv), out_contiguous(out.size());
  const View4<const float> v(in.v.data(), {1, s.T, s.H, s.Dv});
  mlr_attention_forward<float>({}, q, k, v, options_of<float>(s), view4(out, {1, s.T, s.H, s.Dv}),
                               View3<float>());
  mlr_attention_forward<float>({}, view4(in.q, shape), view4(in.k, shape), v, options_of<float>(s),
                               view4(out_contiguous, {1, s.T, s.H, s.Dv}), View3<float>());
  EXPECT_EQ(out, out_contiguous);
}

TEST(MlrFast, NanScorePropagatesToTheGradients) {
  // A NaN in one query makes its scores NaN: its output row and, through P^T dout, every dv row
  // must say so rather than treat the NaN weights as 0.
  const int64_t T = 16, D = 8;
  std::vector<float> q = random_vector<float>(T * D, 11, -1, 1);
  const std::vector<float> k = random_vector<float>(T * D, 12, -1, 1),
                           v = random_vector<float>(T * D, 13, -1, 1),
                           g = random_vector<float>(T * D, 14, -1, 1);
  q[3] = std::numeric_limits<float>::quiet_NaN();  // query 0
  const std::array<int64_t, 4> shape{1, T, 1, D};
  const MlrOptions options{{4, 4}, false, false};
  std::vector<float> out(T * D), lse(T), dq(T * D), dk(T * D), dv(T * D);
  mlr_attention_forward<float>({}, view4(q, shape), view4(k, shape), view4(v, shape), options,
                               view4(out, shape), View3<float>(lse.data(), {1, 1, T}));
  mlr_attention_backward<float>({}, view4(q, shape), view4(k, shape), view4(v, shape),
                                view4(out, shape), View3<const float>(lse.data(), {1, 1, T}),
                                view4(g, shape), options, view4(dq, shape), view4(dk, shape),
                                view4(dv, shape));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_FALSE(std::isnan(out[D]));  // other rows do not read query 0
  for (int64_t j = 0; j < T; ++j) EXPECT_TRUE(std::isnan(dv[j * D])) << "dv row " << j;
}

TEST(MlrFast, RejectsBadInput) {
  std::vector<float> q(1 * 12 * 2 * 8), k(q.size()), v(q.size()), out(q.size());
  const View4<const float> q4(q.data(), {1, 12, 2, 8}), k4(k.data(), {1, 12, 2, 8});
  const View4<const float> v4(v.data(), {1, 12, 2, 8});
  const View4<float> out4(out.data(), {1, 12, 2, 8});
  auto forward = [&](std::vector<int64_t> ranks, View4<const float> kk) {
    mlr_attention_forward<float>({}, q4, kk, v4, MlrOptions{ranks, false, false}, out4,
                                 View3<float>());
  };
  EXPECT_THROW(forward({4, 2}, k4), Error);           // ranks sum to 6, not 8
  EXPECT_THROW(forward({4, 2, 1, 1}, k4), Error);     // T = 12 not divisible by 8
  EXPECT_THROW(forward({}, k4), Error);               // no levels
  EXPECT_THROW(forward({8, 0}, k4), Error);           // zero rank
  EXPECT_THROW(forward({4, 4}, View4<const float>(k.data(), {1, 12, 2, 4})), Error);  // D
  EXPECT_THROW(forward({4, 4}, View4<const float>(k.data(), {1, 6, 2, 8})), Error);   // T
  EXPECT_NO_THROW(forward({4, 2, 2}, k4));
  std::vector<float> g(q.size());
  EXPECT_THROW(mlr_attention_backward<float>({}, q4, k4, v4, out4, View3<const float>(), v4,
                                             MlrOptions{{8}, false, false},
                                             View4<float>(g.data(), {1, 12, 2, 8}),
                                             View4<float>(g.data(), {1, 12, 2, 8}),
                                             View4<float>(g.data(), {1, 12, 2, 8})),
               Error);  // backward without lse
}

TEST(MlrModel, FlopAndCacheModels) {
  const std::vector<int64_t> ranks{32, 8, 6, 4, 4, 4, 4, 2};
  EXPECT_DOUBLE_EQ(mlr_score_macs(8, {4, 4}), 64.0 * (4 + 2));
  EXPECT_EQ(mlr_key_cache_prediction(1024, ranks),
            1024 * 32 + 512 * 8 + 256 * 6 + 128 * 4 + 64 * 4 + 32 * 4 + 16 * 4 + 8 * 2);
}

}  // namespace
}  // namespace subquad
