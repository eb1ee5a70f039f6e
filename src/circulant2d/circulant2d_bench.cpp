// Benchmarks of 2D circulant attention (forward, backward) on square grids next to exact
// softmax attention on the same tokens (sgemm-based), and the transforms alone (their share).
// One thread; GFLOP/s by the library's flop models (subquad/cost.h: a real 2D transform of
// N points counts 2.5 N log2 N flops, as CAT's; exact attention 2 (D + Dv) per pair).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <random>
#include <vector>

#include "common/buffer.h"
#include "common/fft.h"
#include "common/gemm.h"
#include "subquad/circulant2d.h"
#include "subquad/exact.h"

namespace subquad {
namespace {

constexpr int64_t kHeads = 3;
constexpr int64_t kHeadDim = 64;
const Context kOneThread{Device::cpu, 1};

struct Problem {
  explicit Problem(int64_t side)
      : side(side), tokens(side * side), q(random(1)), k(random(2)), v(random(3)),
        dout(random(4)), out(q.size()), dq(q.size()), dk(q.size()), dv(q.size()) {
    set_fft_effort(FftEffort::measure);  // as `subquad bench` does
  }
  std::vector<float> random(uint64_t seed) const {
    std::mt19937_64 generator(seed);
    std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(tokens * kHeads * kHeadDim));
    for (float& value : x) value = distribution(generator);
    return x;
  }
  View5<const float> grid(const std::vector<float>& x) const {
    return View5<const float>(x.data(), {1, side, side, kHeads, kHeadDim});
  }
  View5<float> grid(std::vector<float>& x) const {
    return View5<float>(x.data(), {1, side, side, kHeads, kHeadDim});
  }
  double forward_flops() const {
    return circulant2d_forward_cost(1, tokens, kHeads, kHeadDim, kHeadDim, sizeof(float)).flops;
  }
  double backward_flops() const {
    return circulant2d_backward_cost(1, tokens, kHeads, kHeadDim, kHeadDim, sizeof(float)).flops;
  }
  double exact_flops() const {
    return exact_attention_forward_cost(1, tokens, tokens, kHeads, kHeads, kHeadDim, kHeadDim,
                                        false, 0, sizeof(float))
        .flops;
  }

  int64_t side, tokens;
  std::vector<float> q, k, v, dout, out, dq, dk, dv;
};

void set_gflops(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Circulant2dForward(benchmark::State& state) {
  Problem p(state.range(0));
  const auto run = [&] {
    circulant2d_forward<float>(kOneThread, p.grid(p.q), p.grid(p.k), p.grid(p.v), {},
                               p.grid(p.out), View4<float>());
  };
  run();  // plans the transforms (FFTW_MEASURE) outside the timed loop
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.out.data());
  }
  set_gflops(state, p.forward_flops());
}

void BM_Circulant2dBackward(benchmark::State& state) {
  Problem p(state.range(0));
  const auto run = [&] {
    circulant2d_backward<float>(kOneThread, p.grid(p.q), p.grid(p.k), p.grid(p.v),
                                p.grid(p.dout), {}, p.grid(p.dq), p.grid(p.dk), p.grid(p.dv));
  };
  run();  // plans the transforms (FFTW_MEASURE) outside the timed loop
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.dq.data());
  }
  set_gflops(state, p.backward_flops());
}

// The transforms of one forward alone (per head D / 2 + Dv / 2 packed pairs forward, Dv / 2
// inverse, and 3 single planes, batched over a head's pairs as in the kernel, same buffer
// sizes): the floor FFTW sets for the forward.
void BM_Circulant2dForwardTransformsOnly(benchmark::State& state) {
  Problem p(state.range(0));
  ComplexFftLayout layout;
  layout.rank = 2;
  layout.n0 = layout.n1 = p.side;
  layout.batch = kHeadDim / 2;
  const ComplexFftPlan<float> pairs = ComplexFftPlan<float>::get(layout);
  layout.batch = 1;
  const ComplexFftPlan<float> single = ComplexFftPlan<float>::get(layout);
  Buffer<std::complex<float>> planes(kHeadDim / 2 * p.tokens), spec_a(planes.size()),
      spec_b(planes.size());
  for (auto _ : state) {
    for (int64_t h = 0; h < kHeads; ++h) {
      pairs.forward(planes.data(), spec_a.data());   // q
      pairs.forward(planes.data(), spec_b.data());   // k
      single.inverse(spec_a.data(), planes.data());  // logits
      single.forward(planes.data(), spec_a.data());  // s
      pairs.forward(planes.data(), spec_b.data());   // v
      pairs.inverse(spec_b.data(), planes.data());   // out
    }
    benchmark::DoNotOptimize(planes.data());
  }
  set_gflops(state, p.forward_flops());
}

