// MLR attention on hostile input: causally masked keys and values (future tokens) never
// influence an output, even when they hold NaN, inf or huge values.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "common/test_support.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

template <typename T>
void expect_future_ignored(int64_t N, const std::vector<int64_t>& ranks, bool block_divide,
                           int64_t poisoned, T hostile) {
  const int64_t B = 1, H = 2, Hkv = 1, Dv = 5;
  int64_t D = 0;
  for (int64_t r : ranks) D += r;
  const auto q = testing::random_vector<T>(B * N * H * D, 1, -2, 2);
  auto k = testing::random_vector<T>(B * N * Hkv * D, 2, -2, 2);
  auto v = testing::random_vector<T>(B * N * Hkv * Dv, 3, -2, 2);
  MlrOptions options;
  options.ranks = ranks;
  options.causal = true;
  options.block_divide = block_divide;
  auto run = [&](std::vector<T>& out, std::vector<T>& lse) {
    out.assign(B * N * H * Dv, T(-7));
    lse.assign(B * H * N, T(-7));
    mlr_attention_forward<T>(Context{}, View4<const T>(q.data(), {B, N, H, D}),
                             View4<const T>(k.data(), {B, N, Hkv, D}),
                             View4<const T>(v.data(), {B, N, Hkv, Dv}), options,
                             View4<T>(out.data(), {B, N, H, Dv}), View3<T>(lse.data(), {B, H, N}));
  };
  std::vector<T> clean_out, clean_lse, out, lse;
  run(clean_out, clean_lse);
  for (int64_t d = 0; d < D; ++d) k[poisoned * D + d] = hostile;
  for (int64_t d = 0; d < Dv; ++d) v[poisoned * Dv + d] = hostile;
  run(out, lse);
  for (int64_t i = 0; i < poisoned; ++i)  // rows that cannot see the poisoned token
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < Dv; ++d) {
        const int64_t at = (i * H + h) * Dv + d;
        ASSERT_EQ(out[at], clean_out[at]) << "row " << i << " hostile " << hostile;
      }
      ASSERT_EQ(lse[h * N + i], clean_lse[h * N + i]) << "lse row " << i;
    }
}

TEST(MlrHostile, FutureTokensNeverInfluenceEarlierRows) {
  for (double hostile : {std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity(), 1e30}) {
    expect_future_ignored<float>(131, {8}, false, 130, float(hostile));
    expect_future_ignored<double>(131, {8}, false, 130, hostile);
    expect_future_ignored<float>(200, {4, 4}, true, 150, float(hostile));
    expect_future_ignored<double>(200, {4, 2, 2}, false, 199, hostile);
  }
}

}  // namespace
}  // namespace subquad
