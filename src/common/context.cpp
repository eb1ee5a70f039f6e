// Thread count resolution for Context (the policy is stated in subquad/context.h), and the
// check that a team's threads can be created before OpenMP tries.
#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/parallel.h"
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

namespace {

// The stack libgomp gives each thread: OMP_STACKSIZE (or GOMP_STACKSIZE) when set, a number
// with an optional B, K (the default unit), M or G suffix; else the pthread default.
size_t openmp_stack_bytes() {
  for (const char* name : {"OMP_STACKSIZE", "GOMP_STACKSIZE"}) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    size_t unit = 1024;
    while (end != nullptr && std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (end != nullptr && *end) {
      switch (std::toupper(static_cast<unsigned char>(*end))) {
        case 'B': unit = 1; break;
        case 'M': unit = size_t(1) << 20; break;
        case 'G': unit = size_t(1) << 30; break;
        default: break;
      }
    }
    if (value > 0) return static_cast<size_t>(value) * unit;
  }
  pthread_attr_t attributes;
  size_t bytes = size_t(8) << 20;
  if (pthread_attr_init(&attributes) == 0) {
    pthread_attr_getstacksize(&attributes, &bytes);
    pthread_attr_destroy(&attributes);
  }
  return bytes;
}

void* do_nothing(void*) { return nullptr; }

// The largest team known to be creatable: libgomp keeps its threads for later regions.
std::atomic<int> g_verified_team{1};

}  // namespace

void reserve_threads(int threads) {
  if (threads <= g_verified_team.load(std::memory_order_relaxed)) return;
  // libgomp ends the process ("Thread creation failed") when it cannot create a thread, for
  // example when the stacks do not fit under an address-space limit: create the same number
  // of threads with the same stack first, and report a failure as OutOfMemory.
  const size_t stack = openmp_stack_bytes();
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, stack);
  std::vector<pthread_t> created;
  int failure = 0;
  for (int t = 1; t < threads && failure == 0; ++t) {
    pthread_t thread;
    failure = pthread_create(&thread, &attributes, do_nothing, nullptr);
    if (failure == 0) created.push_back(thread);
  }
  pthread_attr_destroy(&attributes);
  for (pthread_t thread : created) pthread_join(thread, nullptr);
  if (failure != 0)
    throw_out_of_memory(stack * static_cast<size_t>(threads - 1),
                        "the stacks of " + std::to_string(threads - 1) +
                            " worker threads (use fewer threads, or a smaller OMP_STACKSIZE)");
  int seen = g_verified_team.load(std::memory_order_relaxed);
  while (threads > seen && !g_verified_team.compare_exchange_weak(seen, threads)) {
  }
}

}  // namespace subquad
