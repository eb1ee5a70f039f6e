// CPU model from /proc/cpuinfo, an FMA peak calibration loop, and VmHWM-based memory probe.
#include "machine.h"

#include <chrono>
#include <fstream>
#include <sstream>

namespace subquad::cli {
namespace {

// Reads a "Key:   123 kB" line of /proc/self/status in bytes, or -1.
int64_t status_kilobytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kilobytes = -1;
      fields >> kilobytes;
      return kilobytes * 1024;
    }
  }
  return -1;
}

// 16 float lanes (one AVX-512 register under -march=native; the compiler splits it on
// narrower ISAs, which is then what the peak is).
typedef float Lanes __attribute__((vector_size(64)));
constexpr int kAccumulators = 12;  // enough independent chains to hide FMA latency (4 x 2 ports)

}  // namespace

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

double measure_fma_peak_gflops() {
  Lanes acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = Lanes{} + 0.5f * static_cast<float>(i);
  const Lanes a = Lanes{} + 0.999999f;
  const Lanes b = Lanes{} + 1e-7f;
  constexpr int64_t kIterations = 2'000'000;
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < kIterations; ++it) {
#pragma GCC unroll 12
      for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * a + b;
      asm volatile("" : "+x"(acc[0]));  // keep the loop from being folded
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double flops = 2.0 * 16 * kAccumulators * static_cast<double>(kIterations);
    best = std::max(best, flops / seconds / 1e9);
  }
  float sink = 0;
  for (int i = 0; i < kAccumulators; ++i) sink += acc[i][0];
  asm volatile("" : : "x"(sink));
  return best;
}

void PeakMemoryProbe::start() {
  // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
  std::ofstream("/proc/self/clear_refs") << "5";
  baseline_ = status_kilobytes("VmRSS");
}

int64_t PeakMemoryProbe::extra_bytes() const {
  const int64_t peak = status_kilobytes("VmHWM");
  if (baseline_ < 0 || peak < 0) return -1;
  return std::max<int64_t>(0, peak - baseline_);
}

}  // namespace subquad::cli
