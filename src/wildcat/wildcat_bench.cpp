// WildCat benchmarks, one thread: compression time against r (O(M r^2)), the forward at
// N = M = 65536, D = 64, r = 256 next to exact attention (timed on a subset of the queries
// and extrapolated by N, labelled so), and the error against exact attention for r in
// {32, ..., 512} at N = M = 8192 on random and clustered keys, next to the baselines.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "subquad/exact.h"
#include "subquad/cost.h"
#include "subquad/wildcat.h"

namespace subquad {
namespace {

constexpr int64_t kD = 64;
const Context kOneThread{Device::cpu, 1};

std::vector<float> normal_vector(int64_t count, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values) x = normal(generator);
  return values;
}

// Keys around 64 random centres (entries N(0, 1)) with N(0, 0.1^2) noise per feature.
std::vector<float> clustered_keys(int64_t M, uint64_t seed) {
  constexpr int64_t kClusters = 64;
  constexpr float kNoise = 0.1f;
  const auto centres = normal_vector(kClusters * kD, seed);
  const auto noise = normal_vector(M * kD, seed + 1);
  std::mt19937_64 generator(seed + 2);
  std::uniform_int_distribution<int64_t> pick(0, kClusters - 1);
  std::vector<float> keys(static_cast<size_t>(M * kD));
  for (int64_t j = 0; j < M; ++j) {
    const int64_t c = pick(generator);
    for (int64_t e = 0; e < kD; ++e)
      keys[j * kD + e] = centres[c * kD + e] + kNoise * noise[j * kD + e];
  }
  return keys;
}

struct Problem {
  int64_t N, M;
  std::vector<float> q, k, v;
};

Problem make_problem(int64_t N, int64_t M, bool clustered, uint64_t seed) {
  return {N, M, normal_vector(N * kD, seed),
          clustered ? clustered_keys(M, seed + 10) : normal_vector(M * kD, seed + 10),
          normal_vector(M * kD, seed + 20)};
}

void run_wildcat(const Problem& p, const WildcatOptions& options, std::vector<float>& out) {
  out.resize(static_cast<size_t>(p.N * kD));
  wildcat_attention(kOneThread, View4<const float>(p.q.data(), {1, p.N, 1, kD}),
                    View4<const float>(p.k.data(), {1, p.M, 1, kD}),
                    View4<const float>(p.v.data(), {1, p.M, 1, kD}), options,
                    View4<float>(out.data(), {1, p.N, 1, kD}));
}

void run_exact(const Problem& p, int64_t queries, std::vector<float>& out) {
  out.resize(static_cast<size_t>(queries * kD));
  exact_attention_forward<float>(kOneThread, View4<const float>(p.q.data(), {1, queries, 1, kD}),
                                 View4<const float>(p.k.data(), {1, p.M, 1, kD}),
                                 View4<const float>(p.v.data(), {1, p.M, 1, kD}), ExactOptions{},
                                 View4<float>(out.data(), {1, queries, 1, kD}), View3<float>());
}

// Flops of the forward by the library's model (subquad/cost.h), one head.
double wildcat_flops(int64_t N, int64_t M, int64_t r, int64_t bins) {
  return wildcat_attention_cost(1, N, M, 1, 1, kD, kD, r, bins).flops;
}

// Compression cost against r: M = 16384 keys, one bin, 16 queries (attention negligible).
// s_per_Mr2 should stay roughly flat as r grows (the O(M r^2) term dominates at large r).
void BM_WildcatCompression(benchmark::State& state) {
  const int64_t M = 16384, r = state.range(0);
  static const Problem p = make_problem(16, M, false, 1);
  WildcatOptions options;
  options.rank = r;
  std::vector<float> out;
  for (auto _ : state) {
    run_wildcat(p, options, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["s_per_Mr2"] =
      benchmark::Counter(double(M) * r * r, benchmark::Counter::kIsIterationInvariantRate |
                                                benchmark::Counter::kInvert);
  state.counters["GFLOP/s"] = benchmark::Counter(wildcat_flops(16, M, r, 1) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_WildcatCompression)
    ->Arg(32)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond);

// The forward at N = M = 65536, D = 64, r = 256; args: bins, method (0 wildcat,
// 1 uniform Nyström, 2 uniform subsample).
void BM_WildcatForward65536(benchmark::State& state) {
  const int64_t N = 65536, bins = state.range(0);
  static const Problem p = make_problem(N, N, false, 2);
  WildcatOptions options;
  options.rank = 256;
  options.bins = bins;
  options.method = static_cast<CoresetMethod>(state.range(1));
  std::vector<float> out;
  for (auto _ : state) {
    run_wildcat(p, options, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(wildcat_flops(N, N, 256, bins) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_WildcatForward65536)
    ->ArgNames({"bins", "method"})
    ->Args({16, 0})
    ->Args({1, 0})
    ->Args({16, 1})
    ->Args({16, 2})
    ->Unit(benchmark::kMillisecond);

// Exact attention at M = 65536 keys for the first 1024 of the N = 65536 queries; its cost
// is linear in N, so the counter full_N_seconds = time * 65536 / 1024 is the extrapolated
// time of the full N = M = 65536 exact forward (EXTRAPOLATED, not measured).
void BM_ExactSubsetOf65536(benchmark::State& state) {
  const int64_t N = 65536, queries = 1024;
  static const Problem p = make_problem(N, N, false, 2);
  std::vector<float> out;
  for (auto _ : state) {
    run_exact(p, queries, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["full_N_seconds"] = benchmark::Counter(
      double(queries) / double(N),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * queries * N * kD * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ExactSubsetOf65536)->Unit(benchmark::kMillisecond);

// Error against exact attention at N = M = 8192, one head, one bin, averaged over 3 seeds:
// rel_frob = ||out - exact||_F / ||exact||_F, max_abs = max |out - exact|.
// Args: keys (0 random N(0, 1), 1 clustered), method (as above), r.
void BM_ErrorVsRank8192(benchmark::State& state) {
  const int64_t N = 8192;
  constexpr int kSeeds = 3;
  const bool clustered = state.range(0) == 1;
  static std::map<bool, std::vector<std::pair<Problem, std::vector<float>>>> cache;
  auto& problems = cache[clustered];
  if (problems.empty())
    for (int seed = 0; seed < kSeeds; ++seed) {
      Problem p = make_problem(N, N, clustered, 100 + 31 * seed);
      std::vector<float> truth;
      run_exact(p, N, truth);
      problems.emplace_back(std::move(p), std::move(truth));
    }
  WildcatOptions options;
  options.method = static_cast<CoresetMethod>(state.range(1));
  options.rank = state.range(2);
  double rel = 0.0, max_abs = 0.0;
  std::vector<float> out;
  for (auto _ : state) {
    rel = max_abs = 0.0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      const auto& [p, truth] = problems[seed];
      options.seed = static_cast<uint64_t>(seed);
      run_wildcat(p, options, out);
      double num = 0.0, den = 0.0, worst = 0.0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double diff = double(out[i]) - truth[i];
        num += diff * diff;
        den += double(truth[i]) * truth[i];
        worst = std::max(worst, std::abs(diff));
      }
      rel += std::sqrt(num / den) / kSeeds;
      max_abs += worst / kSeeds;
    }
  }
  state.counters["rel_frob"] = rel;
  state.counters["max_abs"] = max_abs;
}
BENCHMARK(BM_ErrorVsRank8192)
    ->ArgNames({"clustered", "method", "r"})
    ->ArgsProduct({{0, 1}, {0, 1, 2}, {32, 64, 128, 256, 512}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace subquad
