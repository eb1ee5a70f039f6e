// Exact attention on adversarial inputs: more queries than keys with causal masks and
// windows wider than M (up to the largest int64), peaked softmax from large scales, D = 1,
// GQA on strided views; forward and backward against the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "exact/exact_test_util.h"

namespace subquad::testing {
namespace {

// Forward and backward of the fast path against the float64 reference by the tolerance
// rule, plus finiteness of every output.
void expect_matches_reference(const AttentionShape& s, const ExactOptions& options,
                              double input_scale = 1.0) {
  SCOPED_TRACE(::testing::Message() << s << " scale " << options.scale.value_or(0.0));
  Inputs<double> x64 = make_inputs(s, 31);
  for (double& e : x64.q) e *= input_scale;
  const Inputs<float> x32 = cast_inputs<float>(x64);
  AttentionShape shape = s;
  auto forward = [&](auto x, bool fast) {
    using T = typename decltype(x.q)::value_type;
    Forward<T> f{std::vector<T>(s.out_size()), std::vector<T>(s.lse_size())};
    View4<T> out(f.out.data(), {s.B, s.N, s.H, s.Dv});
    View3<T> lse(f.lse.data(), {s.B, s.H, s.N});
    if (fast)
      exact_attention_forward<T>(Context{Device::cpu, 1}, q_view(shape, x.q), k_view(shape, x.k),
                                 v_view(shape, x.v), options, out, lse);
    else
      exact_attention_reference_forward<T>(q_view(shape, x.q), k_view(shape, x.k),
                                           v_view(shape, x.v), options, out, lse);
    return f;
  };
  auto backward = [&](auto x, const auto& f, bool fast) {
    using T = typename decltype(x.q)::value_type;
    Backward<T> g{std::vector<T>(s.q_size()), std::vector<T>(s.k_size()),
                  std::vector<T>(s.v_size())};
    View4<T> dq(g.dq.data(), {s.B, s.N, s.H, s.D});
    View4<T> dk(g.dk.data(), {s.B, s.M, s.Hkv, s.D});
    View4<T> dv(g.dv.data(), {s.B, s.M, s.Hkv, s.Dv});
    View3<const T> lse(f.lse.data(), {s.B, s.H, s.N});
    if (fast)
      exact_attention_backward<T>(Context{Device::cpu, 1}, q_view(shape, x.q),
                                  k_view(shape, x.k), v_view(shape, x.v), out_view(shape, f.out),
                                  lse, out_view(shape, x.dout), View3<const T>(), options, dq,
                                  dk, dv);
    else
      exact_attention_reference_backward<T>(q_view(shape, x.q), k_view(shape, x.k),
                                            v_view(shape, x.v), out_view(shape, f.out), lse,
                                            out_view(shape, x.dout), View3<const T>(), options,
                                            dq, dk, dv);
    return g;
  };
  const Forward<double> ref64 = forward(x64, false);
  const Forward<float> ref32 = forward(x32, false), fast = forward(x32, true);
  {
    SCOPED_TRACE("out");
    expect_close_to_reference(fast.out, ref32.out, ref64.out);
  }
  {
    SCOPED_TRACE("lse");
    expect_lse_close(fast.lse, ref32.lse, ref64.lse);
  }
  // The gradients cancel: dS = P (dP - rowsum(dO * O)) with dP and the row sum each of
  // magnitude Dv |dO| |V|, then dq, dk multiply by scale |k| or |q|. Their float32 round-off
  // is that product times eps, which a peaked softmax (large scale) exposes while the float32
  // reference, summing in the same order as its forward, can cancel exactly.
  const double magnitude = 2.0;  // make_inputs draws q, k, v from [-2, 2), dO from [-1, 1)
  const double backward_floor_ulps =
      std::max(8.0, options.scale.value_or(1.0 / std::sqrt(double(s.D))) * s.Dv * magnitude *
                        magnitude * input_scale);
  const Backward<double> g64 = backward(x64, ref64, false);
  const Backward<float> g32 = backward(x32, ref32, false), gfast = backward(x32, fast, true);
  for (const auto& [name, a, b, c] :
       {std::tuple{"dq", &gfast.dq, &g32.dq, &g64.dq}, std::tuple{"dk", &gfast.dk, &g32.dk, &g64.dk},
        std::tuple{"dv", &gfast.dv, &g32.dv, &g64.dv}}) {
    SCOPED_TRACE(name);
    expect_close_to_reference(*a, *b, *c, 2.0, backward_floor_ulps);
  }
}

ExactOptions options(bool causal, int64_t window, std::optional<double> scale = {}) {
  ExactOptions o;
  o.causal = causal;
  o.window = window;
  o.scale = scale;
  return o;
}

TEST(ExactAdversarial, MoreQueriesThanKeysCausalAndWindows) {
  const AttentionShape s{1, 203, 61, 2, 1, 17, 9};
  for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{61}, int64_t{62},
                         int64_t{1000}})
    expect_matches_reference(s, options(true, window));
}

