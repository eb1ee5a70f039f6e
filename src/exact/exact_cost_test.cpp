// The flop models of subquad/cost.h: the closed-form count of visible pairs against the
// masks themselves (visible_keys), exact attention's counts, and the FFT convention.
#include <gtest/gtest.h>

#include <cmath>

#include "exact/exact_ref.h"
#include "subquad/cost.h"

namespace subquad::testing {
namespace {

double counted_pairs(int64_t N, int64_t M, bool causal, int64_t window) {
  double pairs = 0;
  for (int64_t i = 0; i < N; ++i) {
    const KeyRange keys = visible_keys(i, N, M, causal, window);
    pairs += static_cast<double>(keys.last - keys.first);
  }
  return pairs;
}

TEST(CostModels, VisiblePairsMatchTheMasks) {
  for (int64_t N : {0, 1, 2, 7, 97})
    for (int64_t M : {0, 1, 3, 7, 64, 130})
      for (bool causal : {false, true})
        for (int64_t window : {0, 1, 5, 64, 1000})
          EXPECT_EQ(exact_visible_pairs(N, M, causal, window),
                    counted_pairs(N, M, causal, window))
              << N << " " << M << " " << causal << " " << window;
}

TEST(CostModels, ExactCountsTwoFlopsPerMultiplyAdd) {
  // Non-causal: 2 N M (D + Dv) per head; backward 2 N M (2 D + 3 Dv).
  const Cost forward = exact_attention_forward_cost(2, 10, 20, 4, 2, 8, 16, false, 0, 4);
  EXPECT_DOUBLE_EQ(forward.flops, 2.0 * 4 * 10 * 20 * 2 * (8 + 16));
  const Cost backward = exact_attention_backward_cost(2, 10, 20, 4, 2, 8, 16, false, 0, 4);
  EXPECT_DOUBLE_EQ(backward.flops, 2.0 * 4 * 10 * 20 * 2 * (2 * 8 + 3 * 16));
  // q, k, v, out, lse in float32.
  EXPECT_DOUBLE_EQ(forward.bytes, 4.0 * 2 * (10 * 4 * 8 + 20 * 2 * 24 + 10 * 4 * 16 + 4 * 10));
}

// CAT and circulant2d both count their transforms with these two (cat_cost.cpp,
// circulant2d_cost.cpp), so their GFLOP/s compare across rows of one bench table.
TEST(CostModels, FftConvention) {
  const double n = 4096;
  EXPECT_DOUBLE_EQ(real_fft_flops(n), 2.5 * n * 12);
  EXPECT_DOUBLE_EQ(complex_fft_flops(n), 5.0 * n * 12);
  EXPECT_DOUBLE_EQ(real_fft_flops(1), 2.5);  // log2 clamped at 2 points: never 0 or negative
}

}  // namespace
}  // namespace subquad::testing
