// CAT on hostile input: causal CAT is shift-invariant for every finite offset of the
// scores (it once returned unnormalised prefix sums for equal scores of magnitude 1e17),
// and zero-volume inputs with gigantic other sides return at once (they once looped over
// B = 1e18 batches of N = 0 tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

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

TEST(CatHostile, CausalMaskedFutureNeverInfluencesEarlierRows) {
  const int64_t N = 257, H = 2, Dv = 4, poisoned = 200;
  const std::vector<double> z = random_vector<double>(N * H, 21, -3, 3);
  const std::vector<double> v = random_vector<double>(N * H * Dv, 22);
  for (CatPath path : {CatPath::automatic, CatPath::fft}) {
    const std::vector<double> clean = causal(z, v, N, H, Dv, path);
    for (double hostile : {std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(), 1e300}) {
      // Scores must be finite; a huge finite value goes into z only: in v it would reach
      // earlier rows of an FFT block as round-off (eps |v|), the one documented exception.
      std::vector<double> zh = z, vh = v;
      for (int64_t h = 0; h < H; ++h) {
        if (std::isfinite(hostile)) {
          zh[poisoned * H + h] = hostile;
        } else {
          for (int64_t c = 0; c < Dv; ++c) vh[(poisoned * H + h) * Dv + c] = hostile;
        }
      }
      const std::vector<double> out = causal(zh, vh, N, H, Dv, path);
      for (int64_t i = 0; i < poisoned * H * Dv; ++i)
        ASSERT_NEAR(out[i], clean[i], 1e-12) << "element " << i << " hostile " << hostile;
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
