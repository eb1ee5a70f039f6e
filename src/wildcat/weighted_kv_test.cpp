// Tests of weighted KV attention, CompressKV and the StreamingLLM / SnapKV baselines: entries
// against dense float64 Nyström weights, attention against float64 references, budgets,
// determinism and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "common/test_support.h"
#include "subquad/wildcat.h"
#include "wildcat/weighted_attention.h"
#include "wildcat/wildcat_ref.h"
#include "wildcat/wildcat_test_util.h"

namespace subquad {
namespace {

using testing::expect_within_reference_error;
using testing::max_abs;
using testing::max_abs_diff;
using testing::random_vector;

struct Kv {
  int64_t B, M, Hkv, D, Dv;
  std::vector<float> k, v;
  View4<const float> keys() const { return View4<const float>(k.data(), {B, M, Hkv, D}); }
  View4<const float> values() const { return View4<const float>(v.data(), {B, M, Hkv, Dv}); }
};

Kv random_kv(int64_t B, int64_t M, int64_t Hkv, int64_t D, int64_t Dv, uint64_t seed) {
  return {B,
          M,
          Hkv,
          D,
          Dv,
          random_vector<float>(B * M * Hkv * D, seed),
          random_vector<float>(B * M * Hkv * Dv, seed + 1)};
}

// A selection's entries (weighted_kv_entries), read per head as the tests compare them.
struct Cache {
  WeightedKVEntries e;
  int64_t batch() const { return e.batch; }
  int64_t kv_heads() const { return e.kv_heads; }
  int64_t head_dim() const { return e.head_dim; }
  int64_t value_dim() const { return e.value_dim; }
  int64_t length(int64_t b, int64_t hkv) const { return e.lengths[b * e.kv_heads + hkv]; }
  // The first `length` rows of (b, hkv) of a [B, Hkv, L, width] array.
  std::vector<float> rows(const std::vector<float>& x, int64_t b, int64_t hkv,
                          int64_t width) const {
    const auto first = x.begin() + (b * e.kv_heads + hkv) * e.entries * width;
    return {first, first + length(b, hkv) * width};
  }
  std::vector<float> keys(int64_t b, int64_t hkv) const { return rows(e.keys, b, hkv, e.head_dim); }
  std::vector<float> values(int64_t b, int64_t hkv) const {
    return rows(e.values, b, hkv, e.value_dim + 1);
  }
  std::vector<float> log_scales(int64_t b, int64_t hkv) const {
    return rows(e.log_scales, b, hkv, 1);
  }
  std::vector<float> value_min(int64_t b, int64_t hkv) const {
    const auto first = e.value_min.begin() + (b * e.kv_heads + hkv) * e.value_dim;
    return {first, first + e.value_dim};
  }
  std::vector<float> value_max(int64_t b, int64_t hkv) const {
    const auto first = e.value_max.begin() + (b * e.kv_heads + hkv) * e.value_dim;
    return {first, first + e.value_dim};
  }
};

Cache compress(const CompressKV& press, const Context& context, View4<const float> k,
               View4<const float> v) {
  return {weighted_kv_entries(k, v, press.select(context, k, v))};
}

Cache streaming_llm_cache(View4<const float> k, View4<const float> v, int64_t sink,
                          int64_t window) {
  return {weighted_kv_entries(k, v, streaming_llm_select(k, v, sink, window))};
}

Cache snapkv_cache(const Context& context, View4<const float> q_obs, View4<const float> k,
                   View4<const float> v, const SnapKVOptions& options) {
  return {weighted_kv_entries(k, v, snapkv_select(context, q_obs, k, v, options))};
}

// Attention of q [B, N, H, D] over the entries, through weighted_kv_attention.
std::vector<float> attend(const Cache& cache, const std::vector<float>& q, int64_t N, int64_t H,
                          int threads = 1) {
  std::vector<float> out(cache.batch() * N * H * cache.value_dim(), -3.0f);
  weighted_kv_attention(Context{Device::cpu, threads},
                        View4<const float>(q.data(), {cache.batch(), N, H, cache.head_dim()}),
                        cache.e.view(),
                        View4<float>(out.data(), {cache.batch(), N, H, cache.value_dim()}));
  return out;
}

// The weighted attention in precision T over the entries of every (b, kv head) of the cache.
template <typename T>
std::vector<T> cache_reference(const Cache& cache, const std::vector<float>& q, int64_t N,
                               int64_t H) {
  using testing::cast_vector;
  const int64_t B = cache.batch(), Hkv = cache.kv_heads(), D = cache.head_dim(),
                Dv = cache.value_dim(), group = H / Hkv;
  std::vector<T> out(B * N * H * Dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hkv = h / group;
      std::vector<T> rows;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t e = 0; e < D; ++e) rows.push_back(q[((b * N + i) * H + h) * D + e]);
      const auto result = wildcat::weighted_attention_reference<T>(
          rows, D, cast_vector<T>(cache.keys(b, hkv)), cast_vector<T>(cache.log_scales(b, hkv)),
          cast_vector<T>(cache.values(b, hkv)), Dv, T(1.0 / std::sqrt(double(D))),
          cast_vector<T>(cache.value_min(b, hkv)), cast_vector<T>(cache.value_max(b, hkv)),
          T(wildcat::relative_denominator_floor(cache.length(b, hkv))));
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < Dv; ++c) out[((b * N + i) * H + h) * Dv + c] = result[i * Dv + c];
    }
  return out;
}

