// Per-thread scratch of a parallel_for: one block per thread of the context, taken from the
// call's WorkspaceFrame on the calling thread (so a call given Context::workspace allocates
// nothing) and indexed by omp_get_thread_num() inside the loop body. O(threads count) memory.
#pragma once

#include <omp.h>

#include <cstdint>

#include "common/buffer.h"
#include "common/workspace_frame.h"
#include "subquad/context.h"

namespace subquad::cpu {

template <typename T>
class ThreadScratch {
 public:
  // `count` elements for each of the context's threads, uninitialised.
  ThreadScratch(WorkspaceFrame& frame, const Context& context, int64_t count)
      : stride_(whole_lines(count)), base_(frame.take<T>(thread_count(context) * stride_)) {}

  // The calling thread's block [count] (parallel_for's serial path runs on thread 0).
  T* get() const { return base_ == nullptr ? nullptr : base_ + omp_get_thread_num() * stride_; }

 private:
  // Blocks a whole number of cache lines apart: threads never share a line.
  static int64_t whole_lines(int64_t count) {
    constexpr int64_t per_line = static_cast<int64_t>(kBufferAlignment / sizeof(T));
    static_assert(per_line >= 1 && kBufferAlignment % sizeof(T) == 0);
    return count <= 0 ? 0 : (count + per_line - 1) / per_line * per_line;
  }

  int64_t stride_;  // elements between threads' blocks
  T* base_;         // [threads, stride_]
};

}  // namespace subquad::cpu
