// Real and complex FFT plans against a direct O(n^2) DFT, 1D and 2D, odd and prime sizes,
// batches, strided layouts, in place, and misaligned pointers; the cache hands back the
// same plan.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "common/fft.h"
#include "common/test_support.h"
#include "subquad/error.h"

namespace subquad {
namespace {

// Direct DFT of one real 2D signal [n0, n1] (n0 = 1 for 1D): the half spectrum.
std::vector<std::complex<double>> direct_rfft(const double* x, int64_t n0, int64_t n1) {
  const int64_t h1 = n1 / 2 + 1;
  std::vector<std::complex<double>> out(n0 * h1);
  for (int64_t k0 = 0; k0 < n0; ++k0)
    for (int64_t k1 = 0; k1 < h1; ++k1) {
      std::complex<double> sum = 0;
      for (int64_t i = 0; i < n0; ++i)
        for (int64_t j = 0; j < n1; ++j) {
          const double angle = -2 * std::numbers::pi *
                               (static_cast<double>(k0 * i) / n0 + static_cast<double>(k1 * j) / n1);
          sum += x[i * n1 + j] * std::polar(1.0, angle);
        }
      out[k0 * h1 + k1] = sum;
    }
  return out;
}

template <typename T>
void check_round_trip(int rank, int64_t n0, int64_t n1, int64_t batch, bool misalign) {
  RealFftLayout layout;
  layout.rank = rank;
  layout.n0 = rank == 1 ? n1 : n0;
  layout.n1 = rank == 1 ? 1 : n1;
  layout.batch = batch;
  const int64_t rows = rank == 1 ? 1 : n0;
  const int64_t real = rows * n1;
  const int64_t half = rows * (n1 / 2 + 1);
  std::vector<double> x = testing::random_vector<double>(batch * real, 7 + n1);
  std::vector<T> input(batch * real + 1);
  T* in = input.data() + (misalign ? 1 : 0);
  for (int64_t i = 0; i < batch * real; ++i) in[i] = static_cast<T>(x[i]);
  std::vector<std::complex<T>> spectrum(batch * half);

  const RealFftPlan<T> plan = RealFftPlan<T>::get(layout);
  plan.forward(in, spectrum.data());
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  const double tolerance = 8 * eps * std::log2(2.0 * real) * std::sqrt(double(real));
  for (int64_t b = 0; b < batch; ++b) {
    const auto expected = direct_rfft(x.data() + b * real, rows, n1);
    for (int64_t i = 0; i < half; ++i)
      ASSERT_NEAR(std::abs(std::complex<double>(spectrum[b * half + i]) - expected[i]), 0.0,
                  tolerance)
          << "batch " << b << " bin " << i;
  }
  std::vector<T> output(batch * real + 1);
  T* out = output.data() + (misalign ? 1 : 0);
  plan.inverse(spectrum.data(), out);
  for (int64_t i = 0; i < batch * real; ++i)
    ASSERT_NEAR(out[i] / static_cast<double>(real), x[i], tolerance);
}

TEST(RealFft, OneDimensionalMatchesDirectDft) {
  for (int64_t n : {1, 2, 7, 16, 97, 100}) {
    check_round_trip<float>(1, 1, n, 3, false);
    check_round_trip<double>(1, 1, n, 2, false);
  }
}

TEST(RealFft, TwoDimensionalMatchesDirectDft) {
  for (auto [n0, n1] : {std::pair<int64_t, int64_t>{1, 8}, {7, 11}, {4, 4}, {6, 5}}) {
    check_round_trip<float>(2, n0, n1, 2, false);
    check_round_trip<double>(2, n0, n1, 1, false);
  }
}

TEST(RealFft, MisalignedPointersUseUnalignedPlans) {
  check_round_trip<float>(1, 1, 64, 4, true);
  check_round_trip<double>(2, 5, 6, 2, true);
}

TEST(RealFft, StridedColumnsLayout) {
  // Transform 3 interleaved signals of length 10: element i of signal c at i * 3 + c.
  RealFftLayout layout{.rank = 1, .n0 = 10, .batch = 3, .real_stride = 3, .real_distance = 1,
                       .complex_stride = 3, .complex_distance = 1};
  std::vector<double> x = testing::random_vector<double>(30, 3);
  std::vector<std::complex<double>> spectrum(18);
  RealFftPlan<double>::get(layout).forward(x.data(), spectrum.data());
  for (int c = 0; c < 3; ++c) {
    std::vector<double> signal(10);
    for (int i = 0; i < 10; ++i) signal[i] = x[i * 3 + c];
    const auto expected = direct_rfft(signal.data(), 1, 10);
    for (int k = 0; k < 6; ++k) EXPECT_NEAR(std::abs(spectrum[k * 3 + c] - expected[k]), 0, 1e-12);
  }
}

TEST(RealFft, CacheReturnsTheSamePlanAndRejectsBadLayouts) {
  RealFftLayout layout{.rank = 1, .n0 = 12, .batch = 2};
  EXPECT_EQ(&RealFftPlan<float>::get(layout).layout(), &RealFftPlan<float>::get(layout).layout());
  EXPECT_THROW(RealFftPlan<float>::get(RealFftLayout{.rank = 3}), Error);
  EXPECT_THROW(RealFftPlan<float>::get(RealFftLayout{.rank = 1, .n0 = 0}), Error);
}

// Direct DFT of one complex 2D signal [n0, n1] (n0 = 1 for 1D) with sign -1 (forward) or +1.
std::vector<std::complex<double>> direct_dft(const std::complex<double>* x, int64_t n0,
                                             int64_t n1, int sign) {
  std::vector<std::complex<double>> out(n0 * n1);
  for (int64_t k0 = 0; k0 < n0; ++k0)
    for (int64_t k1 = 0; k1 < n1; ++k1) {
      std::complex<double> sum = 0;
      for (int64_t i = 0; i < n0; ++i)
        for (int64_t j = 0; j < n1; ++j) {
          const double angle = sign * 2 * std::numbers::pi *
                               (static_cast<double>(k0 * i % n0) / n0 +
                                static_cast<double>(k1 * j % n1) / n1);
          sum += x[i * n1 + j] * std::polar(1.0, angle);
        }
      out[k0 * n1 + k1] = sum;
    }
  return out;
}

// Forward and inverse of `batch` signals (distance = size + gap elements apart) against the
// direct DFT, in place or not, optionally one element off alignment.
template <typename T>
void check_complex(int rank, int64_t n0, int64_t n1, int64_t batch, int64_t gap, bool in_place,
                   bool misalign) {
  ComplexFftLayout layout{.rank = rank, .n0 = rank == 1 ? n1 : n0, .n1 = rank == 1 ? 1 : n1,
                          .batch = batch, .distance = n0 * n1 + gap, .in_place = in_place};
  const int64_t size = n0 * n1, distance = size + gap, total = batch * distance;
  const std::vector<double> re = testing::random_vector<double>(total, 11 + size);
  const std::vector<double> im = testing::random_vector<double>(total, 13 + size);
  std::vector<std::complex<double>> x(total);
  for (int64_t i = 0; i < total; ++i) x[i] = {re[i], im[i]};
  const int64_t offset = misalign ? 1 : 0;
  std::vector<std::complex<T>> a(total + 1), b(total + 1);
  std::complex<T>* in = a.data() + offset;
  std::complex<T>* out = in_place ? in : b.data() + offset;
  for (int64_t i = 0; i < total; ++i) in[i] = std::complex<T>(x[i]);

  const ComplexFftPlan<T> plan = ComplexFftPlan<T>::get(layout);
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  const double tolerance = 8 * eps * std::log2(2.0 * size) * std::sqrt(2.0 * size);
  for (int sign : {-1, 1}) {
    if (in_place)
      for (int64_t i = 0; i < total; ++i) in[i] = std::complex<T>(x[i]);
    if (sign < 0)
      plan.forward(in, out);
    else
      plan.inverse(in, out);
    for (int64_t s = 0; s < batch; ++s) {
      const auto expected = direct_dft(x.data() + s * distance, n0, n1, sign);
      for (int64_t i = 0; i < size; ++i) {
        ASSERT_NEAR(std::abs(std::complex<double>(out[s * distance + i]) - expected[i]), 0.0,
                    tolerance)
            << "sign " << sign << " signal " << s << " bin " << i;
        if (!in_place) {  // out of place leaves the input intact
          ASSERT_EQ(in[s * distance + i], std::complex<T>(x[s * distance + i]));
        }
      }
    }
  }
}

TEST(ComplexFft, OneDimensionalMatchesDirectDft) {
  for (int64_t n : {1, 2, 7, 16, 97, 100}) {
    check_complex<float>(1, 1, n, 3, 0, false, false);
    check_complex<double>(1, 1, n, 2, 3, false, false);
    check_complex<double>(1, 1, n, 1, 0, true, false);
  }
}

TEST(ComplexFft, TwoDimensionalMatchesDirectDft) {
  for (auto [n0, n1] : {std::pair<int64_t, int64_t>{1, 8}, {7, 11}, {4, 4}, {6, 5}}) {
    check_complex<float>(2, n0, n1, 2, 1, false, false);
    check_complex<double>(2, n0, n1, 1, 0, true, false);
  }
}

TEST(ComplexFft, MisalignedPointersUseUnalignedPlans) {
  check_complex<float>(1, 1, 64, 3, 0, false, true);
  check_complex<double>(1, 1, 30, 2, 2, true, true);
  check_complex<double>(2, 5, 6, 2, 0, false, true);
}

TEST(ComplexFft, CacheReturnsTheSamePlanAndRejectsBadUse) {
  const ComplexFftLayout layout{.n0 = 12, .batch = 2};
  EXPECT_EQ(&ComplexFftPlan<double>::get(layout).layout(),
            &ComplexFftPlan<double>::get(layout).layout());
  EXPECT_THROW(ComplexFftPlan<float>::get(ComplexFftLayout{.rank = 3}), Error);
  EXPECT_THROW(ComplexFftPlan<float>::get(ComplexFftLayout{.n0 = 0}), Error);
  std::vector<std::complex<double>> x(24);
  EXPECT_THROW(ComplexFftPlan<double>::get(layout).forward(x.data(), x.data()), Error);
}

}  // namespace
}  // namespace subquad
