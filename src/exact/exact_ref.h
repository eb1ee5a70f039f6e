// Naive exact attention, forward and backward, templated on float/double: the algorithmic
// reference for the fast path in exact_forward.cpp / exact_backward.cpp and for every
// approximate method. O(N M (D + Dv)) time, one score row (O(M)) of extra memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "subquad/exact.h"
#include "subquad/view.h"

namespace subquad {

// The keys query i may see: [first, last) (empty when first >= last). Shared by the
// reference and the fast path so both use one definition of the masks.
struct KeyRange {
  int64_t first = 0;
  int64_t last = 0;
};

// N queries against M keys; causal is bottom-right aligned (query i sees j <= i + M - N),
// a window w > 0 also requires j > i + M - N - w (and implies causal).
inline KeyRange visible_keys(int64_t i, int64_t N, int64_t M, bool causal, int64_t window) {
  KeyRange range{0, M};
  if (causal || window > 0) {
    const int64_t diagonal = i + (M - N);  // last visible key
    range.last = std::clamp<int64_t>(diagonal + 1, 0, M);
    // window > diagonal reaches key 0; testing it first keeps a huge window from
    // overflowing diagonal - window.
    if (window > 0 && window <= diagonal) range.first = std::min(diagonal - window + 1, M);
  }
  if (range.first > range.last) range.first = range.last;
  return range;
}

// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv], lse [B, H, N]
// (lse may be empty). No input checks: callers pass consistent shapes.
template <typename T>
void exact_attention_reference_forward(View4<const T> q, View4<const T> k, View4<const T> v,
                                       const ExactOptions& options, View4<T> out,
                                       View3<T> lse) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  const int64_t group = Hkv > 0 ? H / Hkv : 1;
  const T scale = static_cast<T>(options.scale.value_or(1.0 / std::sqrt(double(D))));
  std::vector<T> scores(static_cast<size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < N; ++i) {
        const KeyRange keys = visible_keys(i, N, M, options.causal, options.window);
        T* o = out.row(b, i, h);  // [Dv]
        std::fill(o, o + Dv, T(0));
        T row_max = -std::numeric_limits<T>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          T s = 0;
          for (int64_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, hk, d);
          scores[j] = scale * s;
          row_max = std::max(row_max, scores[j]);
        }
        if (keys.first == keys.last) {
          if (!lse.empty()) lse(b, h, i) = -std::numeric_limits<T>::infinity();
          continue;
        }
        T sum = 0;
        for (int64_t j = keys.first; j < keys.last; ++j) {
          scores[j] = std::exp(scores[j] - row_max);
          sum += scores[j];
        }
        for (int64_t j = keys.first; j < keys.last; ++j)
          for (int64_t d = 0; d < Dv; ++d) o[d] += scores[j] / sum * v(b, j, hk, d);
        if (!lse.empty()) lse(b, h, i) = row_max + std::log(sum);
      }
    }
}

// Backward from the forward's out and lse (both from the forward above or the fast
// path) and the gradients dout and dlse (dlse may be empty: zero).
// dq [B, N, H, D], dk [B, M, Hkv, D], dv [B, M, Hkv, Dv] are overwritten.
//   P = exp(S - lse), dV = P^T dO, dP = dO V^T, Di = rowsum(dO * O),
//   dS = P * (dP - Di) + P * dlse  (d lse_i / d S_ij = P_ij),
//   dQ = scale dS K, dK = scale dS^T Q.
template <typename T>
void exact_attention_reference_backward(View4<const T> q, View4<const T> k, View4<const T> v,
                                        View4<const T> out, View3<const T> lse,
                                        View4<const T> dout, View3<const T> dlse,
                                        const ExactOptions& options, View4<T> dq, View4<T> dk,
                                        View4<T> dv) {
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  const int64_t group = Hkv > 0 ? H / Hkv : 1;
  const T scale = static_cast<T>(options.scale.value_or(1.0 / std::sqrt(double(D))));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) std::fill(dq.row(b, i, h), dq.row(b, i, h) + D, T(0));
    for (int64_t j = 0; j < M; ++j)
      for (int64_t h = 0; h < Hkv; ++h) {
        std::fill(dk.row(b, j, h), dk.row(b, j, h) + D, T(0));
        std::fill(dv.row(b, j, h), dv.row(b, j, h) + Dv, T(0));
      }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < N; ++i) {
        const KeyRange keys = visible_keys(i, N, M, options.causal, options.window);
        T row_dot = 0;  // Di = rowsum(dO * O)
        for (int64_t d = 0; d < Dv; ++d) row_dot += dout(b, i, h, d) * out(b, i, h, d);
        for (int64_t j = keys.first; j < keys.last; ++j) {
          T s = 0;
          for (int64_t d = 0; d < D; ++d) s += q(b, i, h, d) * k(b, j, hk, d);
          const T p = std::exp(scale * s - lse(b, h, i));
          T dp = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            dp += dout(b, i, h, d) * v(b, j, hk, d);
            dv(b, j, hk, d) += p * dout(b, i, h, d);
          }
          const T ds = p * (dp - row_dot) + (dlse.empty() ? T(0) : p * dlse(b, h, i));
          for (int64_t d = 0; d < D; ++d) {
            dq(b, i, h, d) += scale * ds * k(b, j, hk, d);
            dk(b, j, hk, d) += scale * ds * q(b, i, h, d);
          }
        }
      }
    }
  }
}

