// Exact attention on hostile input: masked entries (keys and values beyond the causal
// frontier or outside the window: future tokens, padding) never influence an output, even
// when they hold NaN, inf or huge values (a NaN in the last value once made the 130 earlier
// rows of N = M = 131 NaN through 0 * NaN in the tile product).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/test_support.h"
#include "exact/exact_ref.h"
#include "subquad/exact.h"

namespace subquad {
namespace {

struct MaskedCase {
  int64_t N, M, window;  // causal always
  int64_t poisoned;      // the key / value row filled with the hostile value
};

template <typename T>
void expect_masked_entries_ignored(const MaskedCase& c, T hostile) {
  const int64_t B = 1, H = 2, Hkv = 1, D = 19, Dv = 7;
  const auto q = testing::random_vector<T>(B * c.N * H * D, 1, -2, 2);
  auto k = testing::random_vector<T>(B * c.M * Hkv * D, 2, -2, 2);
  auto v = testing::random_vector<T>(B * c.M * Hkv * Dv, 3, -2, 2);
  ExactOptions options;
  options.causal = true;
  options.window = c.window;
  auto run = [&](std::vector<T>& out, std::vector<T>& lse) {
    out.assign(B * c.N * H * Dv, T(-7));
    lse.assign(B * H * c.N, T(-7));
    exact_attention_forward<T>(Context{}, View4<const T>(q.data(), {B, c.N, H, D}),
                               View4<const T>(k.data(), {B, c.M, Hkv, D}),
                               View4<const T>(v.data(), {B, c.M, Hkv, Dv}), options,
                               View4<T>(out.data(), {B, c.N, H, Dv}),
                               View3<T>(lse.data(), {B, H, c.N}));
  };
  std::vector<T> clean_out, clean_lse, out, lse;
  run(clean_out, clean_lse);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      for (int64_t d = 0; d < D; ++d) k[((b * c.M + c.poisoned) * Hkv + h) * D + d] = hostile;
      for (int64_t d = 0; d < Dv; ++d) v[((b * c.M + c.poisoned) * Hkv + h) * Dv + d] = hostile;
    }
  run(out, lse);
  int64_t blind_rows = 0;
  for (int64_t i = 0; i < c.N; ++i) {
    const KeyRange range = visible_keys(i, c.N, c.M, true, c.window);
    if (range.first <= c.poisoned && c.poisoned < range.last) continue;  // row i sees it
    ++blind_rows;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < Dv; ++d) {
          const int64_t at = ((b * c.N + i) * H + h) * Dv + d;
          // Bit-identical: the masked entry is not read at all.
          ASSERT_EQ(out[at], clean_out[at]) << "row " << i << " head " << h << " hostile "
                                            << hostile << " N " << c.N << " M " << c.M;
        }
        const int64_t at = (b * H + h) * c.N + i;
        ASSERT_TRUE(lse[at] == clean_lse[at]) << "lse row " << i;
      }
  }
  EXPECT_GT(blind_rows, 0);
}

TEST(ExactHostile, MaskedEntriesNeverInfluenceOutputs) {
  const std::vector<MaskedCase> cases = {
      {131, 131, 0, 130},  // the last token, invisible to every earlier row
      {40, 40, 5, 3},      // left of the window of rows 8 and on; right of rows 0 to 2
      {20, 50, 0, 45},     // decode-style N < M: rows 0 to 14 do not see key 45
      {50, 20, 0, 19},     // N > M: the first 30 rows see nothing at all
      {300, 300, 64, 0},   // a padding token at the start, outside long windows
  };
  for (const MaskedCase& c : cases) {
    for (double hostile : {std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(), 1e30}) {
      expect_masked_entries_ignored<float>(c, static_cast<float>(hostile));
      expect_masked_entries_ignored<double>(c, hostile);
    }
  }
}

