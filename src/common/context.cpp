// Thread count resolution for Context (the policy is stated in subquad/context.h).
#include <omp.h>

#include <algorithm>

#include "subquad/context.h"
#include "subquad/error.h"

namespace subquad {

int check_threads(int64_t requested, const char* name) {
  check(requested >= 0 && requested <= kMaxThreads, name, ": expected 0 (all cores) to ",
        kMaxThreads, ", got ", requested);
  return static_cast<int>(requested);
}

int thread_count(const Context& context) {
  const int cores = std::max(1, omp_get_num_procs());
  const int wanted = context.threads > 0 ? context.threads : omp_get_max_threads();
  return std::clamp(wanted, 1, cores);
}

}  // namespace subquad
