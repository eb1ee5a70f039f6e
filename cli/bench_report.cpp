// Console table, CSV and SVG (log-log median time vs N, one panel per head shape) for the
// rows of `subquad bench`.
#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "subquad/error.h"

namespace subquad::cli {
namespace {

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string time_text(double seconds) {
  if (seconds >= 1) return format("%.3f s", seconds);
  if (seconds >= 1e-3) return format("%.3f ms", seconds * 1e3);
  return format("%.1f us", seconds * 1e6);
}

std::string memory_text(int64_t bytes) {
  if (bytes < 0) return "-";
  return format("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string shape_key(const BenchRow& row) {
  return "B=" + std::to_string(row.batch) + " H=" + std::to_string(row.heads) +
         " D=" + std::to_string(row.head_dim) + " Dv=" + std::to_string(row.value_dim) + ", " +
         row.inputs + " inputs";
}

bool is_measured(const BenchRow& row) { return row.status == "measured"; }
bool has_time(const BenchRow& row) { return row.status.rfind("skipped", 0) != 0; }
// An approximation's error on standard-normal inputs, where it cannot rank the methods.
bool has_gaussian_error(const BenchRow& row) {
  return row.relative_error >= 0 && row.inputs == "gaussian";
}
// Transform-only rows (fft-lower-bound, circulant2d-fft-bound, ...): bounds, not methods.
bool is_bound(const std::string& method) { return method.find("bound") != std::string::npos; }

}  // namespace

void print_table(const std::vector<BenchRow>& rows, const BenchMeta& meta) {
  std::string current_shape;
  bool gaussian_errors = false;
  for (const BenchRow& row : rows) {
    if (shape_key(row) != current_shape) {
      current_shape = shape_key(row);
      const bool block_has_gaussian_errors =
          std::any_of(rows.begin(), rows.end(), [&](const BenchRow& other) {
            return shape_key(other) == current_shape && has_gaussian_error(other);
          });
      gaussian_errors = gaussian_errors || block_has_gaussian_errors;
      std::printf("\n%s, %d thread(s)%s\n", current_shape.c_str(), meta.threads,
                  block_has_gaussian_errors
                      ? "; 'rel err' on these inputs does not rank the methods (see the end)"
                      : "");
      std::printf("%-20s %7s %12s %7s %9s %7s %9s %-13s %10s %10s  %s\n", "method", "N",
                  "median", "spread", "GFLOP/s", "%peak", "speed-up", "vs", "extra mem",
                  "rel err", "status");
    }
    if (!has_time(row)) {
      std::printf("%-20s %7lld %12s %7s %9s %7s %9s %-13s %10s %10s  %s\n", row.method.c_str(),
                  static_cast<long long>(row.tokens), "-", "-", "-", "-", "-", "-", "-", "-",
                  row.status.c_str());
      continue;
    }
    std::printf("%-20s %7lld %12s %7s %9.1f %6.0f%% %9s %-13s %10s %10s  %s\n",
                row.method.c_str(),
                static_cast<long long>(row.tokens), time_text(row.median_seconds).c_str(),
                is_measured(row) ? format("%.0f%%", 100 * row.spread).c_str() : "-", row.gflops,
                100 * row.gflops / meta.fma_peak_gflops,
                row.speedup > 0 ? format("%.2fx", row.speedup).c_str() : "-",
                row.speedup > 0 ? row.baseline.c_str() : "-", memory_text(row.extra_bytes).c_str(),
                row.relative_error >= 0 ? format("%.2e", row.relative_error).c_str() : "-",
                row.status.c_str());
  }
  std::printf(
      "\n'speed-up': the median time of the method named in 'vs' over this method's, same "
      "shape, N and run.\n'%%peak': GFLOP/s by the method's own flop model over the measured "
      "one-thread FMA peak (%.0f GFLOP/s).\n'rel err': relative Frobenius error against exact "
      "attention on sampled query rows.\n",
      meta.fma_peak_gflops);
  if (gaussian_errors)
    std::printf(
        "\nNOTE 'rel err' on Gaussian inputs: with standard-normal q, k, v exact attention is\n"
        "nearly uniform (every key weighs about 1/N), so every approximation of rank below N\n"
        "shows an error of about 0.7-0.8 and the column says nothing about which is better. Real\n"
        "attention is peaked: `subquad-llm capture` saves the Q/K/V of SmolLM2-135M on real\n"
        "text (about a minute, once), and `subquad bench` then measures these rows on it\n"
        "(scripts/bench.sh captures it when it is missing).\n");
}

void write_csv(const std::string& path, const std::vector<BenchRow>& rows, const BenchMeta& meta) {
  std::ofstream file(path);
  check(file.good(), "bench: cannot write ", path);
  file << "# commit " << meta.commit << ", cpu " << meta.cpu << ", gemm " << meta.gemm
       << ", fma_peak_gflops " << meta.fma_peak_gflops << ", inputs " << meta.inputs << "\n";
  file << "method,batch,tokens,heads,head_dim,value_dim,threads,status,median_s,min_s,spread,"
          "gflops,baseline,speedup,extra_bytes,max_abs_error,relative_error,inputs\n";
  for (const BenchRow& r : rows) {
    file << r.method << ',' << r.batch << ',' << r.tokens << ',' << r.heads << ',' << r.head_dim
         << ',' << r.value_dim << ',' << r.threads << ',' << r.status << ',' << r.median_seconds
         << ',' << r.min_seconds << ',' << r.spread << ',' << r.gflops << ',' << r.baseline << ',' << r.speedup << ','
         << r.extra_bytes << ',' << r.max_abs_error << ',' << r.relative_error << ',' << r.inputs
         << '\n';
  }
}

void write_svg(const std::string& path, const std::vector<BenchRow>& rows, const BenchMeta& meta) {
  std::vector<std::string> shapes;
  std::vector<std::string> methods;
  double t_min = INFINITY, t_max = 0, n_min = INFINITY, n_max = 0;
  for (const BenchRow& row : rows) {
    if (!has_time(row) || row.median_seconds <= 0) continue;
    if (std::find(shapes.begin(), shapes.end(), shape_key(row)) == shapes.end())
      shapes.push_back(shape_key(row));
    if (std::find(methods.begin(), methods.end(), row.method) == methods.end())
      methods.push_back(row.method);
    t_min = std::min(t_min, row.median_seconds);
    t_max = std::max(t_max, row.median_seconds);
    n_min = std::min(n_min, static_cast<double>(row.tokens));
    n_max = std::max(n_max, static_cast<double>(row.tokens));
  }
  std::ofstream file(path);
  check(file.good(), "bench: cannot write ", path);
  constexpr double kPanelWidth = 520, kPanelHeight = 380, kMargin = 70, kCharWidth = 7.5;
  size_t longest_name = 0;
  for (const std::string& method : methods)
    longest_name = std::max(longest_name, method.size() + (is_bound(method) ? 8 : 0));
  const double legend_width = 50 + kCharWidth * longest_name;
  const double width = kPanelWidth * std::max<size_t>(1, shapes.size()) + legend_width;
  file << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='"
       << kPanelHeight + 40 << "' font-family='sans-serif' font-size='12'>\n"
       << "<rect width='100%' height='100%' fill='white'/>\n"
       << "<text x='10' y='18'>subquad bench, " << meta.threads << " thread(s), " << meta.cpu
       << ", commit " << meta.commit << "; hollow points are extrapolated</text>\n";
  if (shapes.empty()) {
    file << "</svg>\n";
    return;
  }
  const double lt0 = std::floor(std::log10(t_min)), lt1 = std::ceil(std::log10(t_max));
  const double ln0 = std::log2(n_min), ln1 = std::max(std::log2(n_max), ln0 + 1);
  // 16 colours that stay apart (Kelly's and Tableau's), as many as the registered methods.
  static const char* kColors[] = {"#000000", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                                  "#7f7f7f", "#aec7e8", "#ff9896", "#98df8a", "#c5b0d5",
                                  "#f7b6d2"};
  const int colors = sizeof kColors / sizeof *kColors;
  auto dash = [](const std::string& method) {
    return is_bound(method) ? std::string(" stroke-dasharray='6,4'") : std::string();
  };
  for (size_t p = 0; p < shapes.size(); ++p) {
    const double x0 = p * kPanelWidth + kMargin, y0 = 40, w = kPanelWidth - kMargin - 20,
                 h = kPanelHeight - kMargin;
    auto px = [&](double n) { return x0 + w * (std::log2(n) - ln0) / (ln1 - ln0); };
    auto py = [&](double t) { return y0 + h - h * (std::log10(t) - lt0) / std::max(1.0, lt1 - lt0); };
    file << "<text x='" << x0 << "' y='" << y0 - 6 << "'>" << shapes[p] << "</text>\n"
         << "<rect x='" << x0 << "' y='" << y0 << "' width='" << w << "' height='" << h
         << "' fill='none' stroke='black'/>\n";
    for (double e = lt0; e <= lt1; ++e)
      file << "<text x='" << x0 - 8 << "' y='" << py(std::pow(10, e)) + 4
           << "' text-anchor='end'>1e" << e << " s</text>\n";
    for (double e = std::ceil(ln0); e <= ln1; e += 2)
      file << "<text x='" << px(std::exp2(e)) << "' y='" << y0 + h + 16
           << "' text-anchor='middle'>" << static_cast<long long>(std::exp2(e)) << "</text>\n";
    file << "<text x='" << x0 + w / 2 << "' y='" << y0 + h + 34
         << "' text-anchor='middle'>N (tokens)</text>\n";
    for (size_t m = 0; m < methods.size(); ++m) {
      std::string points;
      for (const BenchRow& row : rows) {
        if (row.method != methods[m] || shape_key(row) != shapes[p] || !has_time(row)) continue;
        const double x = px(row.tokens), y = py(row.median_seconds);
        points += std::to_string(x) + "," + std::to_string(y) + " ";
        file << "<circle cx='" << x << "' cy='" << y << "' r='3.5' stroke='"
             << kColors[m % colors] << "' fill='" << (is_measured(row) ? kColors[m % colors] : "white")
             << "'/>\n";
      }
      if (!points.empty())
        file << "<polyline points='" << points << "' fill='none' stroke='" << kColors[m % colors]
             << "'" << dash(methods[m]) << "/>\n";
    }
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    const double x = kPanelWidth * shapes.size() + 10, y = 60 + 18.0 * m;
    file << "<line x1='" << x << "' y1='" << y - 4 << "' x2='" << x + 20 << "' y2='" << y - 4
         << "' stroke='" << kColors[m % colors] << "' stroke-width='2'" << dash(methods[m])
         << "/>\n<text x='" << x + 26 << "' y='" << y << "'>" << methods[m]
         << (is_bound(methods[m]) ? " (bound)" : "") << "</text>\n";
  }
  file << "</svg>\n";
}

}  // namespace subquad::cli
