// Execution context passed to every operator: where it runs and with how many threads.
// A GPU backend adds a Device value and a stream here without changing operator signatures.
#pragma once

namespace subquad {

enum class Device { cpu };

struct Context {
  Device device = Device::cpu;
  int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS or all cores)
};

// The number of threads an operator will use under `context`.
int thread_count(const Context& context);

}  // namespace subquad
