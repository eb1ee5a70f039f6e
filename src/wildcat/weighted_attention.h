// Attention over a weighted key set: out = clamp((E Vt) / (E w), [vmin, vmax]) with
// E = exp(beta Q Ks^T - row max). O(N r (D + Dv)) as two sgemm per block of queries;
// reference: weighted_attention_reference in wildcat_ref.h.
#pragma once

#include <cstdint>

namespace subquad::wildcat {

// Denominators at or below this are treated as zero and the row outputs zeros (then clamped):
// Nyström weights can be negative, so E w may vanish or change sign where the coreset does not
// represent the query's neighbourhood; dividing there would give unbounded outputs.
inline constexpr float kMinDenominator = 1e-20f;

// max_i x[i] for i < n (-inf when n = 0), vectorised; a NaN may be skipped.
float max_of(const float* x, int64_t n);

// x[i] <- exp(x[i] - shift) for i < n, vectorised with exact attention's polynomial exp2.
void exp_shifted(float* x, int64_t n, float shift);

// q [N, D] (row stride ldq), keys [r, D] contiguous, weighted values [r, Dv + 1] contiguous
// (Vt, then w), vmin / vmax [Dv] -> out [N, Dv] (row stride ldo). r = 0 writes zeros.
void weighted_attention_rows(const float* q, int64_t ldq, int64_t N, int64_t D, const float* keys,
                             int64_t r, const float* weighted_values, int64_t Dv, float beta,
                             const float* vmin, const float* vmax, float* out, int64_t ldo);

}  // namespace subquad::wildcat
