// Fast exact attention forward vs the float64 reference over odd sizes, GQA, causal and
// window masks; fully masked rows; determinism; strided views; float64 path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "exact/exact_internal.h"
#include "exact/exact_test_util.h"

namespace subquad::testing {
namespace {

class ForwardSweep : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(ForwardSweep, Float32MatchesFloat64Reference) {
  const AttentionShape s = GetParam();
  const Inputs<double> x64 = make_inputs(s, 11);
  const Inputs<float> x32 = cast_inputs<float>(x64);
  const Forward<double> ref64 = run_forward(s, x64, false);
  const Forward<float> ref32 = run_forward(s, x32, false);
  const Forward<float> fast = run_forward(s, x32, true);
  expect_close_to_reference(fast.out, ref32.out, ref64.out);
  expect_lse_close(fast.lse, ref32.lse, ref64.lse);
  EXPECT_GT(max_abs(fast.out), 0.0) << "output is all zeros";
}

TEST_P(ForwardSweep, Float64MatchesFloat64Reference) {
  const AttentionShape s = GetParam();
  const Inputs<double> x = make_inputs(s, 12);
  const Forward<double> ref = run_forward(s, x, false);
  const Forward<double> fast = run_forward(s, x, true, 2);
  const double tolerance = 64 * std::numeric_limits<double>::epsilon() * std::log2(s.M + 2.0);
  EXPECT_LE(max_abs_diff(fast.out, ref.out), tolerance * (1 + max_abs(ref.out)));
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i]))
      EXPECT_EQ(fast.lse[i], ref.lse[i]);
    else
      EXPECT_NEAR(fast.lse[i], ref.lse[i], tolerance * (1 + std::abs(ref.lse[i])));
  }
}

// N, M in {1, 2, 7, 64, 97, 257, 1025}, M != N, D in {1, 8, 59, 64, 128}, Dv != D,
// H / Hkv in {1/1, 8/2, 6/3}, causal (N > M gives fully masked rows) and windows.
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
    {1, 1, 1025, 1, 1, 1, 1},
    {2, 1025, 64, 8, 2, 8, 16},
    {1, 1025, 7, 1, 1, 64, 64, false, 3},
    {1, 257, 1025, 6, 3, 128, 64, true},
};
INSTANTIATE_TEST_SUITE_P(Shapes, ForwardSweep, ::testing::ValuesIn(kShapes),
                         [](const auto& info) {
                           std::ostringstream name;
                           name << info.param;
                           return name.str();
                         });

TEST(ExactForward, FullyMaskedRowsAreZeroWithMinusInfLse) {
  // Causal with N > M: the first N - M queries see no key.
  const AttentionShape s{1, 97, 7, 2, 1, 16, 8, true};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 3));
  const Forward<float> f = run_forward(s, x, true);
  for (int64_t i = 0; i < s.N; ++i)
    for (int64_t h = 0; h < s.H; ++h) {
      const bool masked = i < s.N - s.M;
      EXPECT_EQ(std::isinf(f.lse[h * s.N + i]), masked) << "row " << i;
      if (!masked) continue;
      for (int64_t d = 0; d < s.Dv; ++d) EXPECT_EQ(f.out[(i * s.H + h) * s.Dv + d], 0.0f);
    }
}

TEST(ExactForward, NoKeysGivesZerosAndMinusInf) {
  const AttentionShape s{2, 5, 0, 2, 2, 4, 3};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 4));
  const Forward<float> f = run_forward(s, x, true);
  for (float o : f.out) EXPECT_EQ(o, 0.0f);
  for (float l : f.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
}

TEST(ExactForward, EmptyBatchQueriesOrHeadsAreNoOps) {
  for (const AttentionShape& s : {AttentionShape{1, 0, 9, 2, 1, 4, 3},
                                 AttentionShape{0, 5, 9, 2, 1, 4, 3},
                                 AttentionShape{1, 5, 9, 0, 1, 4, 3},
                                 AttentionShape{1, 5, 9, 2, 1, 4, 0}}) {
    const Inputs<float> x = cast_inputs<float>(make_inputs(s, 5));
    EXPECT_NO_THROW(run_forward(s, x, true)) << s;
    EXPECT_NO_THROW(run_backward(s, x, run_forward(s, x, true), true)) << s;
  }
}

