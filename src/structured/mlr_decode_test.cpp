// MLR decoding over caller-owned level caches: every token's output equals the
// corresponding row of the causal full forward (the dense reference), in parts split at the
// finest blocks and after a roll back; the level caches hold the predicted floats; bad use
// throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/test_support.h"
#include "structured/mlr_ref.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::random_vector;

// The caller's state of MLR decoding: the level caches [B, Hkv, s_l, r_l] and a view of the
// first `seen` values of a [B, tokens, Hkv, Dv] buffer.
template <typename T>
struct LevelCaches {
  std::vector<int64_t> ranks, sizes;
  int64_t B, Hkv;
  std::vector<std::vector<T>> keys;

  LevelCaches(std::vector<int64_t> ranks_, int64_t context, int64_t B_, int64_t Hkv_)
      : ranks(std::move(ranks_)), sizes(mlr_level_block_sizes(ranks, context)), B(B_), Hkv(Hkv_) {
    for (size_t l = 0; l < ranks.size(); ++l) keys.emplace_back(B * Hkv * sizes[l] * ranks[l]);
  }
  // Writes the level columns of position p's keys (k: its [Hkv, D] row of batch 0, batches
  // k_batch_stride apart) into slot p mod s_l.
  void store(const T* k, int64_t k_batch_stride, int64_t D, int64_t p) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        int64_t offset = 0;
        for (size_t l = 0; l < ranks.size(); ++l) {
          const T* from = k + b * k_batch_stride + hk * D + offset;
          std::copy(from, from + ranks[l],
                    keys[l].data() + ((b * Hkv + hk) * sizes[l] + p % sizes[l]) * ranks[l]);
          offset += ranks[l];
        }
      }
  }
  std::vector<View4<const T>> views() const {
    std::vector<View4<const T>> out;
    for (size_t l = 0; l < ranks.size(); ++l)
      out.push_back(View4<const T>(keys[l].data(), {B, Hkv, sizes[l], ranks[l]}));
    return out;
  }
  int64_t floats() const {
    int64_t n = 0;
    for (const auto& level : keys) n += static_cast<int64_t>(level.size());
    return n;
  }
};

// Token views [b, 0 .. count) of a [B, tokens, heads, width] buffer.
template <typename T>
View4<const T> first_tokens(const std::vector<T>& x, int64_t B, int64_t tokens, int64_t heads,
                            int64_t width, int64_t count) {
  return View4<const T>(x.data(), {B, count, heads, width},
                        {tokens * heads * width, heads * width, width, 1});
}