// The cache's attention against the float64 weighted attention over its entries, by the
// project's rule (the float32 run of the same reference sets the scale).
void expect_matches_cache_reference(const Cache& cache, const std::vector<float>& q,
                                    int64_t N, int64_t H) {
  expect_within_reference_error(attend(cache, q, N, H), cache_reference<float>(cache, q, N, H),
                                cache_reference<double>(cache, q, N, H));
}

// Exact attention in precision T of q [B, N, H, D] over k, v [B, M, Hkv, *].
template <typename T>
std::vector<T> exact_reference(const std::vector<float>& q, int64_t N, int64_t H, const Kv& kv) {
  return testing::exact_attention<T>({kv.B, N, kv.M, H, kv.Hkv, kv.D, kv.Dv}, q, kv.k, kv.v);
}

// attend() over a cache of exact entries only, against exact attention over `kv`.
void expect_exact_attention(const Cache& cache, const std::vector<float>& q, int64_t N,
                            int64_t H, const Kv& kv) {
  expect_within_reference_error(attend(cache, q, N, H), exact_reference<float>(q, N, H, kv),
                                exact_reference<double>(q, N, H, kv));
}

TEST(CompressKV, BudgetFollowsTheCompressionRatio) {
  CompressKVOptions options;  // sink 32, window 32, ratio 0.75, bin_rank 16
  const CompressKV press(options);
  // middle 936, kept 234 -> 14 bins of 16 points.
  EXPECT_EQ(press.bins(1000), 14);
  EXPECT_EQ(press.bins(64), 0);  // nothing between sinks and window
  EXPECT_EQ(press.bins(70), 1);  // kept budget below one bin: one bin
  const Kv kv = random_kv(1, 1000, 1, 8, 4, 3);
  const auto cache = compress(press, Context{Device::cpu, 1}, kv.keys(), kv.values());
  EXPECT_LE(cache.length(0, 0), 32 + 14 * 16 + 32);
  EXPECT_GE(cache.length(0, 0), 32 + 14 + 32);
}

