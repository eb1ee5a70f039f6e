// Benchmark baselines of CAT ("FFT lower bounds"), not part of the operator API: the forward
// and inverse transforms of v's columns alone, what cat_forward cannot run faster than.
// Used by cat_bench.cpp and `subquad bench` (cli/method_cat.cpp); defined in cat.cpp next to
// the plans it shares with cat_forward, its flop model in cat_cost.cpp.
#pragma once

#include <cstdint>

#include "common/buffer.h"
#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

// The transforms of v's columns in contiguous rows (one signal per plan), without the softmax,
// spectral products or gather/scatter. `real_columns` transforms each column as a real signal
// (the bound as the operator's cost is usually stated); `packed_pairs` transforms column pairs
// packed as complex signals x + i y, as cat_forward does (FFTW's complex transforms run faster
// here per column than its real ones: docs/perf/cat.md). The constructor copies v into that
// layout; run() performs the transforms for every head.
enum class CatFftPacking { real_columns, packed_pairs };

template <typename T>
class CatFftLowerBound {
 public:
  explicit CatFftLowerBound(View4<const T> v, CatFftPacking packing = CatFftPacking::real_columns);
  void run(const Context& context);

 private:
  CatFftPacking packing_;
  int64_t heads_, length_, columns_, signals_, distance_;
  // [B H, signals, distance] rows of T (real columns) or std::complex<T> (packed pairs),
  // 64-byte aligned as the kernel's rows.
  Buffer<T> rows_, inverse_;
};

// The forward and inverse real transforms of v's Dv columns alone (conventions:
// subquad/cost.h).
Cost cat_fft_lower_bound_cost(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes);

}  // namespace subquad