TEST(ExactAdversarial, WindowsWiderThanAnyRangeEqualPlainCausal) {
  const AttentionShape s{1, 70, 131, 2, 2, 8, 8, true};
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (int64_t window : {huge, huge - 1, huge / 2}) expect_matches_reference(s, options(true, window));
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 5));
  const Forward<float> causal = run_forward(s, x, true);
  AttentionShape windowed = s;
  windowed.window = huge;
  EXPECT_EQ(run_forward(windowed, x, true).out, causal.out);
}

TEST(ExactAdversarial, PeakedSoftmaxFromLargeScale) {
  const AttentionShape s{1, 97, 83, 4, 2, 16, 16};
  for (double scale : {1e2, 1e4})
    for (bool causal : {false, true}) expect_matches_reference(s, options(causal, 0, scale));
  // Scores of 1e4 through the inputs instead of the scale.
  expect_matches_reference(s, options(false, 0), 1e3);
}

TEST(ExactAdversarial, TinyScaleIsNearlyUniform) {
  const AttentionShape s{1, 33, 200, 2, 1, 8, 5};
  expect_matches_reference(s, options(false, 0, 1e-30));
  expect_matches_reference(s, options(true, 7, 1e-30));
}

// A scale that is 0 or infinite once rounded to float would turn masked scores (-inf) into
// NaN (-inf * 0) or finite ones into +-inf: rejected for float, accepted for double.
TEST(ExactAdversarial, ScalesOutsideTheFloatRangeAreRejectedForFloat) {
  const AttentionShape s{1, 5, 9, 1, 1, 4, 4, true, 3};
  const Inputs<double> x64 = make_inputs(s, 3);
  const Inputs<float> x32 = cast_inputs<float>(x64);
  std::vector<float> out(s.out_size()), lse(s.lse_size());
  for (double scale : {std::numeric_limits<double>::denorm_min(), 1e-45, 1e39}) {
    SCOPED_TRACE(scale);
    EXPECT_THROW(exact_attention_forward<float>(
                     {}, q_view(s, x32.q), k_view(s, x32.k), v_view(s, x32.v),
                     options(true, 3, scale), View4<float>(out.data(), {s.B, s.N, s.H, s.Dv}),
                     View3<float>(lse.data(), {s.B, s.H, s.N})),
                 Error);
  }
  std::vector<double> out64(s.out_size());
  exact_attention_forward<double>({}, q_view(s, x64.q), k_view(s, x64.k), v_view(s, x64.v),
                                  options(true, 3, 1e39),
                                  View4<double>(out64.data(), {s.B, s.N, s.H, s.Dv}), {});
  EXPECT_TRUE(all_finite(out64));
}

TEST(ExactAdversarial, HeadDimOne) {
  for (const AttentionShape& s : {AttentionShape{2, 65, 65, 3, 1, 1, 1},
                                  AttentionShape{1, 1, 300, 1, 1, 1, 2},
                                  AttentionShape{1, 300, 2, 1, 1, 1, 1}})
    for (bool causal : {false, true}) expect_matches_reference(s, options(causal, 0), 10.0);
}

