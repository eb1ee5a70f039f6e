// Benchmarks of exact attention on one thread: forward and backward (fp32, H = 8,
// N in {1024, 4096}, D in {64, 128}, non-causal), the naive reference as baseline, and a
// calibration of this core's FP32 FMA peak so that the fraction of peak can be read off.
// Flop model: forward 4 N M D per head, backward 10 N M D (five products of that size).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "common/test_support.h"
#include "cpu/simd.h"
#include "exact/exact_ref.h"
#include "subquad/cost.h"
#include "subquad/exact.h"

namespace subquad {
namespace {

constexpr int64_t kHeads = 8;
const Context kOneThread{Device::cpu, 1};

// Independent FMA chains, enough to cover the FMA latency on every FMA port.
void BM_FmaPeak(benchmark::State& state) {
  using S = cpu::Simd<float>;
  constexpr int kChains = 16;
  constexpr int64_t kSteps = 1 << 20;
  S::Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = S::splat(1.0f + c * 1e-3f);
  const S::Vec x = S::splat(0.999999f), y = S::splat(1e-7f);
  for (auto _ : state) {
    for (int64_t i = 0; i < kSteps; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * x + y;
    for (int c = 0; c < kChains; ++c) benchmark::DoNotOptimize(acc[c]);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * kChains * S::kLanes * kSteps * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->ComputeStatistics("max", [](const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
});

struct Problem {
  int64_t B, N, D;
  ExactOptions options;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  explicit Problem(int64_t n, int64_t d, int64_t b = 1, bool causal = false)
      : B(b),
        N(n),
        D(d),
        q(testing::random_vector<float>(b * n * kHeads * d, 1)),
        k(testing::random_vector<float>(b * n * kHeads * d, 2)),
        v(testing::random_vector<float>(b * n * kHeads * d, 3)),
        out(b * n * kHeads * d),
        lse(b * kHeads * n),
        dout(testing::random_vector<float>(b * n * kHeads * d, 4)),
        dq(b * n * kHeads * d),
        dk(b * n * kHeads * d),
        dv(b * n * kHeads * d) {
    options.causal = causal;
  }
  View4<float> view(std::vector<float>& x) { return View4<float>(x.data(), {B, N, kHeads, D}); }
  View3<float> lse_view() { return View3<float>(lse.data(), {B, kHeads, N}); }
  double forward_flops() const {
    return exact_attention_forward_cost(B, N, N, kHeads, kHeads, D, D, options.causal, 0,
                                        sizeof(float))
        .flops;
  }
  double backward_flops() const {
    return exact_attention_backward_cost(B, N, N, kHeads, kHeads, D, D, options.causal, 0,
                                         sizeof(float))
        .flops;
  }
  void forward() {
    exact_attention_forward<float>(kOneThread, view(q), view(k), view(v), options, view(out),
                                   lse_view());
  }
  void backward() {
    exact_attention_backward<float>(kOneThread, view(q), view(k), view(v), view(out),
                                    lse_view(), view(dout), View3<const float>(), options,
                                    view(dq), view(dk), view(dv));
  }
};

void BM_ExactForward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1));
  for (auto _ : state) p.forward();
  state.counters["GFLOP/s"] =
      benchmark::Counter(p.forward_flops() * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_ExactBackward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1));
  p.forward();
  for (auto _ : state) p.backward();
  state.counters["GFLOP/s"] = benchmark::Counter(p.backward_flops() * state.iterations(),
                                                 benchmark::Counter::kIsRate);
}

// The peer benchmark's backward points (B x H = 1 x 8 and 32 x 8, causal or not), without a
// workspace: every call takes its scratch from the allocator, as a Python caller does.
void BM_ExactBackwardBatch(benchmark::State& state) {
  Problem p(state.range(1), state.range(2), state.range(0), state.range(3) != 0);
  p.forward();
  for (auto _ : state) p.backward();
  state.counters["GFLOP/s"] = benchmark::Counter(p.backward_flops() * state.iterations(),
                                                 benchmark::Counter::kIsRate);
}

void BM_ReferenceForward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1));
  for (auto _ : state)
    exact_attention_reference_forward<float>(p.view(p.q), p.view(p.k), p.view(p.v), {},
                                             p.view(p.out), p.lse_view());
  state.counters["GFLOP/s"] =
      benchmark::Counter(p.forward_flops() * state.iterations(), benchmark::Counter::kIsRate);
}

// The machine is shared: with --benchmark_repetitions, the best repetition (min time,
// max GFLOP/s) is the least disturbed one.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {256, 1024, 4096})
    for (int64_t d : {64, 128}) b->Args({n, d});
  b->ArgNames({"N", "D"})->Unit(benchmark::kMillisecond);
  b->ComputeStatistics("min", [](const std::vector<double>& v) {
    return *std::min_element(v.begin(), v.end());
  });
  b->ComputeStatistics("max", [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end());
  });
}
BENCHMARK(BM_ExactForward)->Apply(Shapes);
BENCHMARK(BM_ExactBackward)->Apply(Shapes);
BENCHMARK(BM_ExactBackwardBatch)
    ->ArgsProduct({{1, 32}, {64, 256, 1024}, {64, 128}, {0, 1}})
    ->ArgNames({"B", "N", "D", "causal"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReferenceForward)->Args({1024, 64})->ArgNames({"N", "D"})->Unit(
    benchmark::kMillisecond);

}  // namespace
}  // namespace subquad
