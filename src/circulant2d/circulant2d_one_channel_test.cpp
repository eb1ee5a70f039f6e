// Tests of the one-channel-heads path of 2D circulant attention (D = Dv = 1, heads
// transformed together in groups, one_channel_heads.cpp): against the float64 dense
// reference on odd and prime grids with head counts that fill several groups and a
// partial last one, strided views, the weights output, determinism across threads, and
// non-finite inputs that must not leak to the pair partner head.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "circulant2d/circulant2d_ref.h"
#include "circulant2d/one_channel_heads.h"
#include "common/test_support.h"
#include "subquad/circulant2d.h"

namespace subquad {
namespace {

using testing::cast_vector;
using testing::expect_close_to_reference;
using testing::random_vector;

struct Grid2 {
  int64_t B, Hg, Wg, H;
  std::array<int64_t, 5> shape() const { return {B, Hg, Wg, H, 1}; }
  int64_t size() const { return B * Hg * Wg * H; }
};

struct Inputs {
  std::vector<double> q, k, v, dout;
};

Inputs make_inputs(const Grid2& g, uint64_t seed, double qk_range) {
  return {random_vector<double>(g.size(), seed, -qk_range, qk_range),
          random_vector<double>(g.size(), seed + 1, -qk_range, qk_range),
          random_vector<double>(g.size(), seed + 2), random_vector<double>(g.size(), seed + 3)};
}

template <typename T>
View5<const T> view(const std::vector<T>& x, const Grid2& g) {
  return View5<const T>(x.data(), g.shape());
}
template <typename T>
View5<T> view(std::vector<T>& x, const Grid2& g) {
  return View5<T>(x.data(), g.shape());
}

// [out, dq, dk, dv] of the dense reference.
template <typename T>
std::array<std::vector<T>, 4> reference(const Grid2& g, const Inputs& in, double scale) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  const auto dout = cast_vector<T>(in.dout);
  std::array<std::vector<T>, 4> r;
  for (auto& x : r) x.resize(g.size());
  reference::circulant2d_forward<T>(view(q, g), view(k, g), view(v, g), static_cast<T>(scale),
                                    view(r[0], g), View4<T>());
  reference::circulant2d_backward<T>(view(q, g), view(k, g), view(v, g), view(dout, g),
                                     static_cast<T>(scale), view(r[1], g), view(r[2], g),
                                     view(r[3], g));
  return r;
}

// [out, dq, dk, dv] of the fast path: the public operators, or (with a layout forced) the
// one-channel kernels themselves.
template <typename T>
std::array<std::vector<T>, 4> fast(const Grid2& g, const Inputs& in,
                                   const Circulant2dOptions& options, int threads = 1,
                                   circulant2d_detail::OneChannelLayout layout =
                                       circulant2d_detail::OneChannelLayout::automatic) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  const auto dout = cast_vector<T>(in.dout);
  std::array<std::vector<T>, 4> r;
  for (auto& x : r) x.resize(g.size());
  const Context context{Device::cpu, threads};
  if (layout == circulant2d_detail::OneChannelLayout::automatic) {
    circulant2d_forward<T>(context, view(q, g), view(k, g), view(v, g), options, view(r[0], g),
                           View4<T>());
    circulant2d_backward<T>(context, view(q, g), view(k, g), view(v, g), view(dout, g), options,
                            view(r[1], g), view(r[2], g), view(r[3], g));
    return r;
  }
  const T scale = static_cast<T>(circulant2d_scale(options, g.Hg * g.Wg, 1));
  std::vector<circulant2d_detail::HeadStatus> statuses(g.B * g.H);
  circulant2d_detail::one_channel_forward<T>(context, view(q, g), view(k, g), view(v, g), scale,
                                             view(r[0], g), View4<T>(), statuses.data(), layout);
  circulant2d_detail::one_channel_backward<T>(context, view(q, g), view(k, g), view(v, g),
                                              view(dout, g), scale, view(r[1], g), view(r[2], g),
                                              view(r[3], g), statuses.data(), layout);
  for (const auto status : statuses) EXPECT_EQ(status, circulant2d_detail::HeadStatus::ok);
  return r;
}

Circulant2dOptions code_scale() {
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  return options;
}