TEST(CompressKV, EntriesAreSinksNystromCoresetAndWindow) {
  const int64_t B = 2, M = 170, Hkv = 2, D = 6, Dv = 5, bin_size = 16;
  const Kv kv = random_kv(B, M, Hkv, D, Dv, 17);
  CompressKVOptions options;
  options.sink = 4;
  options.window = 6;
  options.bin_rank = 4;
  options.seed = 3;
  const CompressKV press(options);
  const int64_t C = press.bins(M);  // middle 160, kept 40 -> 10 bins of 16 keys
  ASSERT_EQ(C, 10);
  const auto cache = compress(press, Context{Device::cpu, 1}, kv.keys(), kv.values());
  const double beta = 1.0 / std::sqrt(double(D));
  // The coreset entries of every bin, with their float32 and float64 dense Nyström weights:
  // compared at once, so that the float32 reference's error is the worst over 40 bins, not
  // the luck of 4 points.
  std::vector<double> coreset, expected64;
  std::vector<float> expected32;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      const auto& keys = cache.keys(b, hkv);
      const auto& values = cache.values(b, hkv);
      const int64_t L = cache.length(b, hkv);
      ASSERT_EQ(L, 4 + C * 4 + 6);
      auto key = [&](int64_t j) { return &kv.k[((b * M + j) * Hkv + hkv) * D]; };
      auto value = [&](int64_t j) { return &kv.v[((b * M + j) * Hkv + hkv) * Dv]; };
      // Sinks and window: exact copies with weight 1.
      for (int64_t e = 0; e < L; ++e) {
        const int64_t j = e < 4 ? e : e >= L - 6 ? M - (L - e) : -1;
        if (j < 0) continue;
        EXPECT_TRUE(std::equal(key(j), key(j) + D, keys.begin() + e * D));
        EXPECT_TRUE(std::equal(value(j), value(j) + Dv, values.begin() + e * (Dv + 1)));
        EXPECT_EQ(values[e * (Dv + 1) + Dv], 1.0f);
      }
      // Coreset entries of each bin: original keys, values and weights equal to the dense
      // exponential-kernel Nyström weights W = H_SS^-1 H_S: at the bin's temperature.
      std::vector<double> mean(D, 0.0);
      for (int64_t j = 0; j < M; ++j)
        for (int64_t e = 0; e < D; ++e) mean[e] += key(j)[e] / double(M);
      for (int64_t c = 0; c < C; ++c) {
        const int64_t first = 4 + c * bin_size;
        std::vector<float> centered, bin_values;
        double radius = 0.0;
        for (int64_t j = first; j < first + bin_size; ++j) {
          double sq = 0.0;
          for (int64_t e = 0; e < D; ++e) {
            centered.push_back(static_cast<float>(key(j)[e] - mean[e]));
            sq += double(centered.back()) * centered.back();
          }
          radius = std::max(radius, std::sqrt(sq));
          for (int64_t col = 0; col < Dv; ++col) bin_values.push_back(value(j)[col]);
        }
        // The scaled keys rounded to float as compress_bin rounds them: both references start
        // from the float32 input the factorization sees.
        const auto multiplier =
            static_cast<float>(std::sqrt(beta) / wildcat_temperature(beta, 0.0, radius, bin_size));
        for (float& x : centered) x *= multiplier;
        std::vector<int64_t> pivots;
        for (int64_t e = 4 + c * 4; e < 4 + (c + 1) * 4; ++e)
          for (int64_t j = first; j < first + bin_size; ++j)
            if (std::equal(key(j), key(j) + D, keys.begin() + e * D)) pivots.push_back(j - first);
        ASSERT_EQ(pivots.size(), 4u) << "coreset keys are keys of their bin";
        for (int64_t e = 4 + c * 4; e < 4 + (c + 1) * 4; ++e) {
          const double scale = std::exp(double(cache.log_scales(b, hkv)[e]));
          for (int64_t col = 0; col <= Dv; ++col)
            coreset.push_back(scale * values[e * (Dv + 1) + col]);
        }
        // The float32 reference forms the weights through the explicit inverse, the fast
        // path's way (see wildcat_test_util.h).
        const auto bin32 = testing::nystrom_values_by_inverse(centered, D, bin_values, Dv, pivots);
        const auto bin64 =
            wildcat::nystrom_values_reference(testing::cast_vector<double>(centered), D,
                                              testing::cast_vector<double>(bin_values), Dv, pivots);
        expected32.insert(expected32.end(), bin32.begin(), bin32.end());
        expected64.insert(expected64.end(), bin64.begin(), bin64.end());
      }
    }
  expect_within_reference_error(coreset, expected32, expected64);
}

