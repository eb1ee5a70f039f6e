// ColumnFft against FFTW in float64 (every power of two it serves, 1 .. 65536) and a direct
// float64 DFT (every bin up to n = 256, sampled bins above): forward, inverse and the filtered
// convolution, with odd and prime column counts (partial groups), row strides wider than the
// columns (the padding must stay untouched) and in place. Tolerances in units of float32 eps:
// a radix-2/4 FFT's error grows as eps log2 n relative to the spectrum's rms.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "common/fft.h"
#include "common/fft_columns.h"
#include "common/test_support.h"
#include "subquad/error.h"

namespace subquad {
namespace {

using Complex = std::complex<double>;
constexpr double kEps32 = 1.1920929e-07;
constexpr float kPadding = 12345.0f;  // what the padding columns hold, before and after

// Signals as ColumnFft packs them: group g's signal j = col(16g + j) + i col(16g + 8 + j),
// missing columns zero. Returns [signals][n].
std::vector<std::vector<Complex>> packed_signals(const std::vector<float>& x, int64_t n,
                                                 int64_t stride, int64_t columns) {
  const int64_t groups = (columns + kColumnGroup - 1) / kColumnGroup;
  std::vector<std::vector<Complex>> signals(groups * kColumnLanes, std::vector<Complex>(n));
  for (int64_t g = 0; g < groups; ++g)
    for (int j = 0; j < kColumnLanes; ++j) {
      const int64_t re = g * kColumnGroup + j, im = re + kColumnLanes;
      for (int64_t t = 0; t < n; ++t)
        signals[g * kColumnLanes + j][t] = {re < columns ? x[t * stride + re] : 0.0,
                                            im < columns ? x[t * stride + im] : 0.0};
    }
  return signals;
}

// FFTW float64, forward (sign -1) or inverse (+1), unnormalised.
std::vector<Complex> fftw(std::vector<Complex> x, bool forward) {
  ComplexFftLayout layout;
  layout.n0 = static_cast<int64_t>(x.size());
  const ComplexFftPlan<double> plan = ComplexFftPlan<double>::get(layout);
  std::vector<Complex> out(x.size());
  if (forward)
    plan.forward(x.data(), out.data());
  else
    plan.inverse(x.data(), out.data());
  return out;
}

Complex direct_bin(const std::vector<Complex>& x, int64_t k) {
  const int64_t n = static_cast<int64_t>(x.size());
  Complex sum = 0;
  for (int64_t t = 0; t < n; ++t)
    sum += x[t] * std::polar(1.0, -2 * std::numbers::pi * static_cast<double>(t * k % n) / n);
  return sum;
}

double rms(const std::vector<std::vector<Complex>>& signals) {
  double sum = 0;
  int64_t count = 0;
  for (const auto& s : signals)
    for (Complex v : s) sum += std::norm(v), ++count;
  return std::sqrt(sum / count);
}

double tolerance(int64_t n, double scale) {
  return 3 * kEps32 * std::max(1.0, std::log2(double(n))) * scale;
}

std::vector<float> random_rows(int64_t n, int64_t stride, int64_t columns, uint64_t seed) {
  std::vector<float> x = testing::random_vector<float>(n * stride, seed);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = columns; c < stride; ++c) x[t * stride + c] = kPadding;
  return x;
}

void expect_padding_kept(const std::vector<float>& x, int64_t n, int64_t stride, int64_t columns) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = columns; c < stride; ++c) ASSERT_EQ(x[t * stride + c], kPadding);
}

void check_forward_and_inverse(int64_t n, int64_t columns) {
  SCOPED_TRACE(::testing::Message() << "n = " << n << ", columns = " << columns);
  const ColumnFft& plan = ColumnFft::get(n);
  const int64_t groups = (columns + kColumnGroup - 1) / kColumnGroup;
  const int64_t stride = columns + 3, spectrum_stride = groups * kColumnGroup + 5;
  const std::vector<float> x = random_rows(n, stride, columns, 11 + n + columns);
  std::vector<float> spectrum(n * spectrum_stride, kPadding);
  std::vector<float> scratch(plan.scratch_floats());
  plan.forward(x.data(), stride, columns, spectrum.data(), spectrum_stride, scratch.data());
  expect_padding_kept(spectrum, n, spectrum_stride, groups * kColumnGroup);

  const auto signals = packed_signals(x, n, stride, columns);
  std::vector<std::vector<Complex>> expected;
  for (const auto& s : signals) expected.push_back(fftw(s, true));
  const double forward_tolerance = tolerance(n, rms(expected));
  double worst = 0;
  for (size_t s = 0; s < signals.size(); ++s) {
    const int64_t g = s / kColumnLanes, j = s % kColumnLanes;
    for (int64_t k = 0; k < n; ++k) {
      const float* row = spectrum.data() + k * spectrum_stride + g * kColumnGroup;
      const Complex got(row[j], row[j + kColumnLanes]);
      worst = std::max(worst, std::abs(got - expected[s][k]));
    }
    // FFTW itself against the direct DFT: every bin while that is cheap, else a sample.
    const int64_t step = n <= 256 ? 1 : n / 8 + 1;
    for (int64_t k = 0; k < n; k += step)
      ASSERT_LT(std::abs(direct_bin(signals[s], k) - expected[s][k]), 1e-9 * n);
  }
  EXPECT_LE(worst, forward_tolerance) << "forward";
  EXPECT_GT(rms(expected), 0.0);

  // Inverse of our forward: n x back, and the inverse of an arbitrary packed spectrum against
  // FFTW's (real parts to the first column of each pair, imaginary parts to the second).
  std::vector<float> back(n * stride, kPadding);
  plan.inverse(spectrum.data(), spectrum_stride, columns, back.data(), stride, scratch.data());
  expect_padding_kept(back, n, stride, columns);
  const double round_trip_tolerance = 2 * tolerance(n, 1.0);  // x is uniform in [-1, 1)
  double round_trip = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < columns; ++c)
      round_trip = std::max(round_trip, std::abs(back[t * stride + c] / double(n) - x[t * stride + c]));
  EXPECT_LE(round_trip, round_trip_tolerance) << "inverse(forward(x)) / n";

  const std::vector<float> random_spectrum =
      random_rows(n, spectrum_stride, groups * kColumnGroup, 29 + n);
  std::vector<float> out(n * stride, kPadding);
  plan.inverse(random_spectrum.data(), spectrum_stride, columns, out.data(), stride,
               scratch.data());
  const auto spectra = packed_signals(random_spectrum, n, spectrum_stride, groups * kColumnGroup);
  const double inverse_tolerance = tolerance(n, std::sqrt(double(n)) * rms(spectra));
  double inverse_worst = 0;
  for (size_t s = 0; s < spectra.size(); ++s) {
    const std::vector<Complex> y = fftw(spectra[s], false);
    const int64_t re = (s / kColumnLanes) * kColumnGroup + s % kColumnLanes, im = re + kColumnLanes;
    for (int64_t t = 0; t < n; ++t) {
      if (re < columns) inverse_worst = std::max(inverse_worst, std::abs(out[t * stride + re] - y[t].real()));
      if (im < columns) inverse_worst = std::max(inverse_worst, std::abs(out[t * stride + im] - y[t].imag()));
    }
  }
  EXPECT_LE(inverse_worst, inverse_tolerance) << "inverse";
  expect_padding_kept(out, n, stride, columns);
}