TEST(Circulant2dOneChannel, GroupWidthCoversTheHeadsInWholeLines) {
  for (const int64_t N : {1, 77, 196, 667, 1024, 9216, 1 << 20})
    for (const int64_t H : {1, 2, 3, 7, 37, 192, 1000}) {
      const int64_t W = circulant2d_detail::one_channel_group_width<float>(N, H);
      EXPECT_EQ(W % 2, 0) << N << " " << H;
      // A whole 64-byte line of each token, or all heads (rounded up to pairs or vectors).
      if (H > 16) {
        EXPECT_EQ(W % 16, 0) << N << " " << H;
      } else {
        EXPECT_GE(W, H) << N << " " << H;
        EXPECT_LE(W, 16) << N << " " << H;
      }
      const int64_t groups = (H + W - 1) / W;
      EXPECT_LT((groups - 1) * W, H) << "an empty group: N " << N << " H " << H;
      EXPECT_EQ(circulant2d_detail::one_channel_group_width<double>(N, H) % 2, 0);
    }
  // 143 tokens, 120 heads: more than one group, the last one partial (used below).
  const int64_t W = circulant2d_detail::one_channel_group_width<float>(143, 120);
  EXPECT_LT(W, 120);
  EXPECT_NE(120 % W, 0);
}

TEST(Circulant2dOneChannel, MatchesReferenceOnOddAndPrimeGrids) {
  const std::vector<Grid2> cases = {{1, 1, 1, 2},  {2, 1, 13, 3},   {1, 7, 11, 19},
                                    {2, 5, 16, 9}, {1, 14, 14, 24}, {1, 11, 13, 120}};
  uint64_t seed = 500;
  for (const Grid2& g : cases)
    for (const double range : {1.0, 3.0}) {
      SCOPED_TRACE(::testing::Message() << "B " << g.B << " grid " << g.Hg << "x" << g.Wg << " H "
                                        << g.H << " range " << range);
      const Inputs in = make_inputs(g, seed += 10, range);
      const Circulant2dOptions options = code_scale();
      const double scale = circulant2d_scale(options, g.Hg * g.Wg, 1);
      const auto ref32 = reference<float>(g, in, scale);
      const auto ref64 = reference<double>(g, in, scale);
      const char* names[4] = {"out", "dq", "dk", "dv"};
      using circulant2d_detail::OneChannelLayout;
      for (const auto layout : {OneChannelLayout::token_major, OneChannelLayout::plane_major})
      for (int i = 0; i < 4; ++i) {
        const auto got = fast<float>(g, in, options, 1, layout);
        SCOPED_TRACE(::testing::Message() << names[i] << (layout == OneChannelLayout::plane_major
                                                               ? " plane-major" : " token-major"));
        expect_close_to_reference(got[i], ref32[i], ref64[i]);
        EXPECT_TRUE(testing::all_finite(got[i]));
        if (testing::max_abs(ref64[i]) > 1e-6) {
          EXPECT_GT(testing::max_abs(got[i]), 0.0);
        }
      }
      for (const auto layout : {OneChannelLayout::token_major, OneChannelLayout::plane_major}) {
        const auto got64 = fast<double>(g, in, options, 1, layout);
        for (int i = 0; i < 4; ++i)
          EXPECT_LE(testing::max_abs_diff(got64[i], ref64[i]),
                    1e-12 * (1 + testing::max_abs(ref64[i])))
              << names[i] << " layout " << static_cast<int>(layout);
      }
    }
}

