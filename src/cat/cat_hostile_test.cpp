// CAT on hostile input: causal CAT is shift-invariant for every finite offset of the
// scores (it once returned unnormalised prefix sums for equal scores of magnitude 1e17),
// masked (future) entries change no earlier row whatever they hold, non-finite scores
// propagate as in the reference (they were refused), and zero-volume inputs with gigantic
// other sides return at once (they once looped over B = 1e18 batches of N = 0 tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cat/cat_causal_plan.h"
#include "cat/cat_test_util.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

using testing::random_vector;
using testing::view3;
using testing::view4;

std::vector<double> causal(const std::vector<double>& z, const std::vector<double>& v, int64_t N,
                           int64_t H, int64_t Dv, CatPath path) {
  std::vector<double> out(v.size());
  cat_causal_forward<double>(Context{}, view3(z, 1, N, H), view4(v, 1, N, H, Dv),
                             CatCausalOptions{path}, view4(out, 1, N, H, Dv));
  return out;
}

TEST(CatHostile, CausalIsShiftInvariant) {
  const int64_t N = 300, H = 2, Dv = 5;
  // Scores on a grid of 1/4 in [-8, 8]: z + c is exact in float64 for |c| <= 1e15, so any
  // change of the output comes from the kernel, not from rounding the input.
  std::vector<double> z = random_vector<double>(N * H, 11, -8, 8);
  for (double& x : z) x = std::round(4 * x) / 4;
  const std::vector<double> v = random_vector<double>(N * H * Dv, 12);
  for (CatPath path : {CatPath::automatic, CatPath::direct, CatPath::fft}) {
    const std::vector<double> base = causal(z, v, N, H, Dv, path);
    for (double offset : {1e12, -1e12, 1e15, -1e15}) {
      std::vector<double> shifted = z;
      for (double& x : shifted) x += offset;
      const std::vector<double> out = causal(shifted, v, N, H, Dv, path);
      EXPECT_LT(testing::max_abs_diff(out, base), 1e-12) << "offset " << offset;
    }
  }
}

TEST(CatHostile, EqualHugeScoresGiveThePrefixMean) {
  const int64_t N = 200, H = 1, Dv = 3;
  const std::vector<double> v = random_vector<double>(N * Dv, 13);
  // out[i] = (1 / (i + 1)) sum_{k <= i} v[i - k] = the mean of v[0..i].
  std::vector<double> mean(v.size()), running(Dv, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < Dv; ++c) {
      running[c] += v[i * Dv + c];
      mean[i * Dv + c] = running[c] / double(i + 1);
    }
  for (double value : {1e17, -1e17, 1e300, -1e300}) {
    const std::vector<double> z(N, value);
    for (CatPath path : {CatPath::automatic, CatPath::direct, CatPath::fft})
      EXPECT_LT(testing::max_abs_diff(causal(z, v, N, H, Dv, path), mean), 1e-12)
          << "z = " << value;
  }
}

// Max over rows i < rows of max_c |a[i] - b[i]| / max_c |b[i]|, over every head.
double max_row_error(const std::vector<double>& a, const std::vector<double>& b, int64_t rows,
                     int64_t H, int64_t Dv) {
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < H; ++h) {
      double error = 0, scale = 0;
      for (int64_t c = 0; c < Dv; ++c) {
        const int64_t at = (i * H + h) * Dv + c;
        error = std::max(error, std::abs(a[at] - b[at]));
        scale = std::max(scale, std::abs(b[at]));
      }
      worst = std::max(worst, error / scale);
    }
  return worst;
}

// A masked (future) score or value changes no earlier row beyond its round-off, whatever it
// holds: a huge finite value in v once reached earlier rows of an FFT block as round-off of
// its own size (eps |v|: rows changed by 2e14 times their scale for v = 1e30, N = 300).
TEST(CatHostile, CausalMaskedFutureNeverInfluencesEarlierRows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t N : {257, 3000}) {
    const int64_t H = 2, Dv = 4, poisoned = N - 57;
    const std::vector<double> z = random_vector<double>(N * H, 21, -3, 3);
    const std::vector<double> v = random_vector<double>(N * H * Dv, 22);
    for (CatPath path : {CatPath::automatic, CatPath::fft}) {
      const std::vector<double> clean = causal(z, v, N, H, Dv, path);
      for (double hostile : {nan, inf, -inf, 1e10, 1e30, 1e300, -1e300}) {
        std::vector<double> zh = z, vh = v;
        for (int64_t h = 0; h < H; ++h) {
          zh[poisoned * H + h] = hostile;
          for (int64_t c = 0; c < Dv; ++c) vh[(poisoned * H + h) * Dv + c] = hostile;
        }
        EXPECT_LT(max_row_error(causal(z, vh, N, H, Dv, path), clean, poisoned, H, Dv), 1e-12)
            << "v = " << hostile << " N = " << N;
        EXPECT_LT(max_row_error(causal(zh, v, N, H, Dv, path), clean, poisoned, H, Dv), 1e-12)
            << "z = " << hostile << " N = " << N;
      }
    }
  }
}

