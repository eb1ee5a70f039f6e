// Execution context passed to every operator: where it runs, with how many threads, and
// who may ask it to stop. A GPU backend adds a Device value and a stream here without
// changing operator signatures.
#pragma once

#include <atomic>
#include <cstdint>

namespace subquad {

enum class Device { cpu };

// The thread policy, in one place. A requested count is 0 (all cores) or 1..kMaxThreads;
// the front ends (Python, CLI) refuse anything else with check_threads. An operator runs
// on min(requested, cores) threads: more threads than cores would only time-share them,
// and each thread costs a stack, so a huge request must not become thousands of threads
// (100000 overflowed libgomp's stack). The count used is fixed for a request on a machine,
// so results stay reproducible there.
inline constexpr int kMaxThreads = 1024;

class Workspace;  // subquad/workspace.h

// A way to stop a long call early (a user's Ctrl-C). Operators poll it between their tasks
// (parallel_for, src/common/parallel.h), from every thread of the team, so poll() is cheap
// where nothing is pending; once it returns true the call skips its remaining tasks and
// throws Interrupted, its outputs left incomplete. The Python bindings implement it with
// Python's signal handlers (python/src/interrupt.cpp).
class Interrupt {
 public:
  virtual ~Interrupt() = default;
  virtual bool poll() = 0;
};

// An Interrupt that another thread or a signal handler sets (std::atomic<bool> is lock-free
// on every supported target, so request() is async-signal-safe).
class InterruptFlag final : public Interrupt {
 public:
  void request() { requested_.store(true, std::memory_order_relaxed); }
  void clear() { requested_.store(false, std::memory_order_relaxed); }
  bool poll() override { return requested_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> requested_{false};
};

struct Context {
  Device device = Device::cpu;
  int threads = 0;  // 0: all cores (OpenMP's default, OMP_NUM_THREADS or the core count)
  // Scratch memory reused across calls (subquad/workspace.h); null: allocate per call.
  Workspace* workspace = nullptr;
  // Polled between tasks; null: the call runs to the end.
  Interrupt* interrupt = nullptr;
};

// `requested` as a thread count, or an Error naming `name` when it is outside
// [0, kMaxThreads].
int check_threads(int64_t requested, const char* name);

// The number of threads an operator will use under `context` (>= 1, at most the cores).
int thread_count(const Context& context);

}  // namespace subquad
