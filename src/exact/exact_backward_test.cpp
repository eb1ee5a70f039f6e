// Exact attention backward: the float64 reference against finite differences, the fast
// float32 path against the float64 reference over odd sizes, GQA, masks; determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "exact/exact_test_util.h"

namespace subquad::testing {
namespace {

// loss = sum(out * dout) + sum(lse * dlse): its gradient is what the backward computes from
// dout and dlse. Rows that see no key have lse = -inf whatever the inputs: left out.
double loss(const AttentionShape& s, const Inputs<double>& x) {
  const Forward<double> f = run_forward(s, x, false);
  double total = 0;
  for (size_t i = 0; i < f.out.size(); ++i) total += f.out[i] * x.dout[i];
  for (size_t i = 0; i < x.dlse.size(); ++i)
    if (std::isfinite(f.lse[i])) total += f.lse[i] * x.dlse[i];
  return total;
}

void expect_matches_finite_differences(const AttentionShape& s, bool with_dlse) {
  Inputs<double> x = make_inputs(s, 21);
  if (!with_dlse) x.dlse.clear();
  const Backward<double> g = run_backward(s, x, run_forward(s, x, false), false);
  auto check = [&](std::vector<double> Inputs<double>::*member, const std::vector<double>& grad,
                   const char* name) {
    const std::vector<double> numeric =
        finite_difference_gradient(x.*member, [&](const std::vector<double>& values) {
          Inputs<double> y = x;
          y.*member = values;
          return loss(s, y);
        });
    EXPECT_LE(max_abs_diff(grad, numeric), 1e-7 * (1 + max_abs(numeric))) << name;
    EXPECT_GT(max_abs(grad), 0.0) << name;
  };
  check(&Inputs<double>::q, g.dq, "dq");
  check(&Inputs<double>::k, g.dk, "dk");
  check(&Inputs<double>::v, g.dv, "dv");
}

TEST(ExactReferenceBackward, MatchesFiniteDifferences) {
  for (bool with_dlse : {false, true}) {
    expect_matches_finite_differences({1, 5, 7, 2, 1, 3, 4}, with_dlse);
    expect_matches_finite_differences({2, 7, 5, 2, 2, 4, 3, true}, with_dlse);  // masked rows
    expect_matches_finite_differences({1, 6, 9, 3, 1, 5, 2, true, 3}, with_dlse);  // GQA 3/1
  }
}

TEST(ExactBackward, DlseOnlyMatchesReference) {
  // dout = 0: every gradient comes through lse (the log-partition's gradient is P).
  const AttentionShape s{1, 97, 59, 4, 2, 59, 16, true};
  Inputs<double> x = make_inputs(s, 37);
  std::fill(x.dout.begin(), x.dout.end(), 0.0);
  const Backward<double> ref = run_backward(s, x, run_forward(s, x, false), false);
  const Backward<double> fast = run_backward(s, x, run_forward(s, x, true), true);
  const double tolerance = 256 * std::numeric_limits<double>::epsilon() * std::log2(s.M + 2.0);
  EXPECT_LE(max_abs_diff(fast.dq, ref.dq), tolerance * (1 + max_abs(ref.dq)));
  EXPECT_LE(max_abs_diff(fast.dk, ref.dk), tolerance * (1 + max_abs(ref.dk)));
  EXPECT_GT(max_abs(fast.dq), 0.0);
  EXPECT_EQ(max_abs(fast.dv), 0.0);  // lse does not depend on v
}

class BackwardSweep : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(BackwardSweep, Float32MatchesFloat64Reference) {
  const AttentionShape s = GetParam();
  const Inputs<double> x64 = make_inputs(s, 31);
  const Inputs<float> x32 = cast_inputs<float>(x64);
  const Backward<double> ref64 = run_backward(s, x64, run_forward(s, x64, false), false);
  const Backward<float> ref32 = run_backward(s, x32, run_forward(s, x32, false), false);
  const Backward<float> fast = run_backward(s, x32, run_forward(s, x32, true), true);
  expect_close_to_reference(fast.dq, ref32.dq, ref64.dq);
  expect_close_to_reference(fast.dk, ref32.dk, ref64.dk);
  expect_close_to_reference(fast.dv, ref32.dv, ref64.dv);
  EXPECT_GT(max_abs(fast.dv), 0.0);
  if (s.M > 1) {  // with one key P = 1 whatever the scores: dq = dk = 0 exactly
    EXPECT_GT(max_abs(fast.dq), 0.0);
    EXPECT_GT(max_abs(fast.dk), 0.0);
  }
}

TEST_P(BackwardSweep, Float64MatchesFloat64Reference) {
  const AttentionShape s = GetParam();
  const Inputs<double> x = make_inputs(s, 32);
  const Forward<double> f = run_forward(s, x, false);
  const Backward<double> ref = run_backward(s, x, f, false);
  const Backward<double> fast = run_backward(s, x, f, true, 2);
  const double tolerance = 256 * std::numeric_limits<double>::epsilon() * std::log2(s.M + 2.0);
  EXPECT_LE(max_abs_diff(fast.dq, ref.dq), tolerance * (1 + max_abs(ref.dq)));
  EXPECT_LE(max_abs_diff(fast.dk, ref.dk), tolerance * (1 + max_abs(ref.dk)));
  EXPECT_LE(max_abs_diff(fast.dv, ref.dv), tolerance * (1 + max_abs(ref.dv)));
}

const AttentionShape kShapes[] = {
    {1, 1, 1, 1, 1, 1, 1},
    {1, 2, 7, 1, 1, 8, 8, true},
    {2, 7, 2, 8, 2, 59, 64, true},
    {1, 64, 64, 6, 3, 64, 64, true},
    {1, 97, 257, 8, 2, 64, 59},
    {1, 257, 97, 1, 1, 128, 128, true},
    {1, 1025, 1025, 1, 1, 64, 64, true},
    {1, 97, 1025, 2, 1, 128, 8, false, 100},
    {1, 257, 257, 6, 3, 59, 128, true, 64},
    {2, 1025, 64, 8, 2, 8, 16},
    {1, 1025, 7, 1, 1, 64, 64, false, 3},
};
INSTANTIATE_TEST_SUITE_P(Shapes, BackwardSweep, ::testing::ValuesIn(kShapes),
                         [](const auto& info) {
                           std::ostringstream name;
                           name << info.param;
                           return name.str();
                         });

// Both ways dQ is accumulated, under several threads: a task per (b, kv head) holding all of
// its heads' dQ (at least as many pairs as threads), and chunks of key blocks with partials
// summed afterwards (fewer pairs); GQA, a window, the causal diagonal in tiles cut by key
// blocks (M = 300: two blocks of 128 and 44 keys), head dims 59 and 128.
TEST(ExactBackward, Float32MatchesReferenceOnSeveralThreads) {
  const AttentionShape shapes[] = {
      {3, 130, 300, 6, 3, 59, 40, true, 70},  // 9 pairs: one chunk each
      {1, 300, 300, 4, 1, 64, 64, true},      // 1 pair: chunks of key blocks
      {2, 129, 257, 8, 2, 128, 128},          // 4 pairs on 3 threads: 2 chunks each
  };
  for (const AttentionShape& s : shapes) {
    const Inputs<double> x64 = make_inputs(s, 38);
    const Inputs<float> x32 = cast_inputs<float>(x64);
    const Backward<double> ref64 = run_backward(s, x64, run_forward(s, x64, false), false);
    const Backward<float> ref32 = run_backward(s, x32, run_forward(s, x32, false), false);
    const Forward<float> f = run_forward(s, x32, true);
    for (int threads : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << s << " threads " << threads);
      const Backward<float> fast = run_backward(s, x32, f, true, threads);
      expect_close_to_reference(fast.dq, ref32.dq, ref64.dq);
      expect_close_to_reference(fast.dk, ref32.dk, ref64.dk);
      expect_close_to_reference(fast.dv, ref32.dv, ref64.dv);
      EXPECT_GT(max_abs(fast.dq), 0.0);
      EXPECT_GT(max_abs(fast.dk), 0.0);
    }
  }
}

TEST(ExactBackward, DeterministicForAGivenThreadCount) {
  const AttentionShape s{1, 300, 301, 4, 1, 59, 64, true};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 33));
  const Forward<float> f = run_forward(s, x, true);
  for (int threads : {1, 3}) {
    const Backward<float> a = run_backward(s, x, f, true, threads);
    const Backward<float> b = run_backward(s, x, f, true, threads);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

TEST(ExactBackward, StridedViewsMatchContiguous) {
  // q, k, v sliced out of a packed [B, N, 3, H, D] tensor; dq, dk, dv written into a packed
  // gradient tensor of the same layout.
  const AttentionShape s{2, 70, 70, 4, 4, 24, 24, true};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 36));
  const Forward<float> f = run_forward(s, x, true);
  const Backward<float> expected = run_backward(s, x, f, true);
  const int64_t packed_size = s.B * s.N * 3 * s.H * s.D;
  std::vector<float> qkv(packed_size), grads(packed_size, 7.0f);
  const std::array<int64_t, 4> strides{s.N * 3 * s.H * s.D, 3 * s.H * s.D, s.D, 1};
  auto at = [&](std::vector<float>& t, int part) {
    return View4<float>(t.data() + part * s.H * s.D, {s.B, s.N, s.H, s.D}, strides);
  };
  for (int part = 0; part < 3; ++part) {
    const std::vector<float>& src = part == 0 ? x.q : part == 1 ? x.k : x.v;
    const View4<float> dst = at(qkv, part);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < s.D; ++d)
            dst(b, i, h, d) = src[((b * s.N + i) * s.H + h) * s.D + d];
  }
  exact_attention_backward<float>(Context{Device::cpu, 1}, at(qkv, 0), at(qkv, 1), at(qkv, 2),
                                  out_view(s, f.out),
                                  View3<const float>(f.lse.data(), {s.B, s.H, s.N}),
                                  out_view(s, x.dout),
                                  View3<const float>(x.dlse.data(), {s.B, s.H, s.N}),
                                  s.options(), at(grads, 0), at(grads, 1), at(grads, 2));
  for (int part = 0; part < 3; ++part) {
    const std::vector<float>& want =
        part == 0 ? expected.dq : part == 1 ? expected.dk : expected.dv;
    const View4<float> got = at(grads, part);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < s.D; ++d)
            ASSERT_EQ(got(b, i, h, d), want[((b * s.N + i) * s.H + h) * s.D + d]) << part;
  }
}

