// Naive MLR attention, forward and backward, templated on float/double: builds the dense
// T x T score matrix of each head explicitly. The reference for mlr_backward.cpp and
// mlr_decoder.cpp. O(T^2 (D + Dv)) time, O(T^2) memory per head.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "structured/mlr_levels.h"
#include "subquad/structured.h"

namespace subquad {

// The dense scores S [T, T] of head h of batch b, -inf where the causal mask hides a key.
template <typename T>
std::vector<T> mlr_reference_scores(View4<const T> q, View4<const T> k, const mlr::Levels& levels,
                                    const MlrOptions& options, int64_t b, int64_t h) {
  const int64_t N = q.dim(1), group = q.dim(2) / k.dim(2), hk = h / group;
  std::vector<T> scores(static_cast<size_t>(N * N), T(0));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T s = 0;
      int64_t shared = 0;
      for (int64_t l = 0; l < levels.count; ++l) {
        if (i / levels.block_sizes[l] != j / levels.block_sizes[l]) continue;
        ++shared;
        T dot = 0;
        for (int64_t c = levels.offsets[l]; c < levels.offsets[l + 1]; ++c)
          dot += q(b, i, h, c) * k(b, j, hk, c);
        s += dot / static_cast<T>(levels.ranks[l]);
      }
      if (options.block_divide) s /= static_cast<T>(shared);
      if (options.causal && j > i) s = -std::numeric_limits<T>::infinity();
      scores[i * N + j] = s;
    }
  return scores;
}

// q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv] -> out [B, T, H, Dv], lse [B, H, T].
template <typename T>
void mlr_attention_reference_forward(View4<const T> q, View4<const T> k, View4<const T> v,
                                     const MlrOptions& options, View4<T> out, View3<T> lse) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), Dv = v.dim(3);
  const int64_t group = H / k.dim(2);
  const mlr::Levels levels = mlr::make_levels(options.ranks, q.dim(3), N);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<T> scores = mlr_reference_scores(q, k, levels, options, b, h);
      for (int64_t i = 0; i < N; ++i) {
        const T* s = scores.data() + i * N;
        const T row_max = *std::max_element(s, s + N);
        T sum = 0;
        for (int64_t j = 0; j < N; ++j) sum += std::exp(s[j] - row_max);
        T* o = out.row(b, i, h);
        std::fill(o, o + Dv, T(0));
        for (int64_t j = 0; j < N; ++j) {
          const T p = std::exp(s[j] - row_max) / sum;
          for (int64_t d = 0; d < Dv; ++d) o[d] += p * v(b, j, h / group, d);
        }
        if (!lse.empty()) lse(b, h, i) = row_max + std::log(sum);
      }
    }
}

// Backward of the dense forward:
//   P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)),
//   S = sum_l w (Q_l K_l^T / r_l) on the level-l blocks (w = 1 / shared levels under
//   block_divide, else 1), so dQ_l = (w dS)_l K_l / r_l and dK_l = (w dS)_l^T Q_l / r_l,
//   with (.)_l the entries inside level-l blocks.
template <typename T>
void mlr_attention_reference_backward(View4<const T> q, View4<const T> k, View4<const T> v,
                                      View4<const T> dout, const MlrOptions& options,
                                      View4<T> dq, View4<T> dk, View4<T> dv) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3);
  const int64_t Hkv = k.dim(2), group = H / Hkv;
  const mlr::Levels levels = mlr::make_levels(options.ranks, D, N);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t h = 0; h < H; ++h) std::fill(dq.row(b, i, h), dq.row(b, i, h) + D, T(0));
      for (int64_t h = 0; h < Hkv; ++h) {
        std::fill(dk.row(b, i, h), dk.row(b, i, h) + D, T(0));
        std::fill(dv.row(b, i, h), dv.row(b, i, h) + Dv, T(0));
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      std::vector<T> p = mlr_reference_scores(q, k, levels, options, b, h);
      std::vector<T> dp(static_cast<size_t>(N * N));
      for (int64_t i = 0; i < N; ++i) {
        T* row = p.data() + i * N;
        const T row_max = *std::max_element(row, row + N);
        T sum = 0;
        for (int64_t j = 0; j < N; ++j) sum += (row[j] = std::exp(row[j] - row_max));
        for (int64_t j = 0; j < N; ++j) row[j] /= sum;
        T row_dot = 0;
        for (int64_t j = 0; j < N; ++j) {
          T g = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            g += dout(b, i, h, d) * v(b, j, hk, d);
            dv(b, j, hk, d) += row[j] * dout(b, i, h, d);
          }
          dp[i * N + j] = g;
          row_dot += row[j] * g;
        }
        for (int64_t j = 0; j < N; ++j) {
          const int64_t shared = levels.shared_levels(i, j);
          T ds = row[j] * (dp[i * N + j] - row_dot);
          if (options.block_divide) ds /= static_cast<T>(shared);
          for (int64_t l = 0; l < shared; ++l)
            for (int64_t c = levels.offsets[l]; c < levels.offsets[l + 1]; ++c) {
              const T scaled = ds / static_cast<T>(levels.ranks[l]);
              dq(b, i, h, c) += scaled * k(b, j, hk, c);
              dk(b, j, hk, c) += scaled * q(b, i, h, c);
            }
        }
      }
    }
  }
}

}  // namespace subquad
