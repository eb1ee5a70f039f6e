// Facts about the machine the bench reports next to its figures: the CPU model and a probe
// of peak resident memory around a call.
#pragma once

#include <cstdint>
#include <string>

namespace subquad::cli {

std::string cpu_model();

// Peak-RSS probe: start() resets the kernel's high-water mark, extra_bytes() returns how far
// the resident set rose above its size at start(). Linux only; returns -1 where unsupported.
class PeakMemoryProbe {
 public:
  void start();
  int64_t extra_bytes() const;

 private:
  int64_t baseline_ = -1;
};

}  // namespace subquad::cli
