// Result rows of `subquad bench` and their renderings: a console table, CSV, SVG plot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace subquad::cli {

struct BenchRow {
  std::string method;
  std::string inputs = "gaussian";  // "gaussian" or "smollm2" (the captured workload)
  int64_t batch = 1, tokens = 0, heads = 0, head_dim = 0, value_dim = 0;
  int threads = 1;
  std::string status;  // "measured", "extrapolated", "skipped: <why>"
  double median_seconds = 0, min_seconds = 0, spread = 0;  // spread: (max - min) / median
  double gflops = 0;        // by the method's own flop model, at the median time
  std::string baseline;     // the method the speed-up is measured against
  double speedup = 0;       // baseline's median / this median, same shape and N; 0 if unknown
  int64_t extra_bytes = -1; // peak resident memory above the pre-run level
  double max_abs_error = -1, relative_error = -1;  // vs exact attention on sampled rows
};

struct BenchMeta {
  std::string commit, cpu, gemm;
  double fma_peak_gflops = 0;
  int threads = 1;
  // "gaussian", "smollm2 <workload folder>", or both: "gaussian, approximation rows smollm2 <folder>"
  std::string inputs = "gaussian";
};

void print_table(const std::vector<BenchRow>& rows, const BenchMeta& meta);
void write_csv(const std::string& path, const std::vector<BenchRow>& rows, const BenchMeta& meta);
// One log-log plot of median time against N per head shape, one line per method;
// extrapolated points drawn hollow, transform-only bounds dashed.
void write_svg(const std::string& path, const std::vector<BenchRow>& rows, const BenchMeta& meta);

}  // namespace subquad::cli
