// Validation and level bookkeeping of MLR attention, its decoding block sizes, and its flop
// and key-cache models.
#include "structured/mlr_levels.h"

#include <string>

#include "subquad/checked_size.h"
#include "subquad/error.h"

namespace subquad {
namespace mlr {
namespace {

std::string ranks_string(const std::vector<int64_t>& ranks) { return shape_string(ranks); }

}  // namespace

Levels make_levels(const std::vector<int64_t>& ranks, int64_t head_dim, int64_t tokens) {
  // `if (!...) throw_error` rather than check(): the rank list is formatted only on failure.
  if (ranks.empty()) throw_error("ranks: expected at least one level, got none");
  check(static_cast<int64_t>(ranks.size()) <= kMaxLevels, "ranks: expected at most ", kMaxLevels,
        " levels, got ", ranks.size());
  Levels levels;
  levels.count = static_cast<int64_t>(ranks.size());
  for (int64_t l = 0; l < levels.count; ++l) {
    if (ranks[l] < 1) throw_error("ranks: expected every rank >= 1, got ", ranks_string(ranks));
    levels.ranks[l] = ranks[l];
    levels.offsets[l + 1] = levels.offsets[l] + ranks[l];
  }
  const int64_t sum = levels.offsets[levels.count];
  if (sum != head_dim)
    throw_error("ranks: expected ranks summing to the head dim ", head_dim, ", got ",
                ranks_string(ranks), " (sum ", sum, ")");
  const int64_t finest_blocks = int64_t{1} << (levels.count - 1);
  check(tokens % finest_blocks == 0, "tokens: expected a multiple of 2^(L-1) = ", finest_blocks,
        " for ", levels.count, " levels, got T = ", tokens);
  for (int64_t l = 0; l < levels.count; ++l) levels.block_sizes[l] = tokens >> l;
  return levels;
}

template <typename T>
void check_attention_arguments(View4<const T> q, View4<const T> k, View4<const T> v,
                               const MlrOptions& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  check(k.dim(0) == B && k.dim(1) == N && k.dim(3) == D, "k: expected shape [", B, ", ", N,
        ", Hkv, ", D, "] (batch, tokens and head dim of q), got ", shape_text(k.shape));
  check(k.dim(2) >= 1 && H % k.dim(2) == 0, "k: expected kv heads dividing the ", H,
        " query heads, got ", k.dim(2));
  check(v.dim(0) == B && v.dim(1) == N && v.dim(2) == k.dim(2), "v: expected shape [", B, ", ",
        N, ", ", k.dim(2), ", Dv], got ", shape_text(v.shape));
  make_levels(options.ranks, D, N);
}

template void check_attention_arguments<float>(View4<const float>, View4<const float>,
                                               View4<const float>, const MlrOptions&);
template void check_attention_arguments<double>(View4<const double>, View4<const double>,
                                                View4<const double>, const MlrOptions&);

}  // namespace mlr

// At least one level, each rank >= 1, and few enough levels for 2^(l-1) to be a size.
void check_level_ranks(const std::vector<int64_t>& ranks) {
  check(!ranks.empty() && ranks.size() <= 62, "ranks: expected 1 to 62 levels, got ",
        ranks.size());
  for (size_t l = 0; l < ranks.size(); ++l)
    check(ranks[l] >= 1, "ranks: expected every rank >= 1, got ", ranks[l], " at level ", l + 1);
}

double mlr_score_macs(int64_t tokens, const std::vector<int64_t>& ranks) {
  check(tokens >= 0, "tokens: expected >= 0, got ", tokens);
  check_level_ranks(ranks);
  double per_pair = 0;
  for (size_t l = 0; l < ranks.size(); ++l)
    per_pair += static_cast<double>(ranks[l]) / static_cast<double>(int64_t{1} << l);
  return static_cast<double>(tokens) * static_cast<double>(tokens) * per_pair;
}

std::vector<int64_t> mlr_level_block_sizes(const std::vector<int64_t>& ranks, int64_t context) {
  check(context >= 1, "context: expected >= 1, got ", context);
  check_level_ranks(ranks);
  int64_t head_dim = 0;
  for (int64_t r : ranks) head_dim = checked_add(head_dim, r, "ranks");
  const mlr::Levels levels = mlr::make_levels(ranks, head_dim, context);
  return {levels.block_sizes.begin(), levels.block_sizes.begin() + levels.count};
}

int64_t mlr_key_cache_prediction(int64_t context, const std::vector<int64_t>& ranks) {
  check(context >= 0, "context: expected >= 0, got ", context);
  check_level_ranks(ranks);
  int64_t floats = 0;
  for (size_t l = 0; l < ranks.size(); ++l)
    floats = checked_add(floats, checked_mul(ranks[l], context >> l, "context"), "context");
  return floats;
}

}  // namespace subquad
