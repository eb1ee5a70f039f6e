// The transform CAT runs, 64 real columns of length n, forward then inverse, float32: ColumnFft
// on [n, 64] memory against FFTW (Debian's, FFTW_MEASURE, plan_many) on the same columns
// (stride 64), on 64 contiguous rows r2c + c2r, and on 32 contiguous complex rows of column
// pairs (the packed rows CAT's FFTW path runs, moves not included). MKL's figures come from
// benchmarks/peers/fft_mkl_shapes.py. Flop model: 2.5 n log2 n per real transform, two per
// column. Run pinned, one thread, interleaved, with min and median:
//   taskset -c 1 subquad_common_bench --benchmark_filter=Columns
//     --benchmark_repetitions=15 --benchmark_enable_random_interleaving=true
// (one command line).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <vector>

#include "common/fft.h"
#include "common/fft_columns.h"
#include "common/test_support.h"

namespace subquad {
namespace {

constexpr int64_t kColumns = 64;

void set_counters(benchmark::State& state, int64_t n) {
  const double flops = 2 * kColumns * 2.5 * n * std::log2(double(n));
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations(),
                                                 benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}

double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void BM_ColumnsOurs(benchmark::State& state) {
  const int64_t n = state.range(0);
  const ColumnFft& plan = ColumnFft::get(n);
  std::vector<float> x = testing::random_vector<float>(n * kColumns, 1);  // [n, 64]
  std::vector<float> spectrum(n * kColumns), y(x.size()), scratch(plan.scratch_floats());
  for (auto _ : state) {
    plan.forward(x.data(), kColumns, kColumns, spectrum.data(), kColumns, scratch.data());
    plan.inverse(spectrum.data(), kColumns, kColumns, y.data(), kColumns, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, n);
}

// What CAT needs from the pair: the filtered convolution in one call (the forward's second
// step, the product and the inverse's first step fused in cache).
void BM_ColumnsOursFiltered(benchmark::State& state) {
  const int64_t n = state.range(0);
  const ColumnFft& plan = ColumnFft::get(n);
  std::vector<float> x = testing::random_vector<float>(n * kColumns, 1);  // [n, 64]
  std::vector<std::complex<float>> filter(n, std::complex<float>(1.0f / n, 0.0f));
  std::vector<float> scratch(plan.scratch_floats());
  for (auto _ : state) {
    plan.filter(x.data(), kColumns, kColumns, filter.data(), x.data(), kColumns, scratch.data());
    benchmark::DoNotOptimize(x.data());
  }
  set_counters(state, n);
}

// FFTW r2c + c2r of 64 real signals; `columns`: [n, 64] (stride 64, distance 1), else [64, n].
void fftw_real(benchmark::State& state, bool columns) {
  const int64_t n = state.range(0);
  set_fft_effort(FftEffort::measure);
  RealFftLayout layout;
  layout.n0 = n;
  layout.batch = kColumns;
  if (columns) {
    layout.real_stride = layout.complex_stride = kColumns;
    layout.real_distance = layout.complex_distance = 1;
  }
  const RealFftPlan<float> plan = RealFftPlan<float>::get(layout);
  std::vector<float> x = testing::random_vector<float>(n * kColumns, 1), y(x.size());
  std::vector<std::complex<float>> spectrum((n / 2 + 1) * kColumns);
  for (auto _ : state) {
    plan.forward(x.data(), spectrum.data());
    plan.inverse(spectrum.data(), y.data());  // c2r clobbers the spectrum: recomputed each time
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, n);
}
void BM_ColumnsFftwRealRows(benchmark::State& state) { fftw_real(state, false); }
void BM_ColumnsFftwRealColumns(benchmark::State& state) { fftw_real(state, true); }

// FFTW c2c of 32 contiguous complex rows (pairs of real columns), forward then inverse.
void BM_ColumnsFftwPackedRows(benchmark::State& state) {
  const int64_t n = state.range(0);
  set_fft_effort(FftEffort::measure);
  ComplexFftLayout layout;
  layout.n0 = n;
  layout.batch = kColumns / 2;
  const ComplexFftPlan<float> plan = ComplexFftPlan<float>::get(layout);
  std::vector<float> values = testing::random_vector<float>(n * kColumns, 1);
  std::vector<std::complex<float>> x(n * kColumns / 2), spectrum(x.size()), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = {values[2 * i], values[2 * i + 1]};
  for (auto _ : state) {
    plan.forward(x.data(), spectrum.data());
    plan.inverse(spectrum.data(), y.data());
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, n);
}

#define SUBQUAD_COLUMNS_BENCHMARK(name)                                                    \
  BENCHMARK(name)->RangeMultiplier(4)->Range(256, 65536)->Unit(benchmark::kMillisecond)   \
      ->ComputeStatistics("min", minimum)
SUBQUAD_COLUMNS_BENCHMARK(BM_ColumnsOurs);
SUBQUAD_COLUMNS_BENCHMARK(BM_ColumnsOursFiltered);
SUBQUAD_COLUMNS_BENCHMARK(BM_ColumnsFftwRealRows);
SUBQUAD_COLUMNS_BENCHMARK(BM_ColumnsFftwRealColumns);
SUBQUAD_COLUMNS_BENCHMARK(BM_ColumnsFftwPackedRows);

}  // namespace
}  // namespace subquad
