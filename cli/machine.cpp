// CPU model from /proc/cpuinfo and a VmHWM-based memory probe.
#include "machine.h"

#include <malloc.h>

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

void PeakMemoryProbe::start() {
  // Hand memory that earlier runs freed back to the kernel first: otherwise this run's
  // allocations reuse resident pages and its peak does not show.
  malloc_trim(0);
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