// The backward of the cases above: a query that does not see the hostile key and value gets
// a bit-identical dq (the kernel works partially masked tiles in strips of queries, tile
// products over the keys the whole strip sees and query by query beside them; no product
// may read a masked pair, or 0 * NaN would reach dq).
template <typename T>
void expect_masked_entries_ignored_by_backward(const MaskedCase& c, T hostile) {
  const int64_t B = 1, H = 2, Hkv = 1, D = 19, Dv = 7;
  const auto q = testing::random_vector<T>(B * c.N * H * D, 1, -2, 2);
  const auto dout = testing::random_vector<T>(B * c.N * H * Dv, 4, -1, 1);
  auto k = testing::random_vector<T>(B * c.M * Hkv * D, 2, -2, 2);
  auto v = testing::random_vector<T>(B * c.M * Hkv * Dv, 3, -2, 2);
  ExactOptions options;
  options.causal = true;
  options.window = c.window;
  auto run = [&](std::vector<T>& dq) {
    std::vector<T> out(B * c.N * H * Dv), lse(B * H * c.N), dk(k.size()), dv(v.size());
    const View4<const T> qv(q.data(), {B, c.N, H, D}), kv(k.data(), {B, c.M, Hkv, D});
    const View4<const T> vv(v.data(), {B, c.M, Hkv, Dv});
    exact_attention_forward<T>(Context{}, qv, kv, vv, options,
                               View4<T>(out.data(), {B, c.N, H, Dv}),
                               View3<T>(lse.data(), {B, H, c.N}));
    dq.assign(q.size(), T(-7));
    exact_attention_backward<T>(Context{}, qv, kv, vv,
                                View4<const T>(out.data(), {B, c.N, H, Dv}),
                                View3<const T>(lse.data(), {B, H, c.N}),
                                View4<const T>(dout.data(), {B, c.N, H, Dv}), {}, options,
                                View4<T>(dq.data(), {B, c.N, H, D}),
                                View4<T>(dk.data(), {B, c.M, Hkv, D}),
                                View4<T>(dv.data(), {B, c.M, Hkv, Dv}));
  };
  std::vector<T> clean, poisoned;
  run(clean);
  for (int64_t d = 0; d < D; ++d) k[c.poisoned * D + d] = hostile;
  for (int64_t d = 0; d < Dv; ++d) v[c.poisoned * Dv + d] = hostile;
  run(poisoned);
  int64_t blind_rows = 0;
  for (int64_t i = 0; i < c.N; ++i) {
    const KeyRange range = visible_keys(i, c.N, c.M, true, c.window);
    if (range.first <= c.poisoned && c.poisoned < range.last) continue;  // row i sees it
    ++blind_rows;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t at = (i * H + h) * D + d;
        ASSERT_TRUE(std::isfinite(poisoned[at]) && poisoned[at] == clean[at])
            << "dq row " << i << " head " << h << " hostile " << hostile << " N " << c.N
            << " M " << c.M << " window " << c.window;
      }
  }
  EXPECT_GT(blind_rows, 0);
}

TEST(ExactHostile, MaskedEntriesNeverReachDq) {
  const std::vector<MaskedCase> cases = {
      {131, 131, 0, 130}, {40, 40, 5, 3}, {20, 50, 0, 45}, {50, 20, 0, 19},
      {150, 150, 64, 0},  {150, 150, 37, 75},  // a window of 37 keys: ragged on both sides
  };
  for (const MaskedCase& c : cases) {
    for (double hostile : {std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(), 1e30})
      expect_masked_entries_ignored_by_backward<float>(c, static_cast<float>(hostile));
    expect_masked_entries_ignored_by_backward<double>(c, std::numeric_limits<double>::quiet_NaN());
  }
}

// Zero-volume backward: no queries over a batch of 1e18 returns at once (the kernel's loop
// over B H heads ran for minutes at B = 1e9), and keys that no query reads get zero
// gradients (dk, dv have volume when only N = 0).
TEST(ExactHostile, ZeroQueryBackwardReturnsAtOnceWithZeroKeyGradients) {
  const int64_t huge = 999999999999999999;
  std::vector<float> none(1);
  const View4<const float> q(none.data(), {huge, 0, 2, 4}), v(none.data(), {huge, 0, 1, 3});
  const View3<const float> lse(none.data(), {huge, 2, 0});
  exact_attention_backward<float>(Context{}, q, View4<const float>(none.data(), {huge, 0, 1, 4}),
                                  v, View4<const float>(none.data(), {huge, 0, 2, 3}), lse,
                                  View4<const float>(none.data(), {huge, 0, 2, 3}), {}, {},
                                  View4<float>(none.data(), {huge, 0, 2, 4}),
                                  View4<float>(none.data(), {huge, 0, 1, 4}),
                                  View4<float>(none.data(), {huge, 0, 1, 3}));
  const int64_t M = 5;
  const auto k = testing::random_vector<float>(M * 4, 4), values = testing::random_vector<float>(M * 3, 5);
  std::vector<float> dk(M * 4, -7.0f), dv(M * 3, -7.0f);
  exact_attention_backward<float>(
      Context{}, View4<const float>(none.data(), {1, 0, 2, 4}),
      View4<const float>(k.data(), {1, M, 1, 4}), View4<const float>(values.data(), {1, M, 1, 3}),
      View4<const float>(none.data(), {1, 0, 2, 3}), View3<const float>(none.data(), {1, 2, 0}),
      View4<const float>(none.data(), {1, 0, 2, 3}), {}, {},
      View4<float>(none.data(), {1, 0, 2, 4}), View4<float>(dk.data(), {1, M, 1, 4}),
      View4<float>(dv.data(), {1, M, 1, 3}));
  for (float x : dk) EXPECT_EQ(x, 0.0f);
  for (float x : dv) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace subquad
