// The machine's single-thread FP32 FMA peak, measured: the yardstick the bench and the
// kernel benchmarks print their GFLOP/s against.
#pragma once

namespace subquad {

// Runs independent FMA chains on the calling thread for `trials` short bursts and returns
// the best throughput in GFLOP/s (about 0.1 s in all with the default).
double measure_fma_peak_gflops(int trials = 5);

}  // namespace subquad
