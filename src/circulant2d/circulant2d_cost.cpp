// Flop and byte models of 2D Circulant Attention (include/subquad/cost.h states the
// conventions; the spec's N log2 N (4D + 2) + 4ND counts a 2D transform as N log2 N, this
// library as a real transform of N points, 2.5 N log2 N, the same as CAT's).
#include "subquad/circulant2d.h"

namespace subquad {

Cost circulant2d_forward_cost(int64_t B, int64_t tokens, int64_t H, int64_t D, int64_t Dv,
                              int64_t element_bytes) {
  const double n = double(tokens), d = double(D), dv = double(Dv);
  const double per_head = (2 * d + 2 * dv + 2) * real_fft_flops(n) + 2 * n * (d + dv);
  // q, k [B, N, H, D] and v in, out [B, N, H, Dv] written.
  const double elements = double(B) * n * H * (2 * d + 2 * dv);
  return {double(B * H) * per_head, elements * double(element_bytes)};
}

Cost circulant2d_backward_cost(int64_t B, int64_t tokens, int64_t H, int64_t D, int64_t Dv,
                               int64_t element_bytes) {
  const double n = double(tokens), d = double(D), dv = double(Dv);
  const double per_head = (4 * d + 3 * dv + 4) * real_fft_flops(n) + 2 * n * (3 * d + 2 * dv);
  // q, k, v, dout in; dq, dk, dv out.
  const double elements = double(B) * n * H * (4 * d + 3 * dv);
  return {double(B * H) * per_head, elements * double(element_bytes)};
}

Cost circulant2d_fft_bound_cost(int64_t B, int64_t tokens, int64_t H, int64_t Dv,
                                int64_t element_bytes) {
  return {double(B * H) * 2.0 * double(Dv) * real_fft_flops(double(tokens)),
          double(B) * double(tokens) * H * Dv * 2.0 * double(element_bytes)};
}

}  // namespace subquad
