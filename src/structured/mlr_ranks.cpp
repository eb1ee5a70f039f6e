// mlr_language_model_ranks: the MLR paper's language-model ranks scaled to a head dim and
// folded to what a sequence length can split (subquad/structured.h). O(levels).
#include <algorithm>
#include <vector>

#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

const std::vector<int64_t> kLanguageModelRanks{32, 8, 6, 4, 4, 4, 4, 2};  // the paper's code
constexpr int64_t kLanguageModelHeadDim = 64;
constexpr int64_t kMinHeadDimForAllLevels = 16;  // below: levels 2.. would take all of D

}  // namespace

std::vector<int64_t> mlr_language_model_ranks(int64_t head_dim, int64_t tokens) {
  check(head_dim >= 1, "head_dim: expected >= 1, got ", head_dim);
  check(tokens >= 1, "tokens: expected >= 1, got ", tokens);
  std::vector<int64_t> ranks{head_dim};
  if (head_dim >= kMinHeadDimForAllLevels) {
    ranks.assign(1, 0);
    for (size_t l = 1; l < kLanguageModelRanks.size(); ++l)
      ranks.push_back(
          std::max<int64_t>(1, kLanguageModelRanks[l] * head_dim / kLanguageModelHeadDim));
    int64_t rest = 0;
    for (int64_t r : ranks) rest += r;
    ranks[0] = head_dim - rest;
  }
  while (ranks.size() > 1 && tokens % (int64_t{1} << (ranks.size() - 1)) != 0) {
    ranks[0] += ranks.back();
    ranks.pop_back();
  }
  return ranks;
}

}  // namespace subquad