// The selection names the token of every entry the cache holds, even where two tokens
// share a key: each entry's key is k's row at its index, and its value, weight and log
// scale are the cache's.
void expect_selection_is_the_cache(const KVSelection& selection, const Cache& cache,
                                   const Kv& kv) {
  ASSERT_EQ(selection.batch, kv.B);
  ASSERT_EQ(selection.kv_heads, kv.Hkv);
  for (int64_t b = 0; b < kv.B; ++b)
    for (int64_t hkv = 0; hkv < kv.Hkv; ++hkv) {
      const KVSelection::Head& head = selection.head(b, hkv);
      const auto L = static_cast<int64_t>(head.indices.size());
      ASSERT_EQ(L, cache.length(b, hkv));
      ASSERT_EQ(head.values.size(), size_t(L * kv.Dv));
      for (int64_t e = 0; e < L; ++e) {
        const int64_t j = head.indices[e];
        ASSERT_TRUE(j >= 0 && j < kv.M);
        const float* key = &kv.k[((b * kv.M + j) * kv.Hkv + hkv) * kv.D];
        EXPECT_TRUE(std::equal(key, key + kv.D, cache.keys(b, hkv).begin() + e * kv.D));
        for (int64_t c = 0; c < kv.Dv; ++c)
          EXPECT_EQ(head.values[e * kv.Dv + c], cache.values(b, hkv)[e * (kv.Dv + 1) + c]);
        EXPECT_EQ(head.weights[e], cache.values(b, hkv)[e * (kv.Dv + 1) + kv.Dv]);
        EXPECT_EQ(head.log_scales[e], cache.log_scales(b, hkv)[e]);
      }
    }
  EXPECT_EQ(selection.max_entries(), cache.length(0, 0));
}

