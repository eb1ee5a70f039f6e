// Thin OpenMP helpers so kernels state "run f(i) for i in [0, n) on the context's threads"
// without repeating pragmas. Each index must write its own outputs only; then the result
// does not depend on which thread ran it, and dynamic scheduling balances causal work.
#pragma once

#include <omp.h>

#include <cstdint>

#include "subquad/context.h"

namespace subquad {

// Sets OpenMP's thread count to the context's for the lifetime of the scope. oneDNN's
// sgemm threads over omp_get_max_threads() when called outside an active parallel region
// (also inside parallel_for's serial path), so without this Context{threads = 1} would
// still give every tiny GEMM a team of all cores.
class ThreadScope {
 public:
  explicit ThreadScope(const Context& context) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(thread_count(context));
  }
  ~ThreadScope() { omp_set_num_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

template <typename F>
void parallel_for(const Context& context, int64_t count, F&& body) {
  const ThreadScope scope(context);
  const int threads = thread_count(context);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && count > 1)
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace subquad
