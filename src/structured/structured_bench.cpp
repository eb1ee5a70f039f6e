// MLR attention against exact attention in one executable, single-threaded: causal
// forward and backward at d = 64, ranks 32|8|6|4|4|4|4|2, with GFLOP/s by each op's flop
// model (scores 2 T^2 sum_l r_l / 2^(l-1), P V 2 T^2 Dv, both halved when causal; exact
// attention 2 T^2 (D + Dv) / 2). Also prints the decoding key cache against the model.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "common/test_support.h"
#include "subquad/exact.h"
#include "subquad/cost.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

constexpr int64_t kHeadDim = 64;
// The paper's ranks 32|8|6|4|4|4|4|2 (library policy; every benchmarked T splits into them).
const std::vector<int64_t> kRanks = mlr_language_model_ranks(kHeadDim, int64_t{1} << 20);
const Context kOneThread{Device::cpu, 1};

struct Inputs {
  int64_t T;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
  explicit Inputs(int64_t tokens)
      : T(tokens),
        q(testing::random_vector<float>(T * kHeadDim, 1, -2, 2)),
        k(testing::random_vector<float>(T * kHeadDim, 2, -2, 2)),
        v(testing::random_vector<float>(T * kHeadDim, 3)),
        dout(testing::random_vector<float>(T * kHeadDim, 4)),
        out(T * kHeadDim), lse(T), dq(T * kHeadDim), dk(T * kHeadDim), dv(T * kHeadDim) {}
  View4<const float> in(const std::vector<float>& x) const {
    return View4<const float>(x.data(), {1, T, 1, kHeadDim});
  }
  View4<float> mut(std::vector<float>& x) { return View4<float>(x.data(), {1, T, 1, kHeadDim}); }
  View3<float> lse_view() { return View3<float>(lse.data(), {1, 1, T}); }
};

// The library's flop models (subquad/cost.h), causal, one head.
double exact_flops(int64_t T) {
  return exact_attention_forward_cost(1, T, T, 1, 1, kHeadDim, kHeadDim, true, 0, sizeof(float))
      .flops;
}
double mlr_flops(int64_t T) {
  return mlr_attention_forward_cost(1, T, 1, 1, kHeadDim, kHeadDim, kRanks, true, sizeof(float))
      .flops;
}

void report(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
  state.counters["model_speedup"] = exact_flops(state.range(0)) / mlr_flops(state.range(0));
}

void BM_ExactCausalForward(benchmark::State& state) {
  Inputs x(state.range(0));
  ExactOptions options;
  options.causal = true;
  for (auto _ : state)
    exact_attention_forward<float>(kOneThread, x.in(x.q), x.in(x.k), x.in(x.v), options,
                                   x.mut(x.out), x.lse_view());
  report(state, exact_flops(x.T));
}

void BM_MlrCausalForward(benchmark::State& state) {
  Inputs x(state.range(0));
  const MlrOptions options{kRanks, true, true};
  for (auto _ : state)
    mlr_attention_forward<float>(kOneThread, x.in(x.q), x.in(x.k), x.in(x.v), options,
                                 x.mut(x.out), x.lse_view());
  report(state, mlr_flops(x.T));
}

void BM_MlrCausalBackward(benchmark::State& state) {
  Inputs x(state.range(0));
  const MlrOptions options{kRanks, true, true};
  mlr_attention_forward<float>(kOneThread, x.in(x.q), x.in(x.k), x.in(x.v), options,
                               x.mut(x.out), x.lse_view());
  for (auto _ : state)
    mlr_attention_backward<float>(kOneThread, x.in(x.q), x.in(x.k), x.in(x.v), x.in(x.out),
                                  View3<const float>(x.lse.data(), {1, 1, x.T}), x.in(x.dout),
                                  options, x.mut(x.dq), x.mut(x.dk), x.mut(x.dv));
  report(state, 2.5 * mlr_flops(x.T));  // S again, dP, dV, dQ, dK: 3 score + 2 value products
}

BENCHMARK(BM_ExactCausalForward)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MlrCausalForward)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MlrCausalBackward)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace subquad
