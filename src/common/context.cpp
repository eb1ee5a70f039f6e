// Thread count resolution for Context.
#include <omp.h>

#include "subquad/context.h"

namespace subquad {

int thread_count(const Context& context) {
  return context.threads > 0 ? context.threads : omp_get_max_threads();
}

}  // namespace subquad