// Padding of zeros in front (rows that see only zero values) stays exactly zero although
// later values are large: no round-off of unseen values reaches them.
TEST(CatHostile, CausalRowsThatSeeOnlyZerosAreZero) {
  const int64_t N = 2000, H = 1, Dv = 3, padding = 700;
  const std::vector<double> z = random_vector<double>(N * H, 23, -2, 2);
  std::vector<double> v = random_vector<double>(N * H * Dv, 24, -1e6, 1e6);
  std::fill(v.begin(), v.begin() + padding * Dv, 0.0);
  for (CatPath path : {CatPath::automatic, CatPath::fft}) {
    const std::vector<double> out = causal(z, v, N, H, Dv, path);
    for (int64_t i = 0; i < padding * Dv; ++i) ASSERT_EQ(out[i], 0.0) << "element " << i;
    const std::vector<double> direct = causal(z, v, N, H, Dv, CatPath::direct);
    EXPECT_LT(max_row_error(std::vector<double>(out.begin() + padding * Dv, out.end()),
                            std::vector<double>(direct.begin() + padding * Dv, direct.end()),
                            N - padding, H, Dv),
              1e-9);
  }
}

// The plan itself: no FFT block mixes a value into rows before it when that value is far
// larger than what those rows see (or not finite); uniform values keep one block.
TEST(CatHostile, CausalPlanKeepsUnseenHugeValuesOutOfEarlierRows) {
  const int64_t N = 5000;
  std::vector<double> z = random_vector<double>(N, 25, -1, 1), lse(N);
  cat_detail::prefix_log_sum_exp(z.data(), N, lse.data());
  std::vector<double> scale(N, 1.0);
  EXPECT_EQ(cat_detail::plan_causal_blocks(z.data(), lse.data(), scale.data(), N, 64, 1 << 24)
                .size(),
            1u);
  for (const int64_t at : {int64_t(1), int64_t(2500), N - 1}) {
    for (double hostile : {1e30, std::numeric_limits<double>::infinity()}) {
      scale.assign(N, 1.0);
      scale[at] = hostile;
      for (int64_t leaf : {0, 64}) {
        const auto blocks =
            cat_detail::plan_causal_blocks(z.data(), lse.data(), scale.data(), N, leaf, 1 << 24);
        for (const cat_detail::CausalBlock& block : blocks)
          if (!block.direct() && block.j0 <= at && at < block.j0 + block.nj) {
            EXPECT_GE(block.r0, at) << "value " << at << " in a block of rows from " << block.r0;
          }
        // Split around it, not everywhere: at most a band of direct leaves along the lag of
        // the value (a non-finite one is in no FFT block), O(N / 64 log N) blocks.
        if (leaf) {
          EXPECT_LT(blocks.size(), 1000u) << "at " << at;
        }
      }
    }
  }
}

