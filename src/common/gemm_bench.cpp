// sgemm throughput at the shapes the families use (square, and tall-skinny products with
// k = head dim), next to the measured one-thread FMA peak. Run with OMP_NUM_THREADS=1.
#include <benchmark/benchmark.h>

#include <vector>

#include "common/calibration.h"
#include "common/gemm.h"

namespace subquad {
namespace {

// The one-thread FP32 FMA peak, for scale.
void BM_FmaPeak(benchmark::State& state) {
  double gflops = 0;
  for (auto _ : state) gflops = measure_fma_peak_gflops(1);
  state.counters["GFLOP/s"] = gflops * 1e9;
}
BENCHMARK(BM_FmaPeak);

void BM_Sgemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  for (auto _ : state) {
    gemm(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Sgemm)
    ->Args({256, 256, 256})
    ->Args({1024, 1024, 1024})
    ->Args({4096, 256, 64})
    ->Args({256, 4096, 64})
    ->Args({128, 128, 64});

}  // namespace
}  // namespace subquad
