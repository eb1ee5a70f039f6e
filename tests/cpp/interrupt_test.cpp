// Context::interrupt: an operator polls it between its tasks (parallel_for) and, once it asks,
// skips the rest and throws Interrupted; an Interrupt that never asks changes nothing (the
// outputs are bit-identical to calls without one). Exact attention forward and backward,
// WildCat attention (also inside one bin's pivots) and a weighted KV cache's attend, from the
// first poll and from a poll in the middle of the call.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "common/test_support.h"
#include "subquad/context.h"
#include "subquad/error.h"
#include "subquad/exact.h"
#include "subquad/wildcat.h"

namespace subquad {
namespace {

using testing::random_vector;

// Asks to stop at its `stop_at`-th poll (0: never), counting the polls of every thread.
class CountingInterrupt final : public Interrupt {
 public:
  explicit CountingInterrupt(int64_t stop_at) : stop_at_(stop_at) {}
  bool poll() override {
    const int64_t count = polls_.fetch_add(1, std::memory_order_relaxed) + 1;
    return stop_at_ > 0 && count >= stop_at_;
  }
  int64_t polls() const { return polls_.load(); }

 private:
  int64_t stop_at_;
  std::atomic<int64_t> polls_{0};
};

Context with(Interrupt* interrupt, int threads) {
  Context context;
  context.threads = threads;
  context.interrupt = interrupt;
  return context;
}

TEST(Interrupt, ParallelForStopsAndThrows) {
  for (int threads : {1, 2}) {
    CountingInterrupt stop_at_ten(10);
    std::atomic<int64_t> ran{0};
    EXPECT_THROW(parallel_for(with(&stop_at_ten, threads), 1000, [&](int64_t) { ++ran; }),
                 Interrupted);
    EXPECT_GE(ran.load(), 9);
    EXPECT_LT(ran.load(), 1000 - 1);  // the rest was skipped
    // A flag set from another thread.
    InterruptFlag flag;
    std::atomic<int64_t> after{0};
    EXPECT_THROW(parallel_for(with(&flag, threads), 1 << 20,
                              [&](int64_t i) {
                                if (i == 5) flag.request();
                                ++after;
                              }),
                 Interrupted);
    EXPECT_LT(after.load(), int64_t(1) << 20);
    // Never asked: every index runs, and each was polled.
    CountingInterrupt never(0);
    std::atomic<int64_t> all{0};
    parallel_for(with(&never, threads), 777, [&](int64_t) { ++all; });
    EXPECT_EQ(all.load(), 777);
    EXPECT_EQ(never.polls(), 777);
  }
  // A body's own failure wins over an interruption.
  CountingInterrupt stop_at_three(3);
  EXPECT_THROW(parallel_for(with(&stop_at_three, 1), 10,
                            [&](int64_t i) {
                              if (i == 1) throw Error("body failed");
                            }),
               Error);
}

struct Attention {
  int64_t B = 1, N = 300, M = 400, H = 4, Hkv = 2, D = 24, Dv = 16;
  std::vector<float> q = random_vector<float>(B * N * H * D, 1);
  std::vector<float> k = random_vector<float>(B * M * Hkv * D, 2);
  std::vector<float> v = random_vector<float>(B * M * Hkv * Dv, 3);
  View4<const float> qv() const { return {q.data(), {B, N, H, D}}; }
  View4<const float> kv() const { return {k.data(), {B, M, Hkv, D}}; }
  View4<const float> vv() const { return {v.data(), {B, M, Hkv, Dv}}; }
};

TEST(Interrupt, ExactAttentionForwardAndBackward) {
  const Attention a;
  ExactOptions options;
  options.causal = true;
  std::vector<float> out(a.B * a.N * a.H * a.Dv), lse(a.B * a.H * a.N);
  auto forward = [&](Interrupt* interrupt, int threads) {
    exact_attention_forward<float>(with(interrupt, threads), a.qv(), a.kv(), a.vv(), options,
                                   View4<float>(out.data(), {a.B, a.N, a.H, a.Dv}),
                                   View3<float>(lse.data(), {a.B, a.H, a.N}));
  };
  forward(nullptr, 1);
  const std::vector<float> plain_out = out, plain_lse = lse;
  for (int threads : {1, 2}) {
    CountingInterrupt never(0);
    forward(&never, threads);
    EXPECT_EQ(out, plain_out);
    EXPECT_EQ(lse, plain_lse);
    EXPECT_GT(never.polls(), 1);
    for (int64_t stop_at : {int64_t(1), never.polls() / 2}) {
      CountingInterrupt stop(stop_at);
      EXPECT_THROW(forward(&stop, threads), Interrupted) << "stop at poll " << stop_at;
    }
  }
  const std::vector<float> dout = random_vector<float>(out.size(), 4);
  std::vector<float> dq(a.q.size()), dk(a.k.size()), dv(a.v.size());
  auto backward = [&](Interrupt* interrupt) {
    exact_attention_backward<float>(
        with(interrupt, 2), a.qv(), a.kv(), a.vv(),
        View4<const float>(plain_out.data(), {a.B, a.N, a.H, a.Dv}),
        View3<const float>(plain_lse.data(), {a.B, a.H, a.N}),
        View4<const float>(dout.data(), {a.B, a.N, a.H, a.Dv}), View3<const float>(), options,
        View4<float>(dq.data(), {a.B, a.N, a.H, a.D}), View4<float>(dk.data(), {a.B, a.M, a.Hkv, a.D}),
        View4<float>(dv.data(), {a.B, a.M, a.Hkv, a.Dv}));
  };
  CountingInterrupt never(0);
  backward(&never);
  CountingInterrupt stop(never.polls() / 2 + 1);
  EXPECT_THROW(backward(&stop), Interrupted);
}

TEST(Interrupt, WildcatAttentionAndWeightedCache) {
  const Attention a;
  WildcatOptions options;
  options.rank = 32;
  options.bins = 2;
  std::vector<float> out(a.B * a.N * a.H * a.Dv);
  auto attend = [&](Interrupt* interrupt) {
    wildcat_attention(with(interrupt, 2), a.qv(), a.kv(), a.vv(), options,
                      View4<float>(out.data(), {a.B, a.N, a.H, a.Dv}));
  };
  attend(nullptr);
  const std::vector<float> plain = out;
  CountingInterrupt never(0);
  attend(&never);
  EXPECT_EQ(out, plain);
  for (int64_t stop_at : {int64_t(1), never.polls() / 2 + 1}) {
    CountingInterrupt stop(stop_at);
    EXPECT_THROW(attend(&stop), Interrupted) << "stop at poll " << stop_at;
  }
  // One kv head and one bin: a single task, whose pivots poll too (one bin of a long
  // sequence is minutes of pivoted Cholesky).
  WildcatOptions one_bin;
  one_bin.rank = 64;
  const View4<const float> one_head_k(a.k.data(), {a.B, a.M, 1, a.D}, {a.M * a.Hkv * a.D, a.Hkv * a.D, a.D, 1});
  const View4<const float> one_head_v(a.v.data(), {a.B, a.M, 1, a.Dv}, {a.M * a.Hkv * a.Dv, a.Hkv * a.Dv, a.Dv, 1});
  auto attend_one_bin = [&](Interrupt* interrupt) {
    wildcat_attention(with(interrupt, 1), a.qv(), one_head_k, one_head_v, one_bin,
                      View4<float>(out.data(), {a.B, a.N, a.H, a.Dv}));
  };
  CountingInterrupt counted(0);
  attend_one_bin(&counted);
  EXPECT_GE(counted.polls(), one_bin.rank);  // a poll per pivot
  CountingInterrupt in_the_pivots(10);
  EXPECT_THROW(attend_one_bin(&in_the_pivots), Interrupted);
  EXPECT_EQ(in_the_pivots.polls(), 10);
  // Weighted KV attention over every token: interrupted, then run again once cleared.
  const WeightedKVEntries entries =
      weighted_kv_entries(a.kv(), a.vv(), streaming_llm_select(a.kv(), a.vv(), a.M, 0));
  InterruptFlag flag;
  flag.request();
  EXPECT_THROW(weighted_kv_attention(with(&flag, 1), a.qv(), entries.view(),
                                     View4<float>(out.data(), {a.B, a.N, a.H, a.Dv})),
               Interrupted);
  flag.clear();
  weighted_kv_attention(with(&flag, 1), a.qv(), entries.view(),
                        View4<float>(out.data(), {a.B, a.N, a.H, a.Dv}));
}

}  // namespace
}  // namespace subquad
