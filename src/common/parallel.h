// Thin OpenMP helpers so kernels state "run f(i) for i in [0, n) on the context's threads"
// without repeating pragmas. Each index must write its own outputs only; then the result
// does not depend on which thread ran it, and dynamic scheduling balances causal work.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <exception>

#include "subquad/context.h"
#include "subquad/error.h"

namespace subquad {

// Throws OutOfMemory, before any OpenMP region, when `threads` threads cannot be created
// (libgomp would end the process instead); free once a team of that size has existed.
void reserve_threads(int threads);

// Sets OpenMP's thread count to the context's for the lifetime of the scope. oneDNN's
// sgemm threads over omp_get_max_threads() when called outside an active parallel region
// (also inside parallel_for's serial path), so without this Context{threads = 1} would
// still give every tiny GEMM a team of all cores.
class ThreadScope {
 public:
  explicit ThreadScope(const Context& context) : saved_(omp_get_max_threads()) {
    const int threads = thread_count(context);
    reserve_threads(threads);
    omp_set_num_threads(threads);
  }
  ~ThreadScope() { omp_set_num_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

// An exception thrown by `body` (an allocation failure, a check) must not leave an OpenMP
// region, where it would end the process through std::terminate: the first one is kept,
// the remaining indices are skipped, and it is rethrown once the team has joined. The
// context's Interrupt is polled before each index; when it asks, the remaining indices are
// skipped the same way and Interrupted is thrown.
template <typename F>
void parallel_for(const Context& context, int64_t count, F&& body) {
  const ThreadScope scope(context);
  const int threads = thread_count(context);
  Interrupt* const interrupt = context.interrupt;
  std::exception_ptr failure;
  std::atomic<bool> failed{false}, interrupted{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && count > 1)
  for (int64_t i = 0; i < count; ++i) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      if (interrupt != nullptr && interrupt->poll()) {
        interrupted.store(true, std::memory_order_relaxed);
        failed.store(true, std::memory_order_relaxed);
        continue;
      }
      body(i);
    } catch (...) {
#pragma omp critical(subquad_parallel_for_failure)
      if (!failure) failure = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (interrupted.load(std::memory_order_relaxed)) throw Interrupted();
}

}  // namespace subquad