TEST(KVSelection, CompressKVStreamingLLMAndSnapKVNameTheirTokens) {
  const int64_t B = 2, M = 170, Hkv = 2, H = 4, D = 6, Dv = 5, W = 4;
  Kv kv = random_kv(B, M, Hkv, D, Dv, 50);
  // Token 100 repeats token 99's key (its value differs): only an index tells them apart.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv)
      std::copy_n(&kv.k[((b * M + 99) * Hkv + hkv) * D], D, &kv.k[((b * M + 100) * Hkv + hkv) * D]);
  CompressKVOptions options;
  options.sink = 4;
  options.window = 6;
  options.bin_rank = 4;
  const CompressKV press(options);
  const Context context{Device::cpu, 2};
  const KVSelection selection = press.select(context, kv.keys(), kv.values());
  expect_selection_is_the_cache(selection, compress(press, context, kv.keys(), kv.values()), kv);
  const KVSelection::Head& head = selection.head(1, 1);
  EXPECT_EQ(std::vector<int64_t>(head.indices.begin(), head.indices.begin() + 4),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(head.indices.back(), M - 1);

  expect_selection_is_the_cache(streaming_llm_select(kv.keys(), kv.values(), 3, 5),
                                streaming_llm_cache(kv.keys(), kv.values(), 3, 5), kv);
  const auto q_obs = random_vector<float>(B * W * H * D, 51);
  const View4<const float> q_view(q_obs.data(), {B, W, H, D});
  SnapKVOptions snap;
  snap.capacity = 20;
  expect_selection_is_the_cache(snapkv_select(context, q_view, kv.keys(), kv.values(), snap),
                                snapkv_cache(context, q_view, kv.keys(), kv.values(), snap), kv);
  KVSelection wrong = selection;
  wrong.heads[0].indices[0] = M;
  EXPECT_THROW(weighted_kv_entries(kv.keys(), kv.values(), wrong), Error);
}

TEST(CompressKV, AttentionEqualsWeightedAttentionOverTheCoreset) {
  const int64_t B = 1, M = 300, Hkv = 2, H = 4, D = 16, Dv = 8, N = 7;
  const Kv kv = random_kv(B, M, Hkv, D, Dv, 5);
  CompressKVOptions options;
  options.sink = 8;
  options.window = 8;
  options.bin_rank = 8;
  const auto cache = compress(CompressKV(options), Context{Device::cpu, 1}, kv.keys(), kv.values());
  const auto q = random_vector<float>(B * N * H * D, 6);
  expect_matches_cache_reference(cache, q, N, H);
  // And it approximates exact attention over the full cache: closer than keeping as many
  // exact tokens (StreamingLLM: the sinks and the most recent ones) and than outputting zeros
  // (with random keys the exact output averages all M values; measured max errors 0.022,
  // 0.157 and 0.114).
  const auto exact = exact_reference<double>(q, N, H, kv);
  const double error = max_abs_diff(attend(cache, q, N, H), exact);
  const int64_t L = cache.length(0, 0);
  const auto streaming =
      streaming_llm_cache(kv.keys(), kv.values(), options.sink, L - options.sink);
  ASSERT_EQ(streaming.length(0, 0), L);
  EXPECT_LT(error, max_abs_diff(attend(streaming, q, N, H), exact));
  EXPECT_LT(error, max_abs(exact));
}

TEST(CompressKV, ShortPromptsStayExactAndSeedsAreReproducible) {
  const Kv kv = random_kv(1, 50, 1, 8, 4, 12);
  const auto q = random_vector<float>(3 * 2 * 8, 13);
  const auto cache = compress(CompressKV(CompressKVOptions{}), Context{}, kv.keys(), kv.values());
  EXPECT_EQ(cache.length(0, 0), 50);  // M <= sink + window: nothing to compress
  expect_exact_attention(cache, q, 3, 2, kv);

  const Kv long_kv = random_kv(1, 400, 2, 8, 4, 14);
  CompressKVOptions options;
  options.seed = 21;
  const auto a =
      compress(CompressKV(options), Context{Device::cpu, 2}, long_kv.keys(), long_kv.values());
  const auto b =
      compress(CompressKV(options), Context{Device::cpu, 2}, long_kv.keys(), long_kv.values());
  EXPECT_EQ(a.keys(0, 1), b.keys(0, 1));
  EXPECT_EQ(a.values(0, 1), b.values(0, 1));
}

TEST(CompressKV, BadOptionsThrow) {
  CompressKVOptions options;
  options.compression_ratio = 1.0;
  EXPECT_THROW(CompressKV{options}, Error);
  options = {};
  options.bin_rank = 0;
  EXPECT_THROW(CompressKV{options}, Error);
  options = {};
  options.sink = -1;
  EXPECT_THROW(CompressKV{options}, Error);
  const Kv kv = random_kv(1, 10, 1, 4, 2, 1);
  EXPECT_THROW(weighted_kv_entries(kv.keys(), View4<const float>(kv.v.data(), {1, 9, 1, 2}),
                                   streaming_llm_select(kv.keys(), kv.values(), 2, 2)),
               Error);
  const Cache cache = streaming_llm_cache(kv.keys(), kv.values(), 2, 2);
  std::vector<float> q(12), out(9);
  auto attend_into = [&](View4<const float> queries, const WeightedKV& entries, int64_t Dv) {
    weighted_kv_attention(Context{}, queries, entries, View4<float>(out.data(), {1, 3, 1, Dv}));
  };
  const View4<const float> queries(q.data(), {1, 3, 1, 4});
  attend_into(queries, cache.e.view(), 2);  // fine
  EXPECT_THROW(attend_into(queries, cache.e.view(), 3), Error);  // out's Dv
  EXPECT_THROW(attend_into(View4<const float>(q.data(), {1, 2, 1, 6}), cache.e.view(), 2), Error);
  WeightedKV bad = cache.e.view();
  bad.value_max = {};  // one of the range without the other
  EXPECT_THROW(attend_into(queries, bad, 2), Error);
  bad = cache.e.view();
  bad.keys.strides[2] = 8;  // entries of a head not contiguous
  EXPECT_THROW(attend_into(queries, bad, 2), Error);
  const std::vector<int64_t> too_long{5};
  bad = cache.e.view();
  bad.lengths = View2<const int64_t>(too_long.data(), {1, 1});
  EXPECT_THROW(attend_into(queries, bad, 2), Error);
}

TEST(CacheBaselines, StreamingLLMKeepsSinksAndWindow) {
  const int64_t M = 40, D = 4, Dv = 3;
  const Kv kv = random_kv(1, M, 1, D, Dv, 30);
  const auto cache = streaming_llm_cache(kv.keys(), kv.values(), 3, 5);
  ASSERT_EQ(cache.length(0, 0), 8);
  Kv kept{1, 8, 1, D, Dv, {}, {}};
  for (int64_t j : {0, 1, 2, 35, 36, 37, 38, 39}) {
    kept.k.insert(kept.k.end(), kv.k.begin() + j * D, kv.k.begin() + (j + 1) * D);
    kept.v.insert(kept.v.end(), kv.v.begin() + j * Dv, kv.v.begin() + (j + 1) * Dv);
  }
  const auto q = random_vector<float>(4 * D, 31);
  expect_exact_attention(cache, q, 4, 1, kept);
  EXPECT_EQ(streaming_llm_cache(kv.keys(), kv.values(), 30, 30).length(0, 0), M);
}

TEST(CacheBaselines, SnapKVKeepsTheMostVotedTokens) {
  const int64_t M = 200, Hkv = 2, H = 4, D = 8, Dv = 3, W = 6;
  Kv kv = random_kv(1, M, Hkv, D, Dv, 40);
  for (float& x : kv.k) x *= 0.1f;
  auto q_obs = random_vector<float>(W * H * D, 41, 0.5, 1.0);
  // Plant tokens aligned with every observation query: they must be kept.
  const std::vector<int64_t> planted = {17, 90, 150};
  for (int64_t j : planted)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv)
      for (int64_t e = 0; e < D; ++e) kv.k[(j * Hkv + hkv) * D + e] = 3.0f;
  SnapKVOptions options;
  options.capacity = 30;
  const auto cache = snapkv_cache(Context{}, View4<const float>(q_obs.data(), {1, W, H, D}),
                                  kv.keys(), kv.values(), options);
  for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
    ASSERT_EQ(cache.length(0, hkv), 30);
    const auto& keys = cache.keys(0, hkv);
    for (int64_t j : planted) {
      bool found = false;
      for (int64_t e = 0; e < 30 && !found; ++e)
        found = std::equal(keys.begin() + e * D, keys.begin() + (e + 1) * D,
                           kv.k.begin() + (j * Hkv + hkv) * D);
      EXPECT_TRUE(found) << "planted token " << j;
    }
    // The observation window closes the cache, in order.
    for (int64_t w = 0; w < W; ++w)
      EXPECT_TRUE(std::equal(keys.begin() + (30 - W + w) * D, keys.begin() + (31 - W + w) * D,
                             kv.k.begin() + ((M - W + w) * Hkv + hkv) * D));
  }
  options.capacity = M;
  EXPECT_EQ(snapkv_cache(Context{}, View4<const float>(q_obs.data(), {1, W, H, D}), kv.keys(),
                         kv.values(), options)
                .length(0, 0),
            M);
  options.capacity = W - 1;
  EXPECT_THROW(snapkv_cache(Context{}, View4<const float>(q_obs.data(), {1, W, H, D}), kv.keys(),
                            kv.values(), options),
               Error);
  options.capacity = 30;
  options.pool_kernel = 4;
  EXPECT_THROW(snapkv_cache(Context{}, View4<const float>(q_obs.data(), {1, W, H, D}), kv.keys(),
                            kv.values(), options),
               Error);
}

}  // namespace
}  // namespace subquad
