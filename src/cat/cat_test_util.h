// Test helpers of the CAT family: contiguous tensors as views, and a scalar loss whose
// gradient is a fixed random tensor (for finite differences).
#pragma once

#include <cstdint>
#include <vector>

#include "cat/cat_ref.h"
#include "common/test_support.h"
#include "subquad/view.h"

namespace subquad::testing {

template <typename T>
View3<const T> view3(const std::vector<T>& x, int64_t B, int64_t N, int64_t H) {
  return View3<const T>(x.data(), {B, N, H});
}
template <typename T>
View3<T> view3(std::vector<T>& x, int64_t B, int64_t N, int64_t H) {
  return View3<T>(x.data(), {B, N, H});
}
template <typename T>
View4<const T> view4(const std::vector<T>& x, int64_t B, int64_t N, int64_t H, int64_t D) {
  return View4<const T>(x.data(), {B, N, H, D});
}
template <typename T>
View4<T> view4(std::vector<T>& x, int64_t B, int64_t N, int64_t H, int64_t D) {
  return View4<T>(x.data(), {B, N, H, D});
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double total = 0;
  for (size_t i = 0; i < a.size(); ++i) total += a[i] * b[i];
  return total;
}

// Max over elements of |a - b| / (|b| + floor): a relative check that tolerates zeros.
inline double max_relative_diff(const std::vector<double>& a, const std::vector<double>& b,
                                double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (std::abs(b[i]) + floor));
  return worst;
}

}  // namespace subquad::testing
