// Flop and byte models of CAT (include/subquad/cost.h states the conventions).
#include "cat/cat_fft_lower_bound.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

// One head of length n: Dv forward + Dv inverse transforms of v's columns, one of the
// scores, Dv spectral products of n / 2 + 1 bins.
double cat_head_flops(double n, double dv) {
  return (2 * dv + 1) * real_fft_flops(n) + 6 * (n / 2 + 1) * dv;
}

// z [B, N, H] and v [B, N, H, Dv] in, out [B, N, H, Dv] written.
double cat_forward_bytes(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes) {
  return double(B) * N * H * (1 + 2.0 * Dv) * double(element_bytes);
}

// z, v, dout in, dz, dv out (the causal backward also reads out).
double cat_backward_bytes(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes) {
  return double(B) * N * H * (2 + 3.0 * Dv) * double(element_bytes);
}

}  // namespace

Cost cat_forward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes) {
  return {double(B * H) * cat_head_flops(double(N), double(Dv)),
          cat_forward_bytes(B, N, H, Dv, element_bytes)};
}

Cost cat_backward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes) {
  return {double(B * H) * (3.0 * Dv + 2) * real_fft_flops(double(N)),
          cat_backward_bytes(B, N, H, Dv, element_bytes)};
}

Cost cat_causal_forward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                             int64_t element_bytes) {
  return {double(B * H) * cat_head_flops(2.0 * N, double(Dv)),
          cat_forward_bytes(B, N, H, Dv, element_bytes)};
}

Cost cat_causal_backward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                              int64_t element_bytes) {
  return {double(B * H) * (3.0 * Dv + 2) * real_fft_flops(2.0 * N),
          cat_backward_bytes(B, N, H, Dv, element_bytes) +
              double(B) * N * H * Dv * double(element_bytes)};
}

Cost cat_avgkey_forward_cost(int64_t B, int64_t N, int64_t H, int64_t D, int64_t Dv,
                             int64_t element_bytes) {
  Cost cost = cat_forward_cost(B, N, H, Dv, element_bytes);
  cost.flops += 4.0 * double(B * H) * double(N) * double(D);
  // q and k [B, N, H, D] are read instead of z.
  cost.bytes += double(B) * N * H * (2.0 * D - 1) * double(element_bytes);
  return cost;
}

Cost cat_fft_lower_bound_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                              int64_t element_bytes) {
  return {double(B * H) * 2.0 * double(Dv) * real_fft_flops(double(N)),
          double(B) * N * H * Dv * 2.0 * double(element_bytes)};
}

}  // namespace subquad
