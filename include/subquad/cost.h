// Flop and byte models of the operators: what `subquad bench` and the Google benchmarks
// divide by the measured time (GFLOP/s, GB/s). One model per operator, declared next to it
// in its family's header (exact_attention_forward_cost in exact.h, ...) and defined in
// src/<family>/<family>_cost.cpp, so that every front end counts alike. This header holds
// what they share: the result type and the conventions.
//
// Conventions, the same for every family:
//   - A multiply-add is 2 flops; exp, log and divisions are not counted.
//   - FFTs: a complex transform of n points counts 5 n log2 n flops, a real transform half
//     of that, 2.5 n log2 n (the usual FFTW benchmark convention). A 2D transform of
//     n = Hg * Wg points counts as one transform of n points. A complex product is 6 flops.
//   - bytes: the compulsory memory traffic, every input read once and every output written
//     once (a lower bound: the kernels' packing copies and re-reads are not counted).
// Sizes follow the operators' contracts (B, N, M, H, Hkv, D, Dv as in docs/conventions.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace subquad {

struct Cost {
  double flops = 0;
  double bytes = 0;
};

inline double complex_fft_flops(double n) { return 5.0 * n * std::log2(std::max(n, 2.0)); }
inline double real_fft_flops(double n) { return 0.5 * complex_fft_flops(n); }

}  // namespace subquad
