// Test helpers of the WildCat family: exact attention by the naive reference in either
// precision, and the project's tolerance rule (common/test_support.h) for results of any
// scalar type, with the checks that keep a comparison from passing on a blank output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/test_support.h"
#include "exact/exact_ref.h"
#include "wildcat/wildcat_ref.h"

namespace subquad::testing {

// The Nyström values W [V, 1] [r, Dv + 1] of nystrom_values_reference (W = H_SS^-1 H_S: for
// the exponential kernel, scaled keys kt [n, D], values [n, Dv]) formed the way the fast path
// forms them, in precision T: the explicit inverse of the Gaussian kernel G_SS
// (gaussian_inverse_reference) times the projection G_S: diag(e^{sq/2}) [V, 1], then
// diag(e^{-sq_S/2}). An explicit inverse applied to a product carries round-off of order
// eps ||G_SS^-1|| ||projection||, more than a backward-stable solve (whose error is relative to
// the solution), so this is the float32 error the fast path is to be held to.
template <typename T>
std::vector<T> nystrom_values_by_inverse(const std::vector<T>& kt, int64_t D,
                                         const std::vector<T>& values, int64_t Dv,
                                         const std::vector<int64_t>& pivots) {
  const auto r = static_cast<int64_t>(pivots.size());
  const auto n = static_cast<int64_t>(kt.size()) / D;
  const int64_t width = Dv + 1;
  const auto inverse = wildcat::gaussian_inverse_reference(kt, D, pivots);
  std::vector<T> half_sq(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) half_sq[l] = wildcat::dot_rows(kt, D, l, l) / 2;
  std::vector<T> projection(static_cast<size_t>(r * width), T(0));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t l = 0; l < n; ++l) {
      // G(s_i, l) e^{sq_l / 2} = e^{kt_s.kt_l - sq_s / 2}
      const T g = std::exp(wildcat::dot_rows(kt, D, pivots[i], l) - half_sq[pivots[i]]);
      for (int64_t c = 0; c < Dv; ++c) projection[i * width + c] += g * values[l * Dv + c];
      projection[i * width + Dv] += g;
    }
  std::vector<T> out(static_cast<size_t>(r * width), T(0));
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < r; ++j)
      for (int64_t c = 0; c < width; ++c)
        out[i * width + c] += inverse[i * r + j] * projection[j * width + c];
    for (int64_t c = 0; c < width; ++c) out[i * width + c] *= std::exp(-half_sq[pivots[i]]);
  }
  return out;
}

struct AttentionShape {
  int64_t B, N, M, H, Hkv, D, Dv;
};

// softmax(scale q k^T) v by exact_ref.h in precision T (scale default 1/sqrt(D)):
// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> [B, N, H, Dv].
template <typename T>
std::vector<T> exact_attention(const AttentionShape& s, const std::vector<float>& q,
                               const std::vector<float>& k, const std::vector<float>& v,
                               std::optional<double> scale = std::nullopt) {
  const auto qt = cast_vector<T>(q), kt = cast_vector<T>(k), vt = cast_vector<T>(v);
  std::vector<T> out(static_cast<size_t>(s.B * s.N * s.H * s.Dv));
  ExactOptions options;
  options.scale = scale;
  exact_attention_reference_forward<T>(View4<const T>(qt.data(), {s.B, s.N, s.H, s.D}),
                                       View4<const T>(kt.data(), {s.B, s.M, s.Hkv, s.D}),
                                       View4<const T>(vt.data(), {s.B, s.M, s.Hkv, s.Dv}), options,
                                       View4<T>(out.data(), {s.B, s.N, s.H, s.Dv}), View3<T>());
  return out;
}

// expect_close_to_reference for a result of any type (the incremental inverse is float64
// built from float32 kernel rows): the error of `fast` against the float64 truth at most
// `factor` times the float32 reference's own error, plus `floor_ulps` float32 ulps of the
// output's magnitude. Also requires `fast` finite and, unless the truth is all zeros, not
// all zeros.
template <typename Fast, typename R32, typename R64>
void expect_within_reference_error(const std::vector<Fast>& fast,
                                   const std::vector<R32>& reference32,
                                   const std::vector<R64>& reference64, double factor = 2.0,
                                   double floor_ulps = 8.0) {
  ASSERT_EQ(fast.size(), reference64.size());
  ASSERT_TRUE(all_finite(fast)) << "result has non-finite values";
  if (max_abs(reference64) > 0.0) {
    EXPECT_GT(max_abs(fast), 0.0) << "result is all zeros";
  }
  const double reference_error = max_abs_diff(reference32, reference64);
  const double floor = floor_ulps * FLT_EPSILON * std::max(1.0, max_abs(reference64));
  const double error = max_abs_diff(fast, reference64);
  EXPECT_LE(error, factor * reference_error + floor)
      << "max error " << error << " vs float32 reference error " << reference_error;
}

}  // namespace subquad::testing