// Non-finite scores propagate as IEEE arithmetic does in the dense reference: NaN or +inf
// at token p makes rows p.. NaN (causal) or the whole head NaN (non-causal), and leaves
// the other rows and heads as they were; -inf is a weight of zero (a row that sees only -inf
// is 0 / 0 = NaN, as in the reference).
TEST(CatHostile, NonFiniteScoresPropagate) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t N = 300, H = 2, Dv = 3;
  const reference::CatShape shape{1, N, H, Dv};
  const std::vector<double> z = random_vector<double>(N * H, 26, -3, 3);
  const std::vector<double> v = random_vector<double>(N * H * Dv, 27);
  auto same = [](double a, double b) {
    return (std::isnan(a) && std::isnan(b)) || std::abs(a - b) <= 1e-10 * (1 + std::abs(b));
  };
  for (int64_t p : {int64_t(0), int64_t(150)}) {
    for (double bad : {nan, inf, -inf}) {
      std::vector<double> zb = z;
      zb[p * H + 0] = bad;  // head 0 only
      const std::vector<double> want = reference::cat_causal_forward(zb, v, shape);
      for (CatPath path : {CatPath::automatic, CatPath::direct, CatPath::fft}) {
        const std::vector<double> out = causal(zb, v, N, H, Dv, path);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t c = 0; c < Dv; ++c) {
              const int64_t at = (i * H + h) * Dv + c;
              ASSERT_TRUE(same(out[at], want[at]))
                  << "z = " << bad << " at " << p << ": row " << i << " head " << h << " got "
                  << out[at] << " want " << want[at];
              // (-inf: only a row that sees nothing else is 0 / 0.)
              const bool sees_bad = h == 0 && (bad == -inf ? i == 0 && p == 0 : i >= p);
              ASSERT_EQ(std::isnan(out[at]), sees_bad) << "row " << i << " head " << h;
            }
      }
      // Decoding gives the same rows.
      std::vector<double> rows(v.size());
      cat_causal_decode<double>({}, view3(zb, 1, N, H), view4(v, 1, N, H, Dv),
                                view4(rows, 1, N, H, Dv));
      for (size_t at = 0; at < rows.size(); ++at) ASSERT_TRUE(same(rows[at], want[at])) << at;
      // Non-causal: every row of head 0 reads every score.
      const std::vector<double> full = reference::cat_forward(zb, v, shape, CatConvention::roll);
      for (CatPath path : {CatPath::automatic, CatPath::direct}) {
        std::vector<double> out(v.size());
        cat_forward<double>({}, view3(zb, 1, N, H), view4(v, 1, N, H, Dv), CatOptions{{}, path},
                            view4(out, 1, N, H, Dv));
        for (size_t at = 0; at < out.size(); ++at) ASSERT_TRUE(same(out[at], full[at])) << at;
      }
    }
  }
}

TEST(CatHostile, ZeroVolumeWithGiganticSidesReturnsAtOnce) {
  const int64_t huge = 999999999999999999;
  std::vector<float> none(1);
  const Context context;
  // z [B = 1e18, N = 0, H = 3], v [B, 0, H, Dv]: nothing to do.
  const View3<const float> z(none.data(), {huge, 0, 3});
  const View4<const float> v(none.data(), {huge, 0, 3, 4});
  const View4<float> out(none.data(), {huge, 0, 3, 4});
  cat_forward<float>(context, z, v, CatOptions{}, out);
  cat_causal_forward<float>(context, z, v, CatCausalOptions{}, out);
  const View3<float> dz(none.data(), {huge, 0, 3});
  cat_backward<float>(context, z, v, View4<const float>(out), CatOptions{}, dz, out);
  cat_causal_backward<float>(context, z, v, View4<const float>(out), View4<const float>(out),
                             CatCausalOptions{}, dz, out);
  const View4<const float> q(none.data(), {huge, 0, 3, 2});
  cat_avgkey_forward<float>(context, q, q, v, CatAvgKeyOptions{}, out);
  const View4<float> dq(none.data(), {huge, 0, 3, 2});
  cat_avgkey_backward<float>(context, q, q, v, View4<const float>(out), CatAvgKeyOptions{}, dq,
                             dq, out);
  // Zero value columns beside huge B and N: the output is empty, nothing is scanned.
  const View3<const float> z2(none.data(), {1, huge, 0});
  const View4<const float> v2(none.data(), {1, huge, 0, 7});
  const View4<float> out2(none.data(), {1, huge, 0, 7});
  cat_forward<float>(context, z2, v2, CatOptions{}, out2);
  cat_causal_forward<float>(context, z2, v2, CatCausalOptions{}, out2);
}

TEST(CatHostile, AveragedKeyScaleMustBePositive) {
  const int64_t N = 4, H = 1, D = 2;
  const std::vector<float> q = random_vector<float>(N * H * D, 14);
  std::vector<float> out(N * H * D);
  for (double scale : {0.0, -1.0}) {
    CatAvgKeyOptions options;
    options.scale = scale;
    EXPECT_THROW(cat_avgkey_forward<float>(Context{}, view4(q, 1, N, H, D), view4(q, 1, N, H, D),
                                           view4(q, 1, N, H, D), options, view4(out, 1, N, H, D)),
                 Error);
  }
}

}  // namespace
}  // namespace subquad