TEST(ExactForward, DeterministicAcrossRunsAndThreadCounts) {
  const AttentionShape s{2, 300, 301, 8, 2, 59, 64, true};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 6));
  const Forward<float> a = run_forward(s, x, true, 1);
  const Forward<float> b = run_forward(s, x, true, 1);
  const Forward<float> c = run_forward(s, x, true, 3);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  // Each query row is computed by one task in a fixed key order: thread count is irrelevant.
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(a.lse, c.lse);
}

TEST(ExactForward, HeadInterleavedCopiesMatchInPlaceReads) {
  // K and V of 4 kv heads, 4099 x 4 x (64 + 63) floats (8.3 MB): past
  // Blocks::kInPlaceBytes the forward reads contiguous copies of each head's rows. Each kv
  // head with its query group alone (Hkv = 1: read in place, as the sweep above checks
  // against the reference) gives the same bits: the copy moves the rows, not the
  // arithmetic. Causal (N < M, bottom-right) with a window: key blocks start mid-copy.
  const AttentionShape s{1, 193, 4099, 8, 4, 64, 63, true, 1000};
  ASSERT_GT(static_cast<double>(s.M * s.Hkv * (s.D + s.Dv) * sizeof(float)),
            exact_detail::Blocks<float>::kInPlaceBytes);
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 13));
  const Forward<float> all = run_forward(s, x, true);
  const int64_t group = s.H / s.Hkv;
  const AttentionShape one{1, s.N, s.M, group, 1, s.D, s.Dv, true, 1000};
  for (int64_t g = 0; g < s.Hkv; ++g) {
    Inputs<float> y;
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        y.q.insert(y.q.end(), x.q.begin() + (i * s.H + h) * s.D,
                   x.q.begin() + (i * s.H + h + 1) * s.D);
    for (int64_t j = 0; j < s.M; ++j) {
      y.k.insert(y.k.end(), x.k.begin() + (j * s.Hkv + g) * s.D,
                 x.k.begin() + (j * s.Hkv + g + 1) * s.D);
      y.v.insert(y.v.end(), x.v.begin() + (j * s.Hkv + g) * s.Dv,
                 x.v.begin() + (j * s.Hkv + g + 1) * s.Dv);
    }
    const Forward<float> alone = run_forward(one, y, true);
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < group; ++h) {
        const int64_t head = g * group + h;
        for (int64_t d = 0; d < s.Dv; ++d)
          ASSERT_EQ(all.out[(i * s.H + head) * s.Dv + d], alone.out[(i * group + h) * s.Dv + d])
              << "query " << i << ", head " << head << ", column " << d;
        ASSERT_EQ(all.lse[head * s.N + i], alone.lse[h * s.N + i]) << "query " << i;
      }
  }
}

TEST(ExactForward, StridedViewsFromPackedQkv) {
  // q, k, v sliced out of one packed tensor [B, N, 3, H, D]; out written into a wider
  // buffer [B, N, H, Dv + 5].
  const AttentionShape s{2, 97, 97, 4, 4, 32, 32, true};
  const int64_t pad = 5;
  const std::vector<float> qkv =
      cast_vector<float>(random_vector<double>(s.B * s.N * 3 * s.H * s.D, 7, -2, 2));
  const std::array<int64_t, 4> strides{s.N * 3 * s.H * s.D, 3 * s.H * s.D, s.D, 1};
  auto slice = [&](int part) {
    return View4<const float>(qkv.data() + part * s.H * s.D, {s.B, s.N, s.H, s.D}, strides);
  };
  std::vector<float> wide(s.B * s.N * s.H * (s.Dv + pad), 7.0f);
  View4<float> out(wide.data(), {s.B, s.N, s.H, s.Dv},
                   {s.N * s.H * (s.Dv + pad), s.H * (s.Dv + pad), s.Dv + pad, 1});
  exact_attention_forward<float>(Context{Device::cpu, 1}, slice(0), slice(1), slice(2),
                                 s.options(), out, View3<float>());

  Inputs<float> x;  // the same data, contiguous
  for (int part = 0; part < 3; ++part) {
    std::vector<float>& dst = part == 0 ? x.q : part == 1 ? x.k : x.v;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < s.D; ++d) dst.push_back(slice(part)(b, i, h, d));
  }
  const Forward<float> expected = run_forward(s, x, true);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < s.H; ++h) {
        for (int64_t d = 0; d < s.Dv; ++d)
          ASSERT_EQ(out(b, i, h, d), expected.out[((b * s.N + i) * s.H + h) * s.Dv + d]);
        for (int64_t d = s.Dv; d < s.Dv + pad; ++d)
          ASSERT_EQ(out.row(b, i, h)[d], 7.0f) << "wrote past Dv";
      }
}