// Exact softmax attention on the same tokens, [B, N, H, D] = q, k, v read as token rows,
// computed in blocks of query rows with sgemm for the scores and for P v (the exact family's
// kernel is not linked into this executable: families before "exact" in the build's
// alphabetical order do not see its target).
void BM_DenseGemmAttentionForward(benchmark::State& state) {
  Problem p(state.range(0));
  constexpr int64_t kRows = 256;
  const int64_t N = p.tokens, row = kHeads * kHeadDim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  Buffer<float> scores(kRows * N);
  for (auto _ : state) {
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i0 = 0; i0 < N; i0 += kRows) {
        const int64_t rows = std::min(kRows, N - i0);
        gemm(Transpose::no, Transpose::yes, rows, N, kHeadDim, scale, p.q.data() + i0 * row + h * kHeadDim,
             row, p.k.data() + h * kHeadDim, row, 0.0f, scores.data(), N);
        for (int64_t i = 0; i < rows; ++i) {
          float* s = scores.data() + i * N;
          const float max = *std::max_element(s, s + N);
          float sum = 0;
          for (int64_t j = 0; j < N; ++j) sum += (s[j] = std::exp(s[j] - max));
          const float inverse = 1.0f / sum;
          for (int64_t j = 0; j < N; ++j) s[j] *= inverse;
        }
        gemm(Transpose::no, Transpose::no, rows, kHeadDim, N, 1.0f, scores.data(), N,
             p.v.data() + h * kHeadDim, row, 0.0f, p.out.data() + i0 * row + h * kHeadDim, row);
      }
    benchmark::DoNotOptimize(p.out.data());
  }
  set_gflops(state, p.exact_flops());
}

// The released CA-DeiT configuration: 192 one-channel heads (one_channel_heads.cpp), on
// 14 x 14 (DeiT's 224^2 grid), 32 x 32 and 96 x 96; arg 1 picks FFTW's planner effort
// (0: estimate, what the library does by default; 1: measure).
constexpr int64_t kOneChannelHeads = 192;

struct OneChannelProblem {
  OneChannelProblem(int64_t side, bool measure)
      : side(side), q(random(1)), k(random(2)), v(random(3)), dout(random(4)), out(q.size()),
        dq(q.size()), dk(q.size()), dv(q.size()) {
    set_fft_effort(measure ? FftEffort::measure : FftEffort::estimate);
    options.scale_mode = Circulant2dScaleMode::code;
  }
  std::vector<float> random(uint64_t seed) const {
    std::mt19937_64 generator(seed);
    std::normal_distribution<float> distribution;
    std::vector<float> x(static_cast<size_t>(side * side * kOneChannelHeads));
    for (float& value : x) value = distribution(generator);
    return x;
  }
  View5<const float> grid(const std::vector<float>& x) const {
    return View5<const float>(x.data(), {1, side, side, kOneChannelHeads, 1});
  }
  View5<float> grid(std::vector<float>& x) const {
    return View5<float>(x.data(), {1, side, side, kOneChannelHeads, 1});
  }
  int64_t side;
  std::vector<float> q, k, v, dout, out, dq, dk, dv;
  Circulant2dOptions options;
};

void BM_Circulant2dOneChannelForward(benchmark::State& state) {
  OneChannelProblem p(state.range(0), state.range(1) != 0);
  const auto run = [&] {
    circulant2d_forward<float>(kOneThread, p.grid(p.q), p.grid(p.k), p.grid(p.v), p.options,
                               p.grid(p.out), View4<float>());
  };
  run();  // plans the transforms outside the timed loop
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.out.data());
  }
  set_fft_effort(FftEffort::measure);
}

void BM_Circulant2dOneChannelBackward(benchmark::State& state) {
  OneChannelProblem p(state.range(0), state.range(1) != 0);
  const auto run = [&] {
    circulant2d_backward<float>(kOneThread, p.grid(p.q), p.grid(p.k), p.grid(p.v),
                                p.grid(p.dout), p.options, p.grid(p.dq), p.grid(p.dk),
                                p.grid(p.dv));
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.dq.data());
  }
  set_fft_effort(FftEffort::measure);
}

void one_channel_sides(benchmark::internal::Benchmark* b) {
  b->ArgNames({"side", "measure"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const int64_t side : {14, 32, 96})
    for (const int64_t measure : {0, 1}) b->Args({side, measure});
}

BENCHMARK(BM_Circulant2dOneChannelForward)->Apply(one_channel_sides);
BENCHMARK(BM_Circulant2dOneChannelBackward)->Apply(one_channel_sides);

// Grid sides: 32 x 32, 64 x 64 and 96 x 96 (a 1536^2 image in 16 px patches).
void grid_sides(benchmark::internal::Benchmark* b) {
  b->ArgName("side")->Arg(32)->Arg(64)->Arg(96)->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Circulant2dForward)->Apply(grid_sides);
BENCHMARK(BM_Circulant2dBackward)->Apply(grid_sides);
BENCHMARK(BM_Circulant2dForwardTransformsOnly)->Apply(grid_sides);
BENCHMARK(BM_DenseGemmAttentionForward)->Apply(grid_sides);

}  // namespace
}  // namespace subquad
