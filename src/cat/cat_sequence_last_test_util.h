// Test helpers of CAT on sequence-last memory: a [B, N, H, Dv] tensor held as a [B, H, Dv, N]
// array (and scores [B, N, H] as [B, H, N]), seen through [B, N, H, Dv] views whose sequence
// axis is the contiguous one.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "subquad/view.h"

namespace subquad::testing {

// A [B, H, Dv, N] array holding a [B, N, H, Dv] tensor, and its [B, N, H, Dv] view.
struct SequenceLast {
  int64_t B, N, H, Dv;
  std::vector<float> data;

  SequenceLast(int64_t B_, int64_t N_, int64_t H_, int64_t Dv_, float fill = 0.0f)
      : B(B_), N(N_), H(H_), Dv(Dv_), data(B_ * H_ * Dv_ * N_, fill) {}
  std::array<int64_t, 4> strides() const { return {H * Dv * N, 1, Dv * N, N}; }
  View4<const float> view() const {
    return View4<const float>(data.data(), {B, N, H, Dv}, strides());
  }
  View4<float> view() { return View4<float>(data.data(), {B, N, H, Dv}, strides()); }

  static SequenceLast from(const std::vector<float>& standard, int64_t B, int64_t N, int64_t H,
                           int64_t Dv) {
    SequenceLast x(B, N, H, Dv);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < Dv; ++c)
            x.view()(b, n, h, c) = standard[((b * N + n) * H + h) * Dv + c];
    return x;
  }
  std::vector<float> standard() const {
    std::vector<float> out(data.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < Dv; ++c) out[((b * N + n) * H + h) * Dv + c] = view()(b, n, h, c);
    return out;
  }
};

// Scores [B, N, H] as a view of [B, H, N] memory (a SequenceLast with Dv = 1, dropped).
inline View3<const float> scores_view(const SequenceLast& z) {
  return View3<const float>(z.data.data(), {z.B, z.N, z.H}, {z.H * z.N, 1, z.N});
}
inline View3<float> scores_view(SequenceLast& z) {
  return View3<float>(z.data.data(), {z.B, z.N, z.H}, {z.H * z.N, 1, z.N});
}

}  // namespace subquad::testing
