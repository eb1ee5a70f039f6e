// MLR decoding: every token's output equals the corresponding row of the causal full
// forward (the dense reference), in chunks of tokens and after a roll back; the key cache
// follows the per-level block model; bad use throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/test_support.h"
#include "structured/mlr_ref.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::random_vector;

// Token views [b, i .. i + count) of a [B, tokens, heads, width] buffer.
template <typename T>
View4<const T> tokens_at(const std::vector<T>& x, int64_t B, int64_t tokens, int64_t heads,
                         int64_t width, int64_t i, int64_t count) {
  return View4<const T>(x.data() + i * heads * width, {B, count, heads, width},
                        {tokens * heads * width, heads * width, width, 1});
}

// Decodes the tokens in chunks (a prefill of 3, then single tokens) and compares each row
// with the full causal forward; rolls back within the last finest block and decodes again.
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
  MlrDecoder<T> decoder(B, H, Hkv, Dv, tokens, options);
  double worst = 0;
  auto update = [&](int64_t i, int64_t count) {
    std::vector<T> out(B * count * H * Dv);
    DecodeTokens<T> x;
    x.q = tokens_at(q, B, tokens, H, D, i, count);
    x.k = tokens_at(k, B, tokens, Hkv, D, i, count);
    x.v = tokens_at(v, B, tokens, Hkv, Dv, i, count);
    static_cast<DecodeCache<T>&>(decoder).update(Context{Device::cpu, 2}, x,
                                                 View4<T>(out.data(), {B, count, H, Dv}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < count; ++t)
        for (int64_t e = 0; e < H * Dv; ++e)
          worst = std::max(worst, std::abs(double(out[(b * count + t) * H * Dv + e]) -
                                           double(full[(b * tokens + i + t) * H * Dv + e])));
  };
  const int64_t prefill = std::min<int64_t>(3, tokens);
  update(0, prefill);
  for (int64_t t = prefill; t < tokens; ++t) update(t, 1);
  EXPECT_LT(worst, tolerance);
  EXPECT_EQ(decoder.seen(), tokens);
  EXPECT_EQ(decoder.key_cache_floats(), B * Hkv * mlr_key_cache_prediction(tokens, ranks));
  EXPECT_EQ(decoder.value_cache_floats(), B * Hkv * tokens * Dv);
  EXPECT_GE(decoder.memory_bytes(),
            static_cast<int64_t>(sizeof(T)) * (decoder.key_cache_floats() + B * Hkv * tokens * Dv));
  // The finest blocks hold tokens / 2^(L-1) tokens: roll back within the last one.
  const int64_t finest = tokens >> (ranks.size() - 1);
  if (finest >= 2) {
    const std::unique_ptr<DecodeCache<T>> copy = decoder.clone();
    decoder.truncate(tokens - finest + 1);
    worst = 0;
    for (int64_t t = tokens - finest + 1; t < tokens; ++t) update(t, 1);
    EXPECT_LT(worst, tolerance);
    EXPECT_EQ(copy->seen(), tokens);
    if (tokens > finest) {  // into the previous block
      EXPECT_THROW(decoder.truncate(tokens - finest), Error);
    }
    decoder.truncate(0);
    EXPECT_EQ(decoder.seen(), 0);
  }
}

TEST(MlrDecoder, MatchesCausalForwardTokenByToken) {
  expect_decoding_matches_forward<double>(2, 32, 4, 2, 3, {4, 2, 1, 1}, false, 1e-12);
  expect_decoding_matches_forward<double>(1, 24, 2, 1, 5, {3, 2, 2}, true, 1e-12);
  expect_decoding_matches_forward<double>(1, 7, 1, 1, 2, {3}, false, 1e-12);
  expect_decoding_matches_forward<float>(1, 64, 2, 2, 8, {8, 2, 2, 2, 1, 1, 1}, true, 1e-5);
}

TEST(MlrDecoder, KeyCacheHoldsOnlyTheCurrentBlocks) {
  const std::vector<int64_t> ranks{2, 1, 1};  // context 16: blocks of 16, 8 and 4 tokens
  MlrDecoder<float> decoder(1, 1, 1, 1, 16, MlrOptions{ranks, true, false});
  std::vector<float> q(4, 0.5f), k(4, 0.25f), v(1, 1.0f), out(1);
  std::vector<int64_t> sizes;
  auto step = [&] {
    decoder.update({}, View4<const float>(q.data(), {1, 1, 1, 4}),
                   View4<const float>(k.data(), {1, 1, 1, 4}),
                   View4<const float>(v.data(), {1, 1, 1, 1}),
                   View4<float>(out.data(), {1, 1, 1, 1}));
  };
  for (int t = 0; t < 16; ++t) {
    step();
    sizes.push_back(decoder.key_cache_floats());
  }
  // After token t: 2 (t + 1) + (t mod 8 + 1) + (t mod 4 + 1).
  for (int t = 0; t < 16; ++t) EXPECT_EQ(sizes[t], 2 * (t + 1) + (t % 8 + 1) + (t % 4 + 1)) << t;
  EXPECT_EQ(sizes.back(), mlr_key_cache_prediction(16, ranks));
  EXPECT_THROW(step(), Error);  // context full
}

TEST(MlrDecoder, RejectsBadConfiguration) {
  EXPECT_THROW(MlrDecoder<float>(1, 2, 1, 4, 10, MlrOptions{{2, 1, 1}, true, false}), Error);
  EXPECT_THROW(MlrDecoder<float>(1, 3, 2, 4, 16, MlrOptions{{2, 1, 1}, true, false}), Error);
  MlrDecoder<float> decoder(1, 2, 1, 4, 16, MlrOptions{{2, 2}, true, false});
  std::vector<float> buffer(64);
  EXPECT_THROW(decoder.update({}, View4<const float>(buffer.data(), {1, 1, 2, 3}),
                              View4<const float>(buffer.data(), {1, 1, 1, 4}),
                              View4<const float>(buffer.data(), {1, 1, 1, 4}),
                              View4<float>(buffer.data(), {1, 1, 2, 4})),
               Error);  // q head dim 3, ranks sum to 4
  EXPECT_EQ(decoder.seen(), 0);
  EXPECT_THROW(decoder.truncate(1), Error);
}

}  // namespace
}  // namespace subquad