TEST(ExactForward, NanInQueryPoisonsOnlyItsRow) {
  // Documented in exact.h: non-finite inputs propagate as IEEE arithmetic does.
  const AttentionShape s{1, 7, 9, 1, 1, 8, 8};
  Inputs<float> x = cast_inputs<float>(make_inputs(s, 8));
  x.q[3 * s.D + 2] = std::numeric_limits<float>::quiet_NaN();
  const Forward<float> f = run_forward(s, x, true);
  for (int64_t i = 0; i < s.N; ++i)
    for (int64_t d = 0; d < s.Dv; ++d)
      EXPECT_EQ(std::isnan(f.out[i * s.Dv + d]), i == 3) << "row " << i;
}

TEST(ExactForward, InfiniteKeyGivesNanLikeTheReference) {
  const AttentionShape s{1, 3, 5, 1, 1, 4, 4};
  Inputs<float> x = cast_inputs<float>(make_inputs(s, 9));
  x.k[0] = std::numeric_limits<float>::infinity();
  const Forward<float> fast = run_forward(s, x, true);
  const Forward<float> ref = run_forward(s, x, false);
  for (size_t i = 0; i < ref.out.size(); ++i)
    EXPECT_EQ(std::isnan(fast.out[i]), std::isnan(ref.out[i])) << i;
}

TEST(ExactForward, RejectsBadArguments) {
  const AttentionShape s{1, 4, 5, 4, 2, 8, 8};
  const Inputs<float> x = cast_inputs<float>(make_inputs(s, 10));
  std::vector<float> out(s.out_size()), lse(s.lse_size());
  const Context context{Device::cpu, 1};
  auto call = [&](View4<const float> q, View4<const float> k, View4<const float> v,
                  ExactOptions options, View4<float> o, View3<float> l) {
    exact_attention_forward<float>(context, q, k, v, options, o, l);
  };
  const View4<const float> q = q_view(s, x.q), k = k_view(s, x.k), v = v_view(s, x.v);
  const View4<float> o(out.data(), {s.B, s.N, s.H, s.Dv});
  const View3<float> l(lse.data(), {s.B, s.H, s.N});
  ExactOptions bad_scale;
  bad_scale.scale = 0.0;
  ExactOptions nan_scale;
  nan_scale.scale = std::nan("");
  ExactOptions bad_window;
  bad_window.window = -1;
  EXPECT_THROW(call(q, k, v, bad_scale, o, l), Error);
  EXPECT_THROW(call(q, k, v, nan_scale, o, l), Error);
  EXPECT_THROW(call(q, k, v, bad_window, o, l), Error);
  // H = 4 is not a multiple of Hkv = 3.
  const std::vector<float> k3(s.B * s.M * 3 * s.D), v3(s.B * s.M * 3 * s.Dv);
  EXPECT_THROW(call(q, View4<const float>(k3.data(), {s.B, s.M, 3, s.D}),
                    View4<const float>(v3.data(), {s.B, s.M, 3, s.Dv}), {}, o, l),
               Error);
  // k head dim differs from q's; v length differs from k's.
  EXPECT_THROW(call(q, View4<const float>(x.k.data(), {s.B, s.M * 2, s.Hkv, s.D / 2}), v, {},
                    o, l),
               Error);
  EXPECT_THROW(call(q, k, View4<const float>(x.v.data(), {s.B, s.M - 1, s.Hkv, s.Dv}), {}, o,
                    l),
               Error);
  EXPECT_THROW(call(q, k, v, {}, View4<float>(out.data(), {s.B, s.N, s.H, s.Dv - 1}), l), Error);
  EXPECT_THROW(call(q, k, v, {}, o, View3<float>(lse.data(), {s.B, s.H, s.N - 1})), Error);
  // Last dimension not contiguous.
  EXPECT_THROW(call(View4<const float>(x.q.data(), {s.B, s.N, s.H, s.D}, {0, 0, 0, 2}), k, v, {},
                    o, l),
               Error);
  try {
    call(q, k, v, bad_scale, o, l);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace subquad::testing
