// CLI methods of WildCat: `subquad attend --method wildcat | uniform-nystrom |
// uniform-subsample` (float32: the coreset pipeline runs on sgemm), and the bench rows
// wildcat (r = 256, 16 bins), wildcat-1bin (r = 256, one bin) and uniform-nystrom (r = 256,
// 16 bins), all reporting their error against exact attention.
#include <cmath>
#include <memory>

#include "arrays.h"
#include "registry.h"
#include "subquad/cost.h"
#include "subquad/wildcat.h"

namespace subquad::cli {
namespace {

WildcatOptions parse_options(const ParsedOptions& options, CoresetMethod method) {
  WildcatOptions parsed;
  parsed.method = method;
  parsed.rank = options.integer("rank");
  parsed.bins = options.integer_or("bins", 1);
  const int64_t seed = options.integer_or("seed", 0);
  check(seed >= 0, "option --seed: expected a non-negative integer, got ", seed);
  parsed.seed = static_cast<uint64_t>(seed);
  if (options.has("scale")) {
    parsed.scale = options.number("scale");
    check(std::isfinite(*parsed.scale) && *parsed.scale > 0.0,
          "option --scale: expected a finite number > 0, got ", options.string("scale"));
  }
  const std::string radius = options.string_or("query-radius", "keys");
  check(radius == "keys" || radius == "queries",
        "option --query-radius: expected keys or queries, got ", radius);
  parsed.query_radius = radius == "keys" ? QueryRadius::keys : QueryRadius::queries;
  return parsed;
}

std::map<std::string, NpyArray> run_method(const ParsedOptions& options, const Context& context,
                                           CoresetMethod method) {
  const WildcatOptions parsed = parse_options(options, method);
  const NpyArray q_array = options.array("q").converted(DType::float32);
  const NpyArray k_array = options.array("k").converted(DType::float32);
  const NpyArray v_array = options.array("v").converted(DType::float32);
  const View4<const float> q = input_view<float, 4>(q_array, "q");
  const View4<const float> k = input_view<float, 4>(k_array, "k");
  const View4<const float> v = input_view<float, 4>(v_array, "v");
  std::map<std::string, NpyArray> outputs;
  wildcat_attention(
      context, q, k, v, parsed,
      output_view<float, 4>(outputs, "out", {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}));
  return outputs;
}

const std::vector<OptionSpec> kOptions = {
    {"q", "PATH", "queries [B, N, H, D] (.npy)", true},
    {"k", "PATH", "keys [B, M, Hkv, D] (.npy)", true},
    {"v", "PATH", "values [B, M, Hkv, Dv] (.npy)", true},
    {"rank", "R", "coreset points per (batch, kv head), over all bins", true},
    {"bins", "C", "contiguous key bins compressed independently, 1 <= C <= R (default 1)"},
    {"seed", "S", "random seed (default 0)"},
    {"scale", "S", "softmax scale (default 1/sqrt(D))"},
    {"query-radius", "keys|queries",
     "R_Q of the kernel temperature: the bin's key radius (default) or max ||q||"},
};

const Registrar wildcat_registrar(AttendMethod{
    "wildcat",
    "WildCat (Schröder & Mackey 2026): attention over R keys picked by randomly pivoted "
    "Cholesky, with Nyström weights; float32",
    kOptions, [](const ParsedOptions& o, const Context& c) {
      return run_method(o, c, CoresetMethod::wildcat);
    }});

const Registrar uniform_nystrom_registrar(AttendMethod{
    "uniform-nystrom",
    "baseline: R uniformly random keys with Nyström weights (WildCat's weights, no pivoting)",
    kOptions, [](const ParsedOptions& o, const Context& c) {
      return run_method(o, c, CoresetMethod::uniform_nystrom);
    }});

const Registrar uniform_subsample_registrar(AttendMethod{
    "uniform-subsample", "baseline: plain attention over R uniformly random keys (weight n/R each)",
    kOptions, [](const ParsedOptions& o, const Context& c) {
      return run_method(o, c, CoresetMethod::uniform_subsample);
    }});

constexpr int64_t kBenchRank = 256;
constexpr int64_t kBenchBins = 16;

// The library's flop model (subquad/cost.h).
double wildcat_flops(const Workload& w, int64_t rank, int64_t bins, CoresetMethod method) {
  return wildcat_attention_cost(w.batch, w.tokens, w.tokens, w.heads, w.heads, w.head_dim,
                                w.value_dim, rank, bins, method)
      .flops;
}

class WildcatCase : public BenchCase {
 public:
  WildcatCase(const Workload& w, const BenchInputs& inputs, const Context& context,
              const WildcatOptions& options)
      : data_(w, inputs), context_(context), options_(options) {}
  void run() override {
    wildcat_attention(context_, data_.q, data_.k, data_.v, options_, data_.out_view());
  }
  const std::vector<float>* output() const override { return &data_.out; }

 private:
  CaseData data_;
  Context context_;
  WildcatOptions options_;
};

BenchMethod bench_method(std::string name, std::string summary, CoresetMethod method, int64_t bins,
                         bool default_on) {
  BenchMethod bench;
  bench.name = std::move(name);
  bench.summary = std::move(summary);
  bench.flops = [bins, method](const Workload& w) {
    return wildcat_flops(w, kBenchRank, bins, method);
  };
  bench.prepare = [method, bins](const Workload& w, const BenchInputs& inputs,
                                 const Context& context) -> std::unique_ptr<BenchCase> {
    WildcatOptions options;
    options.rank = kBenchRank;
    options.bins = bins;
    options.method = method;
    options.seed = w.seed;
    return std::make_unique<WildcatCase>(w, inputs, context, options);
  };
  bench.approximates_exact = true;
  bench.default_on = default_on;
  return bench;
}

const Registrar wildcat_bench_registrar(bench_method("wildcat",
                                                     "WildCat, r = 256 coreset points in 16 bins",
                                                     CoresetMethod::wildcat, kBenchBins, true));
const Registrar wildcat_one_bin_bench_registrar(
    bench_method("wildcat-1bin", "WildCat, r = 256 coreset points, one bin (O(N r^2) compression)",
                 CoresetMethod::wildcat, 1, false));
const Registrar uniform_nystrom_bench_registrar(
    bench_method("uniform-nystrom", "uniform keys with Nystrom weights, r = 256 in 16 bins",
                 CoresetMethod::uniform_nystrom, kBenchBins, true));
const Registrar uniform_subsample_bench_registrar(
    bench_method("uniform-subsample", "plain attention over 256 uniform keys (16 bins)",
                 CoresetMethod::uniform_subsample, kBenchBins, false));

}  // namespace
}  // namespace subquad::cli
