// Makes oneDNN's sgemm honour the context's thread count for the duration of an operator.
// sgemm called outside a parallel region threads over omp_get_max_threads(); WildCat calls
// it thousands of times with tiny shapes (one 1 x n row per pivot), where a team of threads
// costs more than the work, and Context{threads = 1} must mean one thread.
#pragma once

#include <omp.h>

#include "subquad/context.h"

namespace subquad::wildcat {

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

}  // namespace subquad::wildcat