TEST(Circulant2dOneChannel, StridedHeadsGiveTheSameBitsAndWeights) {
  // Heads every third slot of [B, Hg, Wg, 3 H, 1] buffers, the rest left untouched.
  const Grid2 g{2, 7, 9, 11};
  const Inputs in = make_inputs(g, 61, 2.0);
  const Circulant2dOptions options = code_scale();
  const auto dense = fast<float>(g, in, options);
  const auto embed = [&](const std::vector<double>& x) {
    std::vector<float> wide(3 * x.size(), -7.0f);
    for (size_t i = 0; i < x.size(); ++i) wide[3 * i + 1] = static_cast<float>(x[i]);
    return wide;
  };
  const auto strided = [&](auto* data) {
    using T = std::remove_pointer_t<decltype(data)>;
    return View5<T>(data + 1, g.shape(), {g.Hg * g.Wg * 3 * g.H, g.Wg * 3 * g.H, 3 * g.H, 3, 1});
  };
  const auto q = embed(in.q), k = embed(in.k), v = embed(in.v), dout = embed(in.dout);
  std::array<std::vector<float>, 4> wide;
  for (auto& x : wide) x.assign(q.size(), -7.0f);
  std::vector<float> weights(g.B * g.H * g.Hg * g.Wg);
  const View4<float> weights_view(weights.data(), {g.B, g.H, g.Hg, g.Wg});
  const Context context{Device::cpu, 1};
  circulant2d_forward<float>(context, strided(q.data()), strided(k.data()), strided(v.data()),
                             options, strided(wide[0].data()), weights_view);
  circulant2d_backward<float>(context, strided(q.data()), strided(k.data()), strided(v.data()),
                              strided(dout.data()), options, strided(wide[1].data()),
                              strided(wide[2].data()), strided(wide[3].data()));
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < wide[r].size(); ++i) {
      const float expected = i % 3 == 1 ? dense[r][i / 3] : -7.0f;  // -7: padding kept
      ASSERT_EQ(wide[r][i], expected) << r << " " << i;
    }
  const double scale = circulant2d_scale(options, g.Hg * g.Wg, 1);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const auto s =
          reference::circulant2d_weights<double>(view(in.q, g), view(in.k, g), b, h, scale);
      double sum = 0;
      for (int64_t n = 0; n < g.Hg * g.Wg; ++n) {
        const float w = weights_view(b, h, n / g.Wg, n % g.Wg);
        sum += w;
        EXPECT_NEAR(w, s[n], 1e-6);
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(Circulant2dOneChannel, DeterministicAcrossThreads) {
  const Grid2 g{3, 11, 13, 120};  // 2 groups per batch: 6 jobs
  const Inputs in = make_inputs(g, 71, 2.0);
  const auto once = fast<float>(g, in, code_scale(), 1);
  EXPECT_EQ(fast<float>(g, in, code_scale(), 1), once);
  EXPECT_EQ(fast<float>(g, in, code_scale(), 2), once);
}

// Non-finite input propagates (it was refused with an Error): every output of head (b, h)
// is NaN, and its pair partner (the head transformed with it) and every other head are as
// without it.
TEST(Circulant2dOneChannel, NonFiniteInputsMakeOnlyTheirOwnHeadNaN) {
  const Grid2 g{2, 3, 5, 6};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto at = [&](int64_t b, int64_t n, int64_t h) { return (b * g.Hg * g.Wg + n) * g.H + h; };
  const auto expect_head_nan = [&](const std::array<std::vector<float>, 4>& got,
                                   const std::array<std::vector<float>, 4>& clean, int64_t b,
                                   int64_t h, int first) {
    for (int r = first; r < 4; ++r)
      for (int64_t n = 0; n < g.Hg * g.Wg; ++n)
        for (int64_t bb = 0; bb < g.B; ++bb)
          for (int64_t hh = 0; hh < g.H; ++hh) {
            const float x = got[r][at(bb, n, hh)];
            if (bb == b && hh == h)
              ASSERT_TRUE(std::isnan(x)) << "result " << r << " head " << hh;
            else  // (the partner is transformed with a zeroed lane: the same to round-off)
              ASSERT_NEAR(x, clean[r][at(bb, n, hh)], 1e-5) << "result " << r << " head " << hh;
          }
  };
  const Inputs clean_inputs = make_inputs(g, 81, 1.0);
  const auto clean = fast<float>(g, clean_inputs, code_scale());
  // One bad value in head 3 of batch 1 (head 2 is its pair partner): each argument (dout
  // reaches only the gradients).
  for (int which = 0; which < 4; ++which) {
    Inputs in = clean_inputs;
    std::vector<double>* target[4] = {&in.q, &in.k, &in.v, &in.dout};
    (*target[which])[at(1, 7, 3)] = which % 2 ? nan : inf;
    SCOPED_TRACE(which);
    expect_head_nan(fast<float>(g, in, code_scale()), clean, 1, 3, which < 3 ? 0 : 1);
  }
  // Logits that overflow in one head only.
  Inputs big = clean_inputs;
  for (int64_t n = 0; n < g.Hg * g.Wg; ++n) {
    big.q[at(1, n, 4)] = 1e20;
    big.k[at(1, n, 4)] = 1e20;
  }
  expect_head_nan(fast<float>(g, big, code_scale()), clean, 1, 4, 0);
}

}  // namespace
}  // namespace subquad
