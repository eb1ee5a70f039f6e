// MLR decoding: every step equals the corresponding row of the causal full forward (the
// dense reference), the key cache follows the per-level block model, and bad use throws.
#include <gtest/gtest.h>

#include <vector>

#include "common/test_support.h"
#include "structured/mlr_ref.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::random_vector;

// Decodes T tokens one by one and compares each step with the full causal forward.
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
  std::vector<T> out(B * H * Dv);
  double worst = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    // Token t of every batch: rows [b, t] of the [B, T, ...] inputs, via batch strides.
    const View3<const T> qt(q.data() + t * H * D, {B, H, D}, {tokens * H * D, D, 1});
    const View3<const T> kt(k.data() + t * Hkv * D, {B, Hkv, D}, {tokens * Hkv * D, D, 1});
    const View3<const T> vt(v.data() + t * Hkv * Dv, {B, Hkv, Dv}, {tokens * Hkv * Dv, Dv, 1});
    decoder.step({}, qt, kt, vt, View3<T>(out.data(), {B, H, Dv}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < H * Dv; ++i)
        worst = std::max(worst, std::abs(double(out[b * H * Dv + i]) -
                                         double(full[(b * tokens + t) * H * Dv + i])));
  }
  EXPECT_LT(worst, tolerance);
  EXPECT_EQ(decoder.position(), tokens);
  EXPECT_EQ(decoder.key_cache_floats(), B * Hkv * mlr_key_cache_prediction(tokens, ranks));
  EXPECT_EQ(decoder.value_cache_floats(), B * Hkv * tokens * Dv);
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
  for (int t = 0; t < 16; ++t) {
    decoder.step({}, View3<const float>(q.data(), {1, 1, 4}), View3<const float>(k.data(), {1, 1, 4}),
                 View3<const float>(v.data(), {1, 1, 1}), View3<float>(out.data(), {1, 1, 1}));
    sizes.push_back(decoder.key_cache_floats());
  }
  // After token t: 2 (t + 1) + (t mod 8 + 1) + (t mod 4 + 1).
  for (int t = 0; t < 16; ++t) EXPECT_EQ(sizes[t], 2 * (t + 1) + (t % 8 + 1) + (t % 4 + 1)) << t;
  EXPECT_EQ(sizes.back(), mlr_key_cache_prediction(16, ranks));
  EXPECT_THROW(decoder.step({}, View3<const float>(q.data(), {1, 1, 4}),
                            View3<const float>(k.data(), {1, 1, 4}),
                            View3<const float>(v.data(), {1, 1, 1}),
                            View3<float>(out.data(), {1, 1, 1})),
               Error);  // context full
}

TEST(MlrDecoder, RejectsBadConfiguration) {
  EXPECT_THROW(MlrDecoder<float>(1, 2, 1, 4, 10, MlrOptions{{2, 1, 1}, true, false}), Error);
  EXPECT_THROW(MlrDecoder<float>(1, 3, 2, 4, 16, MlrOptions{{2, 1, 1}, true, false}), Error);
  MlrDecoder<float> decoder(1, 2, 1, 4, 16, MlrOptions{{2, 2}, true, false});
  std::vector<float> buffer(64);
  EXPECT_THROW(decoder.step({}, View3<const float>(buffer.data(), {1, 2, 3}),
                            View3<const float>(buffer.data(), {1, 1, 4}),
                            View3<const float>(buffer.data(), {1, 1, 4}),
                            View3<float>(buffer.data(), {1, 2, 4})),
               Error);  // q head dim 3, ranks sum to 4
}

}  // namespace
}  // namespace subquad
