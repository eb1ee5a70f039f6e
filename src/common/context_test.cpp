// The thread policy: requests outside [0, kMaxThreads] are refused with a message naming
// the argument, and an operator never runs on more threads than there are cores.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <string>

#include "common/parallel.h"
#include "subquad/context.h"
#include "subquad/error.h"

namespace subquad {
namespace {

std::string threads_error(int64_t requested) {
  try {
    check_threads(requested, "threads");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Threads, RequestsOutsideTheRangeAreRefused) {
  EXPECT_EQ(check_threads(0, "threads"), 0);
  EXPECT_EQ(check_threads(kMaxThreads, "threads"), kMaxThreads);
  EXPECT_EQ(threads_error(-1), "threads: expected 0 (all cores) to 1024, got -1");
  EXPECT_EQ(threads_error(100000), "threads: expected 0 (all cores) to 1024, got 100000");
  // 2^32 + 1 once became 1 through a narrowing cast.
  EXPECT_EQ(threads_error(4294967297), "threads: expected 0 (all cores) to 1024, got 4294967297");
}

TEST(Threads, NeverMoreThanTheCores) {
  const int cores = omp_get_num_procs();
  for (int requested : {0, 1, 3, kMaxThreads, 100000, -5}) {
    Context context;
    context.threads = requested;
    const int used = thread_count(context);
    EXPECT_GE(used, 1);
    EXPECT_LE(used, cores);
    if (requested >= 1 && requested <= cores) {
      EXPECT_EQ(used, requested);
    }
  }
  // A team really is capped: 100000 requested threads run as at most `cores`.
  Context huge;
  huge.threads = 100000;
  std::atomic<int> widest{0};
  parallel_for(huge, 64, [&](int64_t) {
    int now = omp_get_num_threads();
    int seen = widest.load();
    while (now > seen && !widest.compare_exchange_weak(seen, now)) {
    }
  });
  EXPECT_LE(widest.load(), cores);
}

}  // namespace
}  // namespace subquad
