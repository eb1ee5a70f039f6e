// One step of the online softmax over a transposed score tile, shared by the exact and MLR
// forwards. The tile holds scores^T [keys, ld] in log2 units with the queries along the
// vectors, so each query's statistics live in one lane and need no horizontal reduction.
// O(keys * columns + rows * Dv); reference: the per-row softmax of exact_ref.h.
#pragma once

#include <cstdint>
#include <limits>

#include "cpu/simd.h"

namespace subquad::cpu {

// Turns the tile into P^T = 2^(scores - new max) in place, updates the running max and sum
// of each query (`groups` vectors of them, `rows` queries in use) and rescales the rows of
// the unnormalised output acc [rows, dv_padded] whose max grew.
template <typename T, int64_t kGroups>
void online_softmax_step(T* scores, int64_t ld, int64_t keys, int64_t groups, int64_t rows,
                         typename Simd<T>::Vec* running_max, typename Simd<T>::Vec* running_sum,
                         T* acc, int64_t dv_padded) {
  using S = Simd<T>;
  using Vec = typename S::Vec;
  constexpr T minus_inf = -std::numeric_limits<T>::infinity();
  Vec new_max[kGroups], shift[kGroups], sum[kGroups];
  for (int64_t g = 0; g < groups; ++g) new_max[g] = S::splat(minus_inf);
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t g = 0; g < groups; ++g) {
      const Vec x = S::load(scores + j * ld + g * S::kLanes);
      new_max[g] = x > new_max[g] ? x : new_max[g];
    }
  for (int64_t g = 0; g < groups; ++g) {
    new_max[g] = running_max[g] > new_max[g] ? running_max[g] : new_max[g];
    // A query that has seen no key yet keeps max -inf; shifting by 0 then gives
    // p = 2^-inf = 0 instead of 2^(-inf + inf) = NaN.
    shift[g] = new_max[g] == minus_inf ? S::splat(T(0)) : new_max[g];
    sum[g] = S::splat(T(0));
  }
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t g = 0; g < groups; ++g) {
      T* x = scores + j * ld + g * S::kLanes;
      const Vec p = S::exp2(S::load(x) - shift[g]);
      S::store(x, p);
      sum[g] += p;
    }
  for (int64_t g = 0; g < groups; ++g) {
    const Vec correction = S::exp2(running_max[g] - shift[g]);
    running_sum[g] = running_sum[g] * correction + sum[g];
    running_max[g] = new_max[g];
    for (int64_t l = 0; l < S::kLanes && g * S::kLanes + l < rows; ++l) {
      if (correction[l] == T(1)) continue;
      T* row = acc + (g * S::kLanes + l) * dv_padded;
      const Vec factor = S::splat(correction[l]);
      for (int64_t d = 0; d < dv_padded; d += S::kLanes) S::store(row + d, S::load(row + d) * factor);
    }
  }
}

}  // namespace subquad::cpu