TEST(ExactBackward, NoKeysGivesZeroGradients) {
  const AttentionShape s{1, 4, 0, 2, 1, 3, 5};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 34));
  const Backward<float> g = run_backward(s, x, run_forward(s, x, true), true);
  for (float d : g.dq) EXPECT_EQ(d, 0.0f);
}

TEST(ExactBackward, RejectsMissingLseAndBadGradientShapes) {
  const AttentionShape s{1, 4, 5, 2, 1, 8, 8};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 35));
  const Forward<float> f = run_forward(s, x, true);
  std::vector<float> dq(s.q_size()), dk(s.k_size()), dv(s.v_size());
  const Context context{Device::cpu, 1};
  const View4<float> dq_view(dq.data(), {s.B, s.N, s.H, s.D});
  const View4<float> dk_view(dk.data(), {s.B, s.M, s.Hkv, s.D});
  const View4<float> dv_view(dv.data(), {s.B, s.M, s.Hkv, s.Dv});
  const View3<const float> lse(f.lse.data(), {s.B, s.H, s.N});
  auto call = [&](View3<const float> l, View4<float> gq, View4<float> gk,
                  View3<const float> dl = View3<const float>()) {
    exact_attention_backward<float>(context, q_view(s, x.q), k_view(s, x.k), v_view(s, x.v),
                                    out_view(s, f.out), l, out_view(s, x.dout), dl, s.options(),
                                    gq, gk, dv_view);
  };
  EXPECT_NO_THROW(call(lse, dq_view, dk_view));
  EXPECT_NO_THROW(call(lse, dq_view, dk_view, lse));
  EXPECT_THROW(call(lse, dq_view, dk_view, View3<const float>(f.lse.data(), {s.B, s.H, s.N - 1})),
               Error);
  EXPECT_THROW(call(View3<const float>(), dq_view, dk_view), Error);
  EXPECT_THROW(call(lse, View4<float>(dq.data(), {s.B, s.N, s.H, s.D - 1}), dk_view), Error);
  EXPECT_THROW(call(lse, dq_view, View4<float>(dk.data(), {s.B, s.M, s.Hkv + 1, s.D})), Error);
}

}  // namespace
}  // namespace subquad::testing