// Decodes the tokens in parts (a prefill of 3, then single tokens, each split at the finest
// blocks) and compares each row with the full causal forward; rolls back within the last
// finest block and decodes again.
template <typename T>
void expect_decoding_matches_forward(int64_t B, int64_t tokens, int64_t H, int64_t Hkv,
                                     int64_t Dv, std::vector<int64_t> ranks, bool block_divide,
                                     double tolerance) {
  int64_t D = 0;
  for (int64_t r : ranks) D += r;
  const std::vector<T> q = random_vector<T>(B * tokens * H * D, 11, -2, 2);
  const std::vector<T> k = random_vector<T>(B * tokens * Hkv * D, 12, -2, 2);
  const std::vector<T> v = random_vector<T>(B * tokens * Hkv * Dv, 13);
  const MlrOptions options{ranks, true, block_divide};
  std::vector<T> full(B * tokens * H * Dv);
  mlr_attention_reference_forward<T>(View4<const T>(q.data(), {B, tokens, H, D}),
                                     View4<const T>(k.data(), {B, tokens, Hkv, D}),
                                     View4<const T>(v.data(), {B, tokens, Hkv, Dv}), options,
                                     View4<T>(full.data(), {B, tokens, H, Dv}), View3<T>());
  LevelCaches<T> caches(ranks, tokens, B, Hkv);
  const int64_t finest = caches.sizes.back();
  double worst = 0;
  // Tokens i .. i + count - 1, in one finest block: store their keys, then decode.
  auto decode_part = [&](int64_t i, int64_t count) {
    for (int64_t p = i; p < i + count; ++p) caches.store(k.data() + p * Hkv * D, tokens * Hkv * D, D, p);
    std::vector<T> out(B * count * H * Dv);
    const auto levels = caches.views();
    mlr_decode<T>(Context{Device::cpu, 2},
                  View4<const T>(q.data() + i * H * D, {B, count, H, D},
                                 {tokens * H * D, H * D, D, 1}),
                  levels, first_tokens(v, B, tokens, Hkv, Dv, i + count), options, tokens,
                  View4<T>(out.data(), {B, count, H, Dv}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < count; ++t)
        for (int64_t e = 0; e < H * Dv; ++e)
          worst = std::max(worst, std::abs(double(out[(b * count + t) * H * Dv + e]) -
                                           double(full[(b * tokens + i + t) * H * Dv + e])));
  };
  auto decode = [&](int64_t i, int64_t count) {
    while (count > 0) {
      const int64_t part = std::min(count, finest - i % finest);
      decode_part(i, part);
      i += part;
      count -= part;
    }
  };
  const int64_t prefill = std::min<int64_t>(3, tokens);
  decode(0, prefill);
  for (int64_t t = prefill; t < tokens; ++t) decode(t, 1);
  EXPECT_LT(worst, tolerance);
  EXPECT_EQ(caches.floats(), B * Hkv * mlr_key_cache_prediction(tokens, ranks));
  // Roll back within the last finest block: the level caches still hold what its rows read.
  if (finest >= 2) {
    worst = 0;
    decode(tokens - finest + 1, finest - 1);
    EXPECT_LT(worst, tolerance);
  }
}

TEST(MlrDecode, MatchesCausalForwardTokenByToken) {
  expect_decoding_matches_forward<double>(2, 32, 4, 2, 3, {4, 2, 1, 1}, false, 1e-12);
  expect_decoding_matches_forward<double>(1, 24, 2, 1, 5, {3, 2, 2}, true, 1e-12);
  expect_decoding_matches_forward<double>(1, 7, 1, 1, 2, {3}, false, 1e-12);
  expect_decoding_matches_forward<float>(1, 64, 2, 2, 8, {8, 2, 2, 2, 1, 1, 1}, true, 1e-5);
}

TEST(MlrDecode, LevelBlockSizesHalveFromTheContext) {
  EXPECT_EQ(mlr_level_block_sizes({2, 1, 1}, 16), (std::vector<int64_t>{16, 8, 4}));
  EXPECT_EQ(mlr_key_cache_prediction(16, {2, 1, 1}), 2 * 16 + 8 + 4);
  EXPECT_THROW(mlr_level_block_sizes({2, 1, 1}, 10), Error);  // 4 does not divide 10
  EXPECT_THROW(mlr_level_block_sizes({2, 0}, 16), Error);
  EXPECT_THROW(mlr_level_block_sizes({2, 2}, 0), Error);
}

TEST(MlrDecode, RejectsBadArguments) {
  const MlrOptions options{{2, 2}, true, false};  // context 16: blocks of 16 and 8
  std::vector<float> buffer(1024);
  const std::vector<View4<const float>> levels{
      View4<const float>(buffer.data(), {1, 1, 16, 2}), View4<const float>(buffer.data(), {1, 1, 8, 2})};
  auto decode = [&](View4<const float> q, std::span<const View4<const float>> keys,
                    int64_t seen, const MlrOptions& o = {{2, 2}, true, false},
                    int64_t context = 16) {
    mlr_decode<float>({}, q, keys, View4<const float>(buffer.data(), {1, seen, 1, 4}), o,
                      context, View4<float>(buffer.data() + 512, {1, q.dim(1), 2, 4}));
  };
  const View4<const float> one(buffer.data(), {1, 1, 2, 4});
  decode(one, levels, 5);  // fine
  EXPECT_THROW(decode(View4<const float>(buffer.data(), {1, 1, 2, 3}), levels, 5), Error);
  EXPECT_THROW(decode(one, levels, 5, options, 10), Error);  // 2 does not divide 10
  EXPECT_THROW(decode(one, levels, 17), Error);               // past the context
  EXPECT_THROW(decode(one, std::span(levels).first(1), 5), Error);  // one level cache
  const std::vector<View4<const float>> wrong{levels[0],
                                              View4<const float>(buffer.data(), {1, 1, 4, 2})};
  EXPECT_THROW(decode(one, wrong, 5), Error);  // level 2 holds 8 slots
  // Positions 7 and 8 lie in two blocks of the finest level (8 tokens).
  EXPECT_THROW(decode(View4<const float>(buffer.data(), {1, 2, 2, 4}), levels, 9), Error);
  decode(View4<const float>(buffer.data(), {1, 2, 2, 4}), levels, 10);  // 8 and 9: one block
}

}  // namespace
}  // namespace subquad