// merge_attention over two parts, and its backward, written as the math reads:
//   lse = log(e^lse_a + e^lse_b),  w_p = e^(lse_p - lse),  out = w_a out_a + w_b out_b;
//   dout_p = w_p dout,  dlse_p = w_p (<dout, out_p - out> + dlse)
// (out depends on lse_p through w_p: d w_p / d lse_p = w_p (1 - w_p), d w_q / d lse_p =
// -w_p w_q). out_p [B, N, H, Dv], lse_p [B, H, N]; a row where both parts are -inf gets
// zeros and lse = -inf, and zero gradients.
template <typename T>
void merge_attention_reference(View4<const T> out_a, View3<const T> lse_a,
                               View4<const T> out_b, View3<const T> lse_b, View4<T> out,
                               View3<T> lse) {
  const int64_t B = out_a.dim(0), N = out_a.dim(1), H = out_a.dim(2), Dv = out_a.dim(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const T top = std::max(lse_a(b, h, i), lse_b(b, h, i));
        if (top == -std::numeric_limits<T>::infinity()) {
          for (int64_t d = 0; d < Dv; ++d) out(b, i, h, d) = 0;
          lse(b, h, i) = top;
          continue;
        }
        const T total = std::exp(lse_a(b, h, i) - top) + std::exp(lse_b(b, h, i) - top);
        const T merged = top + std::log(total);
        const T wa = std::exp(lse_a(b, h, i) - merged), wb = std::exp(lse_b(b, h, i) - merged);
        for (int64_t d = 0; d < Dv; ++d)
          out(b, i, h, d) = wa * out_a(b, i, h, d) + wb * out_b(b, i, h, d);
        lse(b, h, i) = merged;
      }
}

template <typename T>
void merge_attention_reference_backward(View4<const T> out_a, View3<const T> lse_a,
                                        View4<const T> out_b, View3<const T> lse_b,
                                        View4<const T> out, View3<const T> lse,
                                        View4<const T> dout, View3<const T> dlse,
                                        View4<T> dout_a, View3<T> dlse_a, View4<T> dout_b,
                                        View3<T> dlse_b) {
  const int64_t B = out_a.dim(0), N = out_a.dim(1), H = out_a.dim(2), Dv = out_a.dim(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const bool seen = lse(b, h, i) != -std::numeric_limits<T>::infinity();
        const View4<const T> parts[2] = {out_a, out_b};
        const View3<const T> part_lse[2] = {lse_a, lse_b};
        const View4<T> part_dout[2] = {dout_a, dout_b};
        const View3<T> part_dlse[2] = {dlse_a, dlse_b};
        for (int p = 0; p < 2; ++p) {
          const T w = seen ? std::exp(part_lse[p](b, h, i) - lse(b, h, i)) : T(0);
          T dot = dlse.empty() ? T(0) : dlse(b, h, i);
          for (int64_t d = 0; d < Dv; ++d) {
            const T g = dout.empty() ? T(0) : dout(b, i, h, d);
            part_dout[p](b, i, h, d) = w * g;
            dot += g * (parts[p](b, i, h, d) - out(b, i, h, d));
          }
          part_dlse[p](b, h, i) = w * dot;
        }
      }
}

}  // namespace subquad
