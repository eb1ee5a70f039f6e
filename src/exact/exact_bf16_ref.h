// Naive bfloat16 exact attention, forward and backward: what a framework computes when every
// operation of the textbook formula runs in bfloat16 (each product of matrices accumulates
// in float32 and rounds its result to bfloat16, the softmax runs in float32 and rounds P).
// FlashAttention's tolerance rule measures a bfloat16 kernel against it: the kernel's error
// must be at most twice this implementation's, both against float64 (exact_bf16_test.cpp).
// O(N M (D + Dv)); inputs and outputs as float32 values that bfloat16 holds exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "exact/exact_ref.h"
#include "subquad/bfloat16.h"
#include "subquad/view.h"

namespace subquad {

inline float round_bf16(float x) { return static_cast<float>(bfloat16(x)); }

// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] (bfloat16 values),
// lse [B, H, N] (float32, from the bfloat16 scores).
inline void exact_attention_naive_bf16_forward(View4<const float> q, View4<const float> k,
                                               View4<const float> v, const ExactOptions& options,
                                               View4<float> out, View3<float> lse) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  const int64_t group = H / Hkv;
  const float scale = static_cast<float>(options.scale.value_or(1.0 / std::sqrt(double(D))));
  std::vector<float> p(static_cast<size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const KeyRange keys = visible_keys(i, N, M, options.causal, options.window);
        float* o = out.row(b, i, h);
        std::fill(o, o + Dv, 0.0f);
        if (keys.first == keys.last) {
          lse(b, h, i) = -std::numeric_limits<float>::infinity();
          continue;
        }
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          float s = 0;  // S = bf16(scale Q K^T)
          for (int64_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, h / group, d);
          p[j] = round_bf16(scale * s);
          row_max = std::max(row_max, p[j]);
        }
        float sum = 0;
        for (int64_t j = keys.first; j < keys.last; ++j) {
          p[j] = std::exp(p[j] - row_max);
          sum += p[j];
        }
        lse(b, h, i) = row_max + std::log(sum);
        for (int64_t j = keys.first; j < keys.last; ++j) p[j] = round_bf16(p[j] / sum);
        for (int64_t d = 0; d < Dv; ++d) {
          float acc = 0;  // O = bf16(P V)
          for (int64_t j = keys.first; j < keys.last; ++j) acc += p[j] * v(b, j, h / group, d);
          o[d] = round_bf16(acc);
        }
      }
}

// Backward of the naive forward through the same bfloat16 operations: P = bf16(softmax(S)),
// dV = bf16(P^T dO), dP = bf16(dO V^T), dS = bf16(P (dP - rowsum(P dP)) + P dlse) (the
// softmax's backward in float32), dQ = bf16(scale dS K), dK = bf16(scale dS^T Q). dlse may be
// empty. dq, dk, dv are overwritten.
inline void exact_attention_naive_bf16_backward(View4<const float> q, View4<const float> k,
                                                View4<const float> v, View4<const float> dout,
                                                View3<const float> dlse,
                                                const ExactOptions& options, View4<float> dq,
                                                View4<float> dk, View4<float> dv) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  const int64_t group = H / Hkv;
  const float scale = static_cast<float>(options.scale.value_or(1.0 / std::sqrt(double(D))));
  // float32 accumulators of dK, dV over the query heads of a group, rounded once at the end.
  std::vector<float> dk_acc(size_t(B * M * Hkv * D), 0.0f), dv_acc(size_t(B * M * Hkv * Dv), 0.0f);
  std::vector<float> p(static_cast<size_t>(M)), dp(static_cast<size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < N; ++i) {
        const KeyRange keys = visible_keys(i, N, M, options.causal, options.window);
        std::fill(dq.row(b, i, h), dq.row(b, i, h) + D, 0.0f);
        if (keys.first == keys.last) continue;
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          float s = 0;
          for (int64_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, hk, d);
          p[j] = round_bf16(scale * s);
          row_max = std::max(row_max, p[j]);
        }
        float sum = 0;
        for (int64_t j = keys.first; j < keys.last; ++j) {
          p[j] = std::exp(p[j] - row_max);
          sum += p[j];
        }
        float row_dot = 0;  // rowsum(P dP), in float32 as the softmax backward
        for (int64_t j = keys.first; j < keys.last; ++j) {
          p[j] = round_bf16(p[j] / sum);
          float g = 0;
          for (int64_t d = 0; d < Dv; ++d) g += dout(b, i, h, d) * v(b, j, hk, d);
          dp[j] = round_bf16(g);
          row_dot += p[j] * dp[j];
        }
        const float shift = dlse.empty() ? 0.0f : dlse(b, h, i);
        for (int64_t j = keys.first; j < keys.last; ++j) {
          const float ds = round_bf16(p[j] * (dp[j] - row_dot) + p[j] * shift);
          float* dk_row = dk_acc.data() + ((b * M + j) * Hkv + hk) * D;
          float* dv_row = dv_acc.data() + ((b * M + j) * Hkv + hk) * Dv;
          for (int64_t d = 0; d < Dv; ++d) dv_row[d] += p[j] * dout(b, i, h, d);
          for (int64_t d = 0; d < D; ++d) {
            dq(b, i, h, d) += ds * k(b, j, hk, d);
            dk_row[d] += ds * q(b, i, h, d);
          }
        }
        for (int64_t d = 0; d < D; ++d) dq(b, i, h, d) = round_bf16(scale * dq(b, i, h, d));
      }
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < M; ++j)
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        const int64_t row = (b * M + j) * Hkv + hk;
        for (int64_t d = 0; d < D; ++d) dk(b, j, hk, d) = round_bf16(scale * dk_acc[row * D + d]);
        for (int64_t d = 0; d < Dv; ++d) dv(b, j, hk, d) = round_bf16(dv_acc[row * Dv + d]);
      }
}

}  // namespace subquad