// GQA (6 query heads over 2 kv heads) where q, k, v are column slices of one fused buffer
// [B, N, 3, H, D] and dq, dk, dv are written into padded rows.
TEST(ExactAdversarial, GqaOnStridedViewsMatchesContiguous) {
  const AttentionShape s{2, 45, 45, 6, 2, 13, 13, true, 11};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 9));
  const Forward<float> f = run_forward(s, x, true);
  const Backward<float> g = run_backward(s, x, f, true);
  const int64_t row = (s.H + 2 * s.Hkv) * s.D + 3;  // floats per token, with a gap
  std::vector<float> fused(s.B * s.N * row, std::numeric_limits<float>::quiet_NaN());
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.N; ++i) {
      float* r = fused.data() + (b * s.N + i) * row;
      for (int64_t e = 0; e < s.H * s.D; ++e) r[e] = x.q[(b * s.N + i) * s.H * s.D + e];
      for (int64_t e = 0; e < s.Hkv * s.D; ++e) {
        r[s.H * s.D + e] = x.k[(b * s.N + i) * s.Hkv * s.D + e];
        r[(s.H + s.Hkv) * s.D + e] = x.v[(b * s.N + i) * s.Hkv * s.D + e];
      }
    }
  const std::array<int64_t, 4> qs{s.N * row, row, s.D, 1};
  const View4<const float> q(fused.data(), {s.B, s.N, s.H, s.D}, qs);
  const View4<const float> k(fused.data() + s.H * s.D, {s.B, s.N, s.Hkv, s.D}, qs);
  const View4<const float> v(fused.data() + (s.H + s.Hkv) * s.D, {s.B, s.N, s.Hkv, s.D}, qs);
  const int64_t pad = 5;
  std::vector<float> out(s.B * s.N * s.H * (s.D + pad)), lse(s.lse_size());
  std::vector<float> dq(out.size()), dk(s.B * s.N * s.Hkv * (s.D + pad)), dv(dk.size());
  auto padded = [&](std::vector<float>& data, int64_t heads) {
    return View4<float>(data.data(), {s.B, s.N, heads, s.D},
                        {s.N * heads * (s.D + pad), heads * (s.D + pad), s.D + pad, 1});
  };
  const View3<float> l(lse.data(), {s.B, s.H, s.N});
  exact_attention_forward<float>(Context{Device::cpu, 1}, q, k, v, s.options(), padded(out, s.H),
                                 l);
  const std::vector<float> dout_copy = x.dout;
  exact_attention_backward<float>(
      Context{Device::cpu, 1}, q, k, v, View4<const float>(padded(out, s.H)), l,
      View4<const float>(dout_copy.data(), {s.B, s.N, s.H, s.D}),
      View3<const float>(x.dlse.data(), {s.B, s.H, s.N}), s.options(), padded(dq, s.H),
      padded(dk, s.Hkv), padded(dv, s.Hkv));
  auto unpad = [&](const std::vector<float>& data, int64_t heads) {
    std::vector<float> result;
    for (size_t i = 0; i < data.size(); ++i)
      if (static_cast<int64_t>(i) % (s.D + pad) < s.D) result.push_back(data[i]);
    EXPECT_EQ(static_cast<int64_t>(result.size()), s.B * s.N * heads * s.D);
    return result;
  };
  EXPECT_EQ(unpad(out, s.H), f.out);
  EXPECT_EQ(lse, f.lse);
  EXPECT_EQ(unpad(dq, s.H), g.dq);
  EXPECT_EQ(unpad(dk, s.Hkv), g.dk);
  EXPECT_EQ(unpad(dv, s.Hkv), g.dv);
}

// Scores of about 1e10 (float) and 1e40 (double): one-hot rows. The exponent s c - max is
// one multiply-add whose value at the maximum is the rounding error of max, hundreds of
// units at these magnitudes; 2^x of it must not overflow into inf / inf = NaN.
TEST(ExactAdversarial, HugeScoresGiveOneHotRows) {
  const AttentionShape s{1, 37, 41, 2, 1, 16, 8, true};
  Inputs<double> x64 = make_inputs(s, 17);
  for (double& e : x64.q) e *= 1e9;
  const Inputs<float> x32 = cast_inputs<float>(x64);
  const Forward<float> fast = run_forward(s, x32, true), ref32 = run_forward(s, x32, false);
  const Forward<double> ref64 = run_forward(s, x64, false);
  expect_close_to_reference(fast.out, ref32.out, ref64.out);
  const Backward<float> g = run_backward(s, x32, fast, true);
  EXPECT_TRUE(all_finite(g.dq) && all_finite(g.dk) && all_finite(g.dv));
  std::vector<double> out64(s.out_size());
  exact_attention_forward<double>({}, q_view(s, x64.q), k_view(s, x64.k), v_view(s, x64.v),
                                  options(true, 0, 1e30),
                                  View4<double>(out64.data(), {s.B, s.N, s.H, s.Dv}), {});
  EXPECT_TRUE(all_finite(out64));
}

}  // namespace
}  // namespace subquad::testing
