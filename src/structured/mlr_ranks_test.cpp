// mlr_language_model_ranks: the paper's ranks at D = 64, scaled ranks that sum to D at odd
// head dims, levels folded for lengths that 2^(L-1) does not divide, bad arguments refused.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

TEST(MlrLanguageModelRanks, PaperRanksAtHeadDim64) {
  EXPECT_EQ(mlr_language_model_ranks(64, 4096), (std::vector<int64_t>{32, 8, 6, 4, 4, 4, 4, 2}));
}

TEST(MlrLanguageModelRanks, SumToTheHeadDimAndSplitTheTokens) {
  for (int64_t D : {1, 2, 15, 16, 17, 59, 64, 128})
    for (int64_t T : {1, 2, 6, 96, 97, 1024}) {
      const std::vector<int64_t> ranks = mlr_language_model_ranks(D, T);
      SCOPED_TRACE(testing::Message() << "D " << D << ", T " << T);
      EXPECT_EQ(std::accumulate(ranks.begin(), ranks.end(), int64_t{0}), D);
      EXPECT_EQ(T % (int64_t{1} << (ranks.size() - 1)), 0);
      for (int64_t r : ranks) EXPECT_GE(r, 1);
    }
  EXPECT_EQ(mlr_language_model_ranks(8, 1024), (std::vector<int64_t>{8}));
  // 96 = 32 * 3 splits into 2^5 blocks: 6 levels, the last two folded into level 1.
  EXPECT_EQ(mlr_language_model_ranks(64, 96), (std::vector<int64_t>{38, 8, 6, 4, 4, 4}));
}

TEST(MlrLanguageModelRanks, RefusesBadArguments) {
  EXPECT_THROW(mlr_language_model_ranks(0, 64), Error);
  EXPECT_THROW(mlr_language_model_ranks(64, 0), Error);
}

}  // namespace
}  // namespace subquad