// Circular convolution of every column with a real signal h: the filter is fft(h) / n.
void check_filter(int64_t n, int64_t columns, bool in_place) {
  SCOPED_TRACE(::testing::Message() << "n = " << n << ", columns = " << columns
                                    << (in_place ? ", in place" : ""));
  const ColumnFft& plan = ColumnFft::get(n);
  const int64_t stride = columns + 2;
  const std::vector<float> x = random_rows(n, stride, columns, 5 + n + columns);
  const std::vector<double> h = testing::random_vector<double>(n, 3 + n, 0.0, 1.0);
  const std::vector<Complex> spectrum = fftw(std::vector<Complex>(h.begin(), h.end()), true);
  std::vector<std::complex<float>> filter(n);
  for (int64_t k = 0; k < n; ++k) filter[k] = std::complex<float>(spectrum[k] / double(n));
  std::vector<float> scratch(plan.scratch_floats());
  std::vector<float> out = in_place ? x : std::vector<float>(n * stride, kPadding);
  plan.filter(in_place ? out.data() : x.data(), stride, columns, filter.data(), out.data(), stride,
              scratch.data());
  expect_padding_kept(out, n, stride, columns);

  double worst = 0, scale = 0;
  for (int64_t c = 0; c < columns; ++c) {
    std::vector<Complex> column(n);
    for (int64_t t = 0; t < n; ++t) column[t] = x[t * stride + c];
    std::vector<Complex> product = fftw(column, true);
    for (int64_t k = 0; k < n; ++k) product[k] *= spectrum[k] / double(n);
    const std::vector<Complex> expected = fftw(product, false);
    for (int64_t t = 0; t < n; ++t) {
      worst = std::max(worst, std::abs(out[t * stride + c] - expected[t].real()));
      scale = std::max(scale, std::abs(expected[t].real()));
    }
  }
  EXPECT_GT(scale, 0.0);
  // Two transforms and a product; the output's scale is sum(h) |x| ~ n / 2 at most.
  double h_sum = 0;
  for (double v : h) h_sum += v;
  EXPECT_LE(worst, 3 * tolerance(n, h_sum / std::sqrt(double(n)) + scale));
}

TEST(ColumnFft, ForwardAndInverseMatchFftwOnEveryLength) {
  for (int64_t n = 1; n <= 65536; n *= 2)
    for (int64_t columns : n <= 4096 ? std::vector<int64_t>{1, 7, 16, 37}
                                      : std::vector<int64_t>{13, 32})
      check_forward_and_inverse(n, columns);
}

TEST(ColumnFft, FilterIsTheCircularConvolution) {
  for (int64_t n = 1; n <= 65536; n *= 4)
    for (int64_t columns : n <= 4096 ? std::vector<int64_t>{3, 16, 17} : std::vector<int64_t>{19})
      check_filter(n, columns, false);
  check_filter(2048, 29, true);  // four-step, in place
  check_filter(512, 16, true);   // direct, in place
}

TEST(ColumnFft, RejectsLengthsItDoesNotServe) {
  for (int64_t n : {0, 3, 96, 1000}) EXPECT_THROW(ColumnFft::get(n), Error) << n;
}

TEST(ColumnFft, SameInputGivesBitIdenticalOutput) {
  const int64_t n = 4096, columns = 21;
  const ColumnFft& plan = ColumnFft::get(n);
  const std::vector<float> x = random_rows(n, columns, columns, 99);
  std::vector<float> scratch(plan.scratch_floats());
  std::vector<float> a(n * 2 * kColumnGroup), b(a.size());
  plan.forward(x.data(), columns, columns, a.data(), 2 * kColumnGroup, scratch.data());
  plan.forward(x.data(), columns, columns, b.data(), 2 * kColumnGroup, scratch.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace subquad
