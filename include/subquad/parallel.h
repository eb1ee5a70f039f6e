// Thin OpenMP helpers so kernels state "run f(i) for i in [0, n) on the context's threads"
// without repeating pragmas. Each index must write its own outputs only; then the result
// does not depend on which thread ran it, and dynamic scheduling balances causal work.
#pragma once

#include <cstdint>

#include "subquad/context.h"

namespace subquad {

template <typename F>
void parallel_for(const Context& context, int64_t count, F&& body) {
  const int threads = thread_count(context);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && count > 1)
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace subquad
