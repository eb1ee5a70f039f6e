// `subquad bench`: for each head shape and sequence length, prepares every selected method
// on the same inputs and times it (warm-up, repetitions, median and spread), one thread by
// default. Exact attention runs in the same loop, so speed-ups are same-run ratios. Points
// predicted to exceed the time limit are extrapolated from the method's largest measured
// point by its flop model, and marked so.
#include "bench.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>

#include "bench_inputs.h"
#include "bench_report.h"
#include "common/calibration.h"
#include "common/fft.h"
#include "common/gemm.h"
#include "machine.h"
#include "registry.h"
#include "subquad/error.h"
#include "subquad/exact.h"
#include "subquad_commit.h"

namespace subquad::cli {
namespace {

const std::vector<OptionSpec> kBenchOptions = {
    {"methods", "LIST", "comma-separated methods (default: every default method; see below)"},
    {"lengths", "LIST", "sequence lengths N (default 256,1024,4096,16384,65536)"},
    {"shapes", "LIST", "head shapes HxD or HxDxDv (default 8x64,8x128)"},
    {"batch", "B", "batch size (default 1)"},
    {"threads", "T", "threads (default 1: the machine is shared, one-thread figures are stable)"},
    {"reps", "R", "timed repetitions per point (default 5)"},
    {"time-limit", "SECONDS",
     "extrapolate points predicted to take longer than this per run (default 2)"},
    {"error-rows", "R", "query rows sampled for the error against exact attention (default 256)"},
    {"fft-effort", "estimate|measure", "FFTW planner effort (default measure)"},
    {"out-dir", "DIR", "folder for bench.csv and the SVG plots (default bench-out)"},
    {"seed", "S", "seed of the random inputs and of the randomized methods (default 0)"},
    {"inputs", "auto|gaussian|smollm2",
     "gaussian: standard-normal q, k, v for every row; smollm2: every row on the Q/K/V "
     "SmolLM2-135M computes on real text, read from --workload (shape, batch and default "
     "lengths come from it); auto (default): when --workload holds one and neither --shapes "
     "nor --batch is given, the approximation rows (those reporting an error against exact "
     "attention: wildcat, uniform-nystrom, uniform-subsample, ...) and their exact baseline "
     "run on it, every other row on Gaussian inputs; else gaussian"},
    {"workload", "DIR",
     "folder written by `subquad-llm capture` (default $SUBQUAD_WORKLOAD_DIR, else "
     "$XDG_CACHE_HOME/subquad/smollm2, else ~/.cache/subquad/smollm2)"},
};

constexpr int64_t kMaxReps = 1000000;
const std::vector<int64_t> kDefaultLengths = {256, 1024, 4096, 16384, 65536};
const char* const kDefaultShapes = "8x64,8x128";

struct HeadShape {
  int64_t heads, head_dim, value_dim;
};

std::vector<HeadShape> parse_shapes(const std::string& text) {
  std::vector<HeadShape> shapes;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    std::vector<int64_t> parts;
    size_t begin = 0;
    while (begin <= item.size()) {
      const size_t x = std::min(item.find('x', begin), item.size());
      const std::string digits = item.substr(begin, x - begin);
      check(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
            "option --shapes: expected HxD or HxDxDv items, got '", item, "'");
      parts.push_back(std::stoll(digits));
      begin = x + 1;
    }
    check((parts.size() == 2 || parts.size() == 3) && parts[0] > 0 && parts[1] > 0 &&
              parts.back() > 0,
          "option --shapes: expected positive HxD or HxDxDv, got '", item, "'");
    shapes.push_back({parts[0], parts[1], parts.size() == 3 ? parts[2] : parts[1]});
    start = comma + 1;
  }
  return shapes;
}

std::vector<const BenchMethod*> select_methods(const ParsedOptions& options) {
  std::vector<const BenchMethod*> selected;
  if (!options.has("methods")) {
    for (const BenchMethod& method : bench_methods())
      if (method.default_on) selected.push_back(&method);
  } else {
    for (const std::string& name : options.string_list("methods")) {
      const auto found = std::find_if(bench_methods().begin(), bench_methods().end(),
                                      [&](const BenchMethod& m) { return m.name == name; });
      check(found != bench_methods().end(), "option --methods: unknown method '", name,
            "' (see `subquad bench --help`)");
      selected.push_back(&*found);
    }
  }
  // Baselines first: the others' speed-ups are ratios to them.
  std::stable_partition(selected.begin(), selected.end(), [&](const BenchMethod* m) {
    return std::any_of(selected.begin(), selected.end(),
                       [&](const BenchMethod* other) { return other->baseline == m->name; });
  });
  return selected;
}

struct Timing {
  double median = 0, min = 0, spread = 0;
};

Timing time_case(BenchCase& bench_case, int reps) {
  // Two warm-ups: plans, caches and page faults, then the allocator settling (glibc serves the
  // first run's big blocks by mmap and, once they are freed, raises its mmap threshold, so the
  // second run faults in fresh heap pages; one warm-up left that in the first timed rep).
  bench_case.run();
  bench_case.run();
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    bench_case.run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {median, seconds.front(), median > 0 ? (seconds.back() - seconds.front()) / median : 0};
}

// Error of `output` [B, N, H, Dv] against exact attention on evenly spaced query rows.
void measure_error(const Workload& w, const BenchInputs& inputs, const std::vector<float>& output,
                   int64_t sample_rows, const Context& context, BenchRow& row) {
  const int64_t rows = std::min(sample_rows, w.tokens);
  const int64_t qrow = w.heads * w.head_dim, orow = w.heads * w.value_dim;
  std::vector<float> q_sampled(w.batch * rows * qrow), exact(w.batch * rows * orow);
  std::vector<int64_t> picked(rows);
  for (int64_t i = 0; i < rows; ++i) picked[i] = i * w.tokens / rows;
  for (int64_t b = 0; b < w.batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(inputs.q.data() + (b * w.tokens + picked[i]) * qrow, qrow,
                  q_sampled.data() + (b * rows + i) * qrow);
  exact_attention_forward<float>(
      context, View4<const float>(q_sampled.data(), {w.batch, rows, w.heads, w.head_dim}),
      View4<const float>(inputs.k.data(), {w.batch, w.tokens, w.heads, w.head_dim}),
      View4<const float>(inputs.v.data(), {w.batch, w.tokens, w.heads, w.value_dim}), {},
      View4<float>(exact.data(), {w.batch, rows, w.heads, w.value_dim}), View3<float>());
  double max_abs = 0, diff_squared = 0, exact_squared = 0;
  for (int64_t b = 0; b < w.batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < orow; ++c) {
        const double want = exact[(b * rows + i) * orow + c];
        const double got = output[(b * w.tokens + picked[i]) * orow + c];
        max_abs = std::max(max_abs, std::abs(got - want));
        diff_squared += (got - want) * (got - want);
        exact_squared += want * want;
      }
  row.max_abs_error = max_abs;
  row.relative_error = exact_squared > 0 ? std::sqrt(diff_squared / exact_squared) : 0;
}

std::string methods_list() {
  std::string text;
  for (const BenchMethod& method : bench_methods()) {
    std::string left = "  " + method.name + (method.default_on ? "" : " (opt-in)");
    if (left.size() < 26) left.resize(26, ' ');
    else left += "  ";
    text += left + method.summary + "\n";
  }
  return text;
}

// One set of inputs (Gaussian over head shapes, or the captured workload) and the methods
// that run on it.
struct BenchPass {
  std::vector<const BenchMethod*> methods;
  std::vector<HeadShape> shapes;
  std::vector<int64_t> lengths;
  int64_t batch = 1;
  const CapturedWorkload* captured = nullptr;  // null: Gaussian inputs
};

struct BenchSettings {
  Context context;
  int threads = 1;
  int reps = 5;
  double time_limit = 2;
  int64_t error_rows = 256;
  uint64_t seed = 0;
};

struct BenchProgress {
  size_t done = 0, total = 0;
  bool interactive = false;  // a line rewritten in place on a terminal, else one per point
};

void run_pass(const BenchPass& pass, const BenchSettings& settings, BenchProgress& progress,
              std::vector<BenchRow>& rows) {
  const bool interactive = progress.interactive;
  const uint64_t seed = settings.seed;
  for (const HeadShape& shape : pass.shapes) {
    // Per method, the largest measured point: (N, median seconds, flops).
    std::map<std::string, std::tuple<int64_t, double, double>> last_measured;
    for (int64_t n : pass.lengths) {
      const Workload workload{pass.batch, n, shape.heads, shape.head_dim, shape.value_dim, seed};
      std::mt19937_64 generator(seed + static_cast<uint64_t>(n));
      const BenchInputs inputs =
          pass.captured ? captured_prefix(*pass.captured, n) : gaussian_inputs(workload, generator);
      std::map<std::string, double> seconds_by_method;  // this shape and N
      for (const BenchMethod* method : pass.methods) {
        ++progress.done;
        std::cerr << (interactive ? "\r" : "") << "[" << progress.done << "/" << progress.total << "] "
                  << method->name << "  N=" << n << "  H=" << shape.heads
                  << " D=" << shape.head_dim << " Dv=" << shape.value_dim
                  << (interactive ? "          " : "\n") << std::flush;
        BenchRow row;
        row.method = method->name;
        row.inputs = pass.captured ? "smollm2" : "gaussian";
        row.batch = pass.batch;
        row.tokens = n;
        row.heads = shape.heads;
        row.head_dim = shape.head_dim;
        row.value_dim = shape.value_dim;
        row.threads = settings.threads;
        const double flops = method->flops(workload);
        const auto previous = last_measured.find(method->name);
        const bool can_extrapolate = previous != last_measured.end();
        const double predicted =
            can_extrapolate ? std::get<1>(previous->second) * flops / std::get<2>(previous->second)
                            : 0;
        if (can_extrapolate && predicted > settings.time_limit) {
          row.status = "extrapolated from N=" + std::to_string(std::get<0>(previous->second));
          row.median_seconds = row.min_seconds = predicted;
        } else {
          std::unique_ptr<BenchCase> bench_case = method->prepare(workload, inputs, settings.context);
          if (!bench_case) {
            row.status = "skipped: shape not applicable";
            rows.push_back(row);
            continue;
          }
          PeakMemoryProbe probe;
          probe.start();
          const Timing timing = time_case(*bench_case, settings.reps);
          row.extra_bytes = probe.extra_bytes();
          row.status = "measured";
          row.median_seconds = timing.median;
          row.min_seconds = timing.min;
          row.spread = timing.spread;
          last_measured[method->name] = {n, timing.median, flops};
          if (method->approximates_exact && bench_case->output())
            measure_error(workload, inputs, *bench_case->output(), settings.error_rows,
                          settings.context, row);
        }
        row.gflops = flops / row.median_seconds / 1e9;
        seconds_by_method[method->name] = row.median_seconds;
        row.baseline = method->baseline;
        if (const auto base = seconds_by_method.find(method->baseline);
            base != seconds_by_method.end())
          row.speedup = base->second / row.median_seconds;
        rows.push_back(row);
      }
    }
  }
}

// The methods of `methods` that `keep` selects, plus the baselines those are measured
// against, in their original order.
std::vector<const BenchMethod*> with_baselines(const std::vector<const BenchMethod*>& methods,
                                               bool (*keep)(const BenchMethod&)) {
  std::vector<const BenchMethod*> kept;
  for (const BenchMethod* method : methods) {
    const bool needed_baseline = std::any_of(
        methods.begin(), methods.end(),
        [&](const BenchMethod* other) { return keep(*other) && other->baseline == method->name; });
    if (keep(*method) || needed_baseline) kept.push_back(method);
  }
  return kept;
}

bool is_approximation(const BenchMethod& method) { return method.approximates_exact; }
bool is_timing_row(const BenchMethod& method) { return !method.approximates_exact; }

}  // namespace

std::string bench_help() {
  return "usage: subquad bench [options]\n\n"
         "Times every selected method on the same inputs over sequence lengths and head shapes\n"
         "(standard normal, or SmolLM2-135M's Q/K/V on real text: see --inputs), with exact\n"
         "attention in the same run, and prints a table (median time, spread,\n"
         "GFLOP/s by each method's flop model, speed-up vs exact, extra peak memory, error vs\n"
         "exact for approximations). Writes bench.csv and one SVG plot per shape to --out-dir.\n"
         "Points predicted to run longer than --time-limit are extrapolated from the largest\n"
         "measured N by the method's flop model and marked 'extrapolated'.\n\nOptions:\n" +
         options_help(kBenchOptions) + "\nMethods:\n" + methods_list();
}

int run_bench(const std::vector<std::string>& args) {
  const ParsedOptions options = parse_options(args, kBenchOptions, "bench");
  const std::vector<const BenchMethod*> methods = select_methods(options);
  if (options.has("lengths"))
    for (int64_t n : options.integer_list("lengths"))
      check(n >= 1, "option --lengths: expected positive lengths, got ", n);
  const std::string input_kind = options.string_or("inputs", "auto");
  check(input_kind == "auto" || input_kind == "gaussian" || input_kind == "smollm2",
        "option --inputs: expected auto, gaussian or smollm2, got '", input_kind, "'");
  const std::string workload_dir = options.string_or("workload", default_workload_dir());
  const bool synthetic_shape = options.has("shapes") || options.has("batch");
  check(input_kind != "smollm2" || !synthetic_shape,
        "option --inputs smollm2: the shape and batch are the captured workload's; drop --shapes "
        "and --batch, or use --inputs gaussian");
  // auto: the approximation rows on the captured workload (on Gaussian inputs exact attention
  // is nearly uniform and their errors say nothing), the other rows on Gaussian inputs.
  const bool split = input_kind == "auto" && !synthetic_shape &&
                     has_captured_workload(workload_dir) &&
                     std::any_of(methods.begin(), methods.end(),
                                 [](const BenchMethod* m) { return is_approximation(*m); });
  std::optional<CapturedWorkload> captured;
  if (input_kind == "smollm2" || split) captured = load_captured_workload(workload_dir);
  const int64_t batch = options.integer_or("batch", 1);
  check(batch >= 1, "option --batch: expected >= 1, got ", batch);
  std::vector<BenchPass> passes;
  const auto gaussian_pass = [&](std::vector<const BenchMethod*> selected) {
    passes.push_back({std::move(selected), parse_shapes(options.string_or("shapes", kDefaultShapes)),
                      options.has("lengths") ? options.integer_list("lengths") : kDefaultLengths,
                      batch, nullptr});
  };
  const auto captured_pass = [&](std::vector<const BenchMethod*> selected) {
    const std::vector<int64_t> lengths =
        options.has("lengths") ? options.integer_list("lengths") : captured_lengths(*captured);
    for (int64_t n : lengths) captured_prefix(*captured, n);  // refuse N > captured up front
    passes.push_back({std::move(selected),
                      {{captured->heads, captured->head_dim, captured->value_dim}}, lengths,
                      captured->batch, &*captured});
  };
  if (input_kind == "smollm2") {
    captured_pass(methods);
  } else if (split) {
    // A Gaussian pass only when some timing row is more than the approximations' baseline.
    const std::vector<const BenchMethod*> timing = with_baselines(methods, is_timing_row);
    const bool has_timing_rows = std::any_of(timing.begin(), timing.end(), [&](const BenchMethod* m) {
      return std::none_of(methods.begin(), methods.end(), [&](const BenchMethod* other) {
        return is_approximation(*other) && other->baseline == m->name;
      });
    });
    if (has_timing_rows) gaussian_pass(timing);
    captured_pass(with_baselines(methods, is_approximation));
  } else {
    gaussian_pass(methods);
  }
  Context context;
  context.threads = check_threads(options.integer_or("threads", 1), "option --threads");
  check(context.threads >= 1, "option --threads: expected >= 1, got ", context.threads);
  const int threads = thread_count(context);
  const int64_t reps = options.integer_or("reps", 5);
  check(reps >= 1 && reps <= kMaxReps, "option --reps: expected 1 to ", kMaxReps, ", got ",
        reps);
  const double time_limit = options.number_or("time-limit", 2.0);
  check(time_limit > 0, "option --time-limit: expected > 0, got ", time_limit);
  const int64_t error_rows = options.integer_or("error-rows", 256);
  check(error_rows >= 1, "option --error-rows: expected >= 1, got ", error_rows);
  const std::string effort = options.string_or("fft-effort", "measure");
  check(effort == "measure" || effort == "estimate",
        "option --fft-effort: expected estimate or measure, got '", effort, "'");
  set_fft_effort(effort == "measure" ? FftEffort::measure : FftEffort::estimate);
  const std::string out_dir = options.string_or("out-dir", "bench-out");
  const uint64_t seed = static_cast<uint64_t>(options.integer_or("seed", 0));
  const BenchSettings settings{context, threads, static_cast<int>(reps), time_limit, error_rows,
                               seed};

  omp_set_num_threads(threads);  // also governs oneDNN's GEMMs

  BenchMeta meta{SUBQUAD_GIT_COMMIT, cpu_model(), gemm_backend_description(), 0, threads,
                 !captured ? std::string("gaussian")
                 : split   ? "gaussian, approximation rows smollm2 " + captured->directory
                           : "smollm2 " + captured->directory};
  meta.fma_peak_gflops = measure_fma_peak_gflops();
  std::cout << "subquad bench  commit " << meta.commit << "  cpu " << meta.cpu << "\n"
            << "threads " << threads << "  FP32 FMA peak (1 thread, measured) "
            << static_cast<int>(meta.fma_peak_gflops) << " GFLOP/s  GEMM: " << meta.gemm << "\n";
  if (captured)
    std::cout << "inputs: " << (split ? "approximation rows and their baseline on " : "")
              << "SmolLM2-135M Q/K/V captured in " << captured->directory << " (B = "
              << captured->batch << " blocks, N <= " << captured->tokens << ", H = "
              << captured->heads << " over Hkv = " << captured->kv_heads << " repeated per group)"
              << (passes.size() > 1 ? "; the other rows on standard normal inputs (seed " +
                                          std::to_string(seed) + ")"
                                    : "")
              << "\n";
  else
    std::cout << "inputs: standard normal (seed " << seed << ")"
              << (input_kind == "auto" && !synthetic_shape
                      ? "; no captured SmolLM2 workload in " + workload_dir +
                            " (`subquad-llm capture` makes one)"
                      : "")
              << "\n";

  std::vector<BenchRow> rows;
  BenchProgress progress{0, 0, isatty(STDERR_FILENO) != 0};
  for (const BenchPass& pass : passes)
    progress.total += pass.shapes.size() * pass.lengths.size() * pass.methods.size();
  for (const BenchPass& pass : passes) run_pass(pass, settings, progress, rows);
  if (progress.interactive) std::cerr << "\r" << std::string(80, ' ') << "\r";
  print_table(rows, meta);
  std::filesystem::create_directories(out_dir);
  write_csv(out_dir + "/bench.csv", rows, meta);
  write_svg(out_dir + "/bench.svg", rows, meta);
  std::cout << "wrote " << out_dir << "/bench.csv and " << out_dir << "/bench.svg\n";
  return 0;
}

}  // namespace subquad::cli
