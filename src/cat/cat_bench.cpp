// Kernel benchmarks of CAT (one head, Dv = 64, one thread): forward / backward of the FFT
// path, the direct path (for the crossover constants), causal, averaged-key and the FFT lower
// bound (transforms of v alone), side by side. Exact attention is compared in `subquad
// bench`. Flop models: the library's (subquad/cost.h: a real transform of n points counts
// 2.5 n log2 n flops, a complex product 6).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <vector>

#include "cat/cat_fft_lower_bound.h"
#include "common/buffer.h"
#include "common/fft.h"
#include "common/test_support.h"
#include "subquad/cat.h"
#include "subquad/cost.h"

namespace subquad {
namespace {

constexpr int64_t kValueDim = 64;
const Context kOneThread{Device::cpu, 1};

// The library's flop models (subquad/cost.h), one head.
double cat_flops(int64_t n) { return cat_forward_cost(1, n, 1, kValueDim, sizeof(float)).flops; }
double cat_backward_flops(int64_t n) {
  return cat_backward_cost(1, n, 1, kValueDim, sizeof(float)).flops;
}
// Forward + inverse transforms of v's columns of length n.
double transform_flops(int64_t n) {
  return cat_fft_lower_bound_cost(1, n, 1, kValueDim, sizeof(float)).flops;
}

struct Inputs {
  int64_t N;
  std::vector<float> z, v, g, out, dz, dv;
  explicit Inputs(int64_t n)
      : N(n),
        z(testing::random_vector<float>(n, 1, -3, 3)),
        v(testing::random_vector<float>(n * kValueDim, 2)),
        g(testing::random_vector<float>(n * kValueDim, 3)),
        out(n * kValueDim),
        dz(n),
        dv(n * kValueDim) {
    set_fft_effort(FftEffort::measure);
  }
  View3<const float> zc() const { return View3<const float>(z.data(), {1, N, 1}); }
  View4<const float> vc() const { return View4<const float>(v.data(), {1, N, 1, kValueDim}); }
  View4<const float> gc() const { return View4<const float>(g.data(), {1, N, 1, kValueDim}); }
  View4<const float> outc() const {
    return View4<const float>(out.data(), {1, N, 1, kValueDim});
  }
  View4<float> outv() { return View4<float>(out.data(), {1, N, 1, kValueDim}); }
  View3<float> dzv() { return View3<float>(dz.data(), {1, N, 1}); }
  View4<float> dvv() { return View4<float>(dv.data(), {1, N, 1, kValueDim}); }
};

void report(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::OneK::kIs1000);
  state.counters["GFLOP/s"].value /= 1e9;
}

void BM_FftLowerBound(benchmark::State& state, CatFftPacking packing) {
  Inputs in(state.range(0));
  CatFftLowerBound<float> baseline(in.vc(), packing);
  baseline.run(kOneThread);  // plans FFTW_MEASURE outside the timing
  for (auto _ : state) baseline.run(kOneThread);
  report(state, transform_flops(in.N));
}

// Layouts for the transforms of v's columns alone (forward + inverse of all Dv columns of one
// head), to pick the fastest for CatFftLowerBound and cat_forward: contiguous rows, one plan
// per row (`batch` 1) or `batch` rows per plan; or `batch` columns interleaved as v stores them
// ([N, batch] chunks, stride batch, FFTW's advanced interface vectorising across them).
void BM_FftLayout(benchmark::State& state, bool interleaved) {
  const int64_t N = state.range(0), batch = state.range(1);
  const int64_t F = N / 2 + 1;
  RealFftLayout layout;
  layout.n0 = N;
  layout.batch = batch;
  if (interleaved) {
    layout.real_stride = layout.complex_stride = batch;
    layout.real_distance = layout.complex_distance = 1;
  } else {
    layout.real_distance = N;
    layout.complex_distance = F;
  }
  set_fft_effort(FftEffort::measure);
  const RealFftPlan<float> plan = RealFftPlan<float>::get(layout);
  Buffer<float> in = Buffer<float>(N * kValueDim), out = Buffer<float>(N * kValueDim);
  Buffer<std::complex<float>> spectrum(F * batch);
  const auto values = testing::random_vector<float>(N * kValueDim, 2);
  std::copy(values.begin(), values.end(), in.data());
  for (auto _ : state)
    for (int64_t c0 = 0; c0 < kValueDim; c0 += batch) {
      plan.forward(in.data() + c0 * N, spectrum.data());
      plan.inverse(spectrum.data(), out.data() + c0 * N);
    }
  report(state, transform_flops(N));
}

// The causal variant's float64 transforms of length 2N for all Dv columns of one head: real
// rows `batch` per plan (kind 0), or two columns packed in one complex signal, `batch` per
// plan, out of place (kind 1) or in place (kind 2).
void BM_CausalFftLayout(benchmark::State& state) {
  const int64_t L = 2 * state.range(0), batch = state.range(1), kind = state.range(2);
  set_fft_effort(FftEffort::measure);
  using C = std::complex<double>;
  if (kind == 0) {
    const RealFftPlan<double> plan =
        RealFftPlan<double>::get(RealFftLayout{.n0 = L, .batch = batch});
    Buffer<double> x(L * batch);
    Buffer<C> X((L / 2 + 1) * batch);
    for (auto _ : state)
      for (int64_t c0 = 0; c0 < kValueDim; c0 += batch) {
        plan.forward(x.data(), X.data());
        plan.inverse(X.data(), x.data());
      }
  } else {
    const ComplexFftPlan<double> plan = ComplexFftPlan<double>::get(
        ComplexFftLayout{.n0 = L, .batch = batch, .in_place = kind == 2});
    Buffer<C> x(L * batch), y(L * batch);
    C* out = kind == 2 ? x.data() : y.data();
    for (auto _ : state)
      for (int64_t c0 = 0; c0 < kValueDim; c0 += 2 * batch) {
        plan.forward(x.data(), out);
        plan.inverse(out, x.data());
      }
  }
  report(state, transform_flops(L));
}

void BM_CatForward(benchmark::State& state, CatPath path) {
  Inputs in(state.range(0));
  cat_forward<float>(kOneThread, in.zc(), in.vc(), {CatConvention::roll, path}, in.outv());
  for (auto _ : state) cat_forward<float>(kOneThread, in.zc(), in.vc(), {CatConvention::roll, path}, in.outv());
  report(state, cat_flops(in.N));
}

void BM_CatBackward(benchmark::State& state) {
  Inputs in(state.range(0));
  cat_backward<float>(kOneThread, in.zc(), in.vc(), in.gc(), {}, in.dzv(), in.dvv());
  for (auto _ : state)
    cat_backward<float>(kOneThread, in.zc(), in.vc(), in.gc(), {}, in.dzv(), in.dvv());
  report(state, cat_backward_flops(in.N));
}

void BM_CatCausalForward(benchmark::State& state, CatPath path) {
  Inputs in(state.range(0));
  cat_causal_forward<float>(kOneThread, in.zc(), in.vc(), {path}, in.outv());
  for (auto _ : state) cat_causal_forward<float>(kOneThread, in.zc(), in.vc(), {path}, in.outv());
  report(state, cat_causal_forward_cost(1, in.N, 1, kValueDim, sizeof(float)).flops);
}

void BM_CatCausalBackward(benchmark::State& state) {
  Inputs in(state.range(0));
  cat_causal_forward<float>(kOneThread, in.zc(), in.vc(), {}, in.outv());
  cat_causal_backward<float>(kOneThread, in.zc(), in.vc(), in.outc(), in.gc(), {}, in.dzv(),
                             in.dvv());
  for (auto _ : state)
    cat_causal_backward<float>(kOneThread, in.zc(), in.vc(), in.outc(), in.gc(), {}, in.dzv(),
                               in.dvv());
  report(state, cat_causal_backward_cost(1, in.N, 1, kValueDim, sizeof(float)).flops);
}

void BM_CatAvgKey(benchmark::State& state, bool backward) {
  Inputs in(state.range(0));
  const int64_t N = in.N, D = kValueDim;
  const auto q = testing::random_vector<float>(N * D, 4), k = testing::random_vector<float>(N * D, 5);
  std::vector<float> dq(N * D), dk(N * D);
  const View4<const float> qv(q.data(), {1, N, 1, D}), kv(k.data(), {1, N, 1, D});
  cat_avgkey_backward<float>(kOneThread, qv, kv, in.vc(), in.gc(), {},
                             View4<float>(dq.data(), {1, N, 1, D}),
                             View4<float>(dk.data(), {1, N, 1, D}), in.dvv());
  for (auto _ : state) {
    if (backward)
      cat_avgkey_backward<float>(kOneThread, qv, kv, in.vc(), in.gc(), {}, View4<float>(dq.data(), {1, N, 1, D}),
                                 View4<float>(dk.data(), {1, N, 1, D}), in.dvv());
    else
      cat_avgkey_forward<float>(kOneThread, qv, kv, in.vc(), {}, in.outv());
  }
  report(state, backward ? cat_backward_flops(N) : cat_flops(N));
}

BENCHMARK_CAPTURE(BM_FftLayout, rows, false)->ArgsProduct({{1024, 4096, 16384, 65536}, {1, 4, 16}})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_FftLayout, interleaved, true)->ArgsProduct({{1024, 4096, 16384, 65536}, {8, 16}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CausalFftLayout)->ArgsProduct({{1024, 4096, 16384, 65536}, {1, 8}, {0, 1, 2}})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_FftLowerBound, real_columns, CatFftPacking::real_columns)->RangeMultiplier(4)->Range(64, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_FftLowerBound, packed_pairs, CatFftPacking::packed_pairs)->RangeMultiplier(4)->Range(64, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatForward, fft, CatPath::fft)->RangeMultiplier(2)->Range(16, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatForward, direct, CatPath::direct)->RangeMultiplier(2)->Range(16, 512)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CatBackward)->RangeMultiplier(4)->Range(64, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatCausalForward, automatic, CatPath::automatic)->RangeMultiplier(2)->Range(16, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatCausalForward, direct, CatPath::direct)->RangeMultiplier(2)->Range(16, 1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatCausalForward, fft, CatPath::fft)->RangeMultiplier(2)->Range(16, 1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CatCausalBackward)->RangeMultiplier(4)->Range(64, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatAvgKey, forward, false)->RangeMultiplier(16)->Range(256, 65536)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CatAvgKey, backward, true)->RangeMultiplier(16)->Range(256, 65536)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace subquad
