// Weighted attention over a coreset or a weighted KV cache, by blocks of queries so that the
// score block stays in cache, in scratch the caller takes from its workspace frame.
// O(N r (D + Dv)); reference: wildcat_ref.h.
#include "weighted_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/buffer.h"
#include "common/gemm.h"
#include "cpu/simd.h"

namespace subquad::wildcat {
namespace {

constexpr int64_t kQueryBlock = 256;

// Scratch pieces start on cache lines.
int64_t whole_lines(int64_t floats) {
  constexpr int64_t kPerLine = static_cast<int64_t>(kBufferAlignment / sizeof(float));
  return (floats + kPerLine - 1) / kPerLine * kPerLine;
}

// x[i] <- x[i] + offsets[i] for i < n; returns the new max_i x[i] (-inf when n = 0). One
// pass, as max_of.
float add_and_max(float* x, const float* offsets, int64_t n) {
  using V = cpu::Simd<float>;
  float result = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= V::kLanes) {
    V::Vec m = V::splat(result);
    for (; i + V::kLanes <= n; i += V::kLanes) {
      const V::Vec v = V::load(x + i) + V::load(offsets + i);
      V::store(x + i, v);
      m = v > m ? v : m;
    }
    result = V::reduce_max(m);
  }
  for (; i < n; ++i) result = std::max(result, x[i] += offsets[i]);
  return result;
}

// x[i] <- exp(x[i] - shift) as exp_shifted; returns sum_i x[i] a[i] (lane-wise partial sums:
// a fixed order, deterministic), fused into the same pass.
float exp_shifted_dot(float* x, const float* a, int64_t n, float shift) {
  using V = cpu::Simd<float>;
  constexpr float kLog2e = 1.4426950408889634f;
  const V::Vec scale = V::splat(kLog2e), offset = V::splat(shift);
  V::Vec acc = V::splat(0.0f);
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const V::Vec p = V::exp2((V::load(x + i) - offset) * scale);
    V::store(x + i, p);
    acc += p * V::load(a + i);
  }
  if (i < n) {  // the tail through padded vectors (padding multiplies by a = 0)
    float tail[V::kLanes] = {}, tail_a[V::kLanes] = {};
    std::copy(x + i, x + n, tail);
    std::copy(a + i, a + n, tail_a);
    const V::Vec p = V::exp2((V::load(tail) - offset) * scale);
    V::store(tail, p);
    acc += p * V::load(tail_a);
    std::copy(tail, tail + (n - i), x + i);
  }
  return V::reduce_sum(acc);
}

}  // namespace

float max_of(const float* x, int64_t n) {
  using V = cpu::Simd<float>;
  float result = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= V::kLanes) {
    V::Vec m = V::load(x);
    for (i = V::kLanes; i + V::kLanes <= n; i += V::kLanes) {
      const V::Vec v = V::load(x + i);
      m = v > m ? v : m;
    }
    result = V::reduce_max(m);
  }
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

void exp_shifted(float* x, int64_t n, float shift) {
  using V = cpu::Simd<float>;
  constexpr float kLog2e = 1.4426950408889634f;
  const V::Vec scale = V::splat(kLog2e), offset = V::splat(shift);
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes)
    V::store(x + i, V::exp2((V::load(x + i) - offset) * scale));
  if (i < n) {  // the tail through a padded vector
    float tail[V::kLanes] = {};
    std::copy(x + i, x + n, tail);
    V::store(tail, V::exp2((V::load(tail) - offset) * scale));
    std::copy(tail, tail + (n - i), x + i);
  }
}

int64_t weighted_attention_scratch_floats(int64_t N, int64_t r, int64_t Dv) {
  const int64_t block = std::min(N, kQueryBlock);
  return whole_lines(r) + whole_lines(block * r) + whole_lines(block * (Dv + 1)) +
         whole_lines(block);
}

void weighted_attention_rows(const float* q, int64_t ldq, int64_t N, int64_t D, const float* keys,
                             const float* log_scales, int64_t r, const float* weighted_values,
                             int64_t Dv, float beta, const float* vmin, const float* vmax,
                             float* out, int64_t ldo, float* scratch) {
  if (r == 0) {
    for (int64_t i = 0; i < N; ++i) std::fill(out + i * ldo, out + i * ldo + Dv, 0.0f);
    return;
  }
  const int64_t width = Dv + 1;
  const float floor = relative_denominator_floor(r);
  const int64_t block = std::min(N, kQueryBlock);
  float* const abs_weights = scratch;                         // |w|  [r]
  float* const scores = abs_weights + whole_lines(r);         // [block, r]
  float* const sums = scores + whole_lines(block * r);        // [block, Dv + 1]
  float* const abs_sums = sums + whole_lines(block * width);  // sum_s p_s |w_s|  [block]
  for (int64_t s = 0; s < r; ++s) abs_weights[s] = std::abs(weighted_values[s * width + Dv]);
  for (int64_t first = 0; first < N; first += block) {
    const int64_t rows = std::min(block, N - first);
    gemm(Transpose::no, Transpose::yes, rows, r, D, beta, q + first * ldq, ldq, keys, D, 0.0f,
         scores, r);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores + i * r;
      // Subtracting the row max keeps exp in range; it is a factor common to numerator and
      // denominator. A row whose every entry has log scale -inf gets no contribution.
      const float row_max = add_and_max(row, log_scales, r);
      if (row_max == -std::numeric_limits<float>::infinity()) {
        // No entry contributes, or every score is NaN (a NaN query), which the max skips:
        // the latter must stay NaN (non-finite input propagates).
        const bool nan_row = std::any_of(row, row + r, [](float x) { return std::isnan(x); });
        std::fill(row, row + r, 0.0f);
        abs_sums[i] = nan_row ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        continue;
      }
      abs_sums[i] = exp_shifted_dot(row, abs_weights, r, row_max);
    }
    gemm(Transpose::no, Transpose::no, rows, width, r, 1.0f, scores, r, weighted_values,
         width, 0.0f, sums, width);
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < rows; ++i) {
      const float* sum = sums + i * width;
      float* o = out + (first + i) * ldo;
      const float denominator = sum[Dv];
      // Non-finite input propagates (docs/conventions.md): a NaN or inf query, key, weight or
      // log scale makes the row's sums non-finite, and the row is NaN, not the zero that the
      // reliability guard below would choose.
      const bool poisoned = !std::isfinite(denominator) || !std::isfinite(abs_sums[i]);
      const bool reliable = denominator > floor * abs_sums[i];
      for (int64_t c = 0; c < Dv; ++c) {
        const float x = poisoned || std::isnan(sum[c]) ? kNaN
                        : reliable                     ? sum[c] / denominator
                                                       : 0.0f;
        // The exact output is a convex combination of the values: clamping to their
        // per-feature range can only reduce the error of an approximate one. No range (no
        // value was ever widened into it): no clamp.
        o[c] = vmin == nullptr || std::isnan(x) ? x : std::clamp(x, vmin[c], vmax[c]);
      }
    }
  }
}

}  // namespace subquad::wildcat
