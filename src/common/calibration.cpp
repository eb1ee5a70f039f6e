// FMA peak calibration: twelve independent multiply-add chains of one vector register each
// (the widest the build's ISA has). Twelve chains cover the FMA latency (4 cycles) times two
// FMA ports with room to spare.
#include "common/calibration.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace subquad {
namespace {

#if defined(__AVX512F__)
constexpr int kLaneBytes = 64;
#define SUBQUAD_VECTOR_REGISTER "+v"
#elif defined(__AVX__)
constexpr int kLaneBytes = 32;
#define SUBQUAD_VECTOR_REGISTER "+x"
#else
constexpr int kLaneBytes = 16;
#define SUBQUAD_VECTOR_REGISTER "+x"
#endif
typedef float Lanes __attribute__((vector_size(kLaneBytes)));

}  // namespace

double measure_fma_peak_gflops(int trials) {
  Lanes c0 = Lanes{} + 0.0f, c1 = c0 + 1, c2 = c0 + 2, c3 = c0 + 3, c4 = c0 + 4, c5 = c0 + 5,
        c6 = c0 + 6, c7 = c0 + 7, c8 = c0 + 8, c9 = c0 + 9, c10 = c0 + 10, c11 = c0 + 11;
  const Lanes a = Lanes{} + 0.999999f, b = Lanes{} + 1e-7f;
  constexpr int64_t kIterations = 1'000'000;
  constexpr double kFlopsPerIteration = 2.0 * (kLaneBytes / sizeof(float)) * 12;
  double best = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < kIterations; ++it) {
      c0 = c0 * a + b, c1 = c1 * a + b, c2 = c2 * a + b, c3 = c3 * a + b;
      c4 = c4 * a + b, c5 = c5 * a + b, c6 = c6 * a + b, c7 = c7 * a + b;
      c8 = c8 * a + b, c9 = c9 * a + b, c10 = c10 * a + b, c11 = c11 * a + b;
      // Keeps every chain in a register and the loop from being folded away.
#define R SUBQUAD_VECTOR_REGISTER
      asm volatile("" : R(c0), R(c1), R(c2), R(c3), R(c4), R(c5), R(c6), R(c7), R(c8), R(c9),
                   R(c10), R(c11));
#undef R
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, kFlopsPerIteration * kIterations / seconds / 1e9);
  }
  return best;
}

}  // namespace subquad
