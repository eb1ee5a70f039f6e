// Attention over a weighted key set: out = clamp((E Vt) / (E w), [vmin, vmax]) with
// E = exp(beta Q Ks^T + log scales - row max). O(N r (D + Dv)) as two sgemm per block of queries;
// reference: weighted_attention_reference in wildcat_ref.h.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cstdint>

namespace subquad::wildcat {

// The denominator guard. Nyström weights can be negative, so sum_s p_s w_s may cancel to
// round-off (or change sign) where the coreset does not represent the query's neighbourhood;
// the ratio is then unbounded noise. The float32 sum of r products is accurate to about
// r eps sum_s p_s |w_s| (the standard bound), so a row whose denominator is at or below that,
// relative to its own contributions (not to an absolute constant: the entries carry log
// scales, and only ratios are meaningful), outputs 0 (then clamped). Capped at one half so
// that very long caches of positive weights (where the denominator equals the bound's sum)
// are never guarded.
inline float relative_denominator_floor(int64_t r) {
  return std::min(static_cast<float>(r) * FLT_EPSILON, 0.5f);
}

// max_i x[i] for i < n (-inf when n = 0), vectorised; a NaN may be skipped.
float max_of(const float* x, int64_t n);

// x[i] <- exp(x[i] - shift) for i < n, vectorised with exact attention's polynomial exp2.
void exp_shifted(float* x, int64_t n, float shift);

// q [N, D] (row stride ldq), keys [r, D] contiguous, log_scales [r] (entry s weighs
// e^{log_scales[s]}; -inf: never contributes), weighted values [r, Dv + 1] contiguous (Vt, then
// w), vmin / vmax [Dv] (both null: no clamp) -> out [N, Dv] (row stride ldo):
//   out_i = clamp(sum_s p_is Vt_s / sum_s p_is w_s),  p_is = e^{beta q_i.k_s + log_scales[s] -
//   max}.
// r = 0 writes zeros. A row whose sums are not finite (a non-finite query, key, weight or log
// scale) is NaN. scratch [weighted_attention_scratch_floats(N, r, Dv)] is uninitialised
// memory of the caller's (a thread's block of the call's workspace frame).
void weighted_attention_rows(const float* q, int64_t ldq, int64_t N, int64_t D, const float* keys,
                             const float* log_scales, int64_t r, const float* weighted_values,
                             int64_t Dv, float beta, const float* vmin, const float* vmax,
                             float* out, int64_t ldo, float* scratch);

// Floats of scratch weighted_attention_rows needs for N queries over r entries: the score
// block, its sums and |w| (O(min(N, 256) (r + Dv) + r)).
int64_t weighted_attention_scratch_floats(int64_t N, int64_t r, int64_t Dv);

}  // namespace subquad::wildcat
