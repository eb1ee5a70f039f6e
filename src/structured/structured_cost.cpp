// Flop and byte models of MLR attention (include/subquad/cost.h states the conventions).
#include "subquad/structured.h"

namespace subquad {

Cost mlr_attention_forward_cost(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                int64_t Dv, const std::vector<int64_t>& ranks, bool causal,
                                int64_t element_bytes) {
  const double t = double(T);
  const double per_head = 2 * mlr_score_macs(T, ranks) + 2 * t * t * double(Dv);
  // q [B, T, H, D], k, v [B, T, Hkv, D | Dv] in; out [B, T, H, Dv] and lse [B, H, T] out.
  const double elements = double(B) * t * (double(H) * D + double(Hkv) * (D + Dv) +
                                           double(H) * Dv + double(H));
  return {double(B * H) * per_head * (causal ? 0.5 : 1.0), elements * double(element_bytes)};
}

}  // namespace subquad
