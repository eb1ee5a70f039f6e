// Flop and byte models of exact attention (include/subquad/cost.h states the conventions).
// O(1): the visible pairs of the masks are counted in closed form.
#include <algorithm>

#include "subquad/exact.h"

namespace subquad {

double exact_visible_pairs(int64_t N, int64_t M, bool causal, int64_t window) {
  if (!causal && window <= 0) return static_cast<double>(N) * static_cast<double>(M);
  // Query i sees keys (i + M - N - w, i + M - N], clipped to [0, M): sum over i of
  // min(diagonal + 1, w, M) for diagonals d = i + M - N >= 0 (d < 0 sees nothing).
  const int64_t limit = window > 0 ? std::min(window, M) : M;
  double pairs = 0;
  const int64_t first = std::max<int64_t>(0, M - N);  // diagonal of query 0, clipped
  const int64_t last = M - 1;                          // diagonal of query N - 1
  if (first > last) return 0;
  // Diagonals below limit - 1 see d + 1 keys; the rest see `limit`.
  const int64_t ramp_end = std::min(last, limit - 1);
  if (first <= ramp_end)
    pairs += 0.5 * static_cast<double>(ramp_end - first + 1) *
             static_cast<double>(first + 1 + ramp_end + 1);
  const int64_t flat_begin = std::max(first, limit);
  if (flat_begin <= last)
    pairs += static_cast<double>(last - flat_begin + 1) * static_cast<double>(limit);
  return pairs;
}

Cost exact_attention_forward_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv,
                                  int64_t D, int64_t Dv, bool causal, int64_t window,
                                  int64_t element_bytes) {
  const double heads = static_cast<double>(B * H);
  Cost cost;
  cost.flops = heads * exact_visible_pairs(N, M, causal, window) * 2.0 * double(D + Dv);
  const double elements = double(B) * (double(N) * H * D + double(M) * Hkv * (D + Dv) +
                                       double(N) * H * Dv + double(H) * N);
  cost.bytes = elements * double(element_bytes);
  return cost;
}

Cost exact_attention_backward_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv,
                                   int64_t D, int64_t Dv, bool causal, int64_t window,
                                   int64_t element_bytes) {
  const double heads = static_cast<double>(B * H);
  Cost cost;
  cost.flops = heads * exact_visible_pairs(N, M, causal, window) * 2.0 * double(2 * D + 3 * Dv);
  // In: q, k, v, out, lse, dout; out: dq, dk, dv.
  const double q = double(N) * H * D, kv = double(M) * Hkv * (D + Dv), o = double(N) * H * Dv;
  cost.bytes = double(B) * (2 * q + 2 * kv + 2 * o + double(H) * N) * double(element_bytes);
  return cost;
}

}  // namespace subquad
