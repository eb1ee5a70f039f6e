// Helpers shared by every family's tests: seeded random tensors, error measures and the
// tolerance rule of the project (compare the fast float32 result against a float64
// reference, allowing a small multiple of the float32 reference's own error).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace subquad::testing {

// Uniform values in [lo, hi) from a fixed seed.
template <typename T>
std::vector<T> random_vector(int64_t count, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> distribution(lo, hi);
  std::vector<T> values(static_cast<size_t>(count));
  for (T& x : values) x = static_cast<T>(distribution(generator));
  return values;
}

template <typename To, typename From>
std::vector<To> cast_vector(const std::vector<From>& values) {
  return std::vector<To>(values.begin(), values.end());
}

// max_i |a_i - b_i|.
template <typename A, typename B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst;
}

template <typename T>
double max_abs(const std::vector<T>& a) {
  double worst = 0.0;
  for (T x : a) worst = std::max(worst, std::abs(static_cast<double>(x)));
  return worst;
}

template <typename T>
bool all_finite(const std::vector<T>& a) {
  return std::all_of(a.begin(), a.end(), [](T x) { return std::isfinite(x); });
}

// The project's tolerance rule. `fast` is the float32 kernel's result, `reference32` the
// float32 reference's, `reference64` the float64 reference's (the truth). The fast
// result may be off by at most `factor` times the float32 reference's own max error,
// plus a floor of a few float32 ulps of the output's magnitude (the float32 reference can
// be exact by luck on tiny problems).
template <typename T32, typename T64>
void expect_close_to_reference(const std::vector<T32>& fast, const std::vector<T32>& reference32,
                               const std::vector<T64>& reference64, double factor = 2.0,
                               double floor_ulps = 8.0) {
  ASSERT_EQ(fast.size(), reference64.size());
  ASSERT_TRUE(all_finite(fast)) << "fast result has non-finite values";
  const double reference_error = max_abs_diff(reference32, reference64);
  const double floor = floor_ulps * 1.1920929e-07 * std::max(1.0, max_abs(reference64));
  const double error = max_abs_diff(fast, reference64);
  EXPECT_LE(error, factor * reference_error + floor)
      << "fast max error " << error << " vs float32 reference error " << reference_error;
}

// Central finite-difference gradient of a scalar function f(x) in float64.
template <typename F>
std::vector<double> finite_difference_gradient(std::vector<double> x, F&& f,
                                               double step = 1e-6) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = f(x);
    x[i] = saved - step;
    const double minus = f(x);
    x[i] = saved;
    gradient[i] = (plus - minus) / (2 * step);
  }
  return gradient;
}

}  // namespace subquad::testing
