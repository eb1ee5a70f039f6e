// Building blocks of the FFT path of 2D circulant attention: moving one head's channels
// between the strided [Hg, Wg, H, C] layout and contiguous [C, Hg, Wg] planes (so FFTW runs
// over contiguous data), products of half spectra, and the max-subtracted softmax. Each is
// O(N C) or O(N); the reference they are checked against is circulant2d_ref.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>

#include "subquad/view.h"

namespace subquad::circulant2d_detail {

// x[b, :, :, h, 0:C] -> planes [C, Hg * Wg]. Returns false when a value is not finite.
template <typename T>
bool gather_planes(View5<const T> x, int64_t b, int64_t h, T* planes) {
  const int64_t Hg = x.dim(1), Wg = x.dim(2), C = x.dim(4), N = Hg * Wg;
  T poison = 0;  // x * 0 is 0 for finite x and NaN for inf or NaN
  for (int64_t i = 0; i < Hg; ++i)
    for (int64_t j = 0; j < Wg; ++j) {
      const T* row = x.row(b, i, j, h);  // [C]
      T* column = planes + i * Wg + j;
#pragma omp simd reduction(+ : poison)
      for (int64_t c = 0; c < C; ++c) {
        column[c * N] = row[c];
        poison += row[c] * T(0);
      }
    }
  return poison == T(0);
}

// planes [C, Hg * Wg] -> x[b, :, :, h, 0:C].
template <typename T>
void scatter_planes(const T* planes, int64_t b, int64_t h, View5<T> x) {
  const int64_t Hg = x.dim(1), Wg = x.dim(2), C = x.dim(4), N = Hg * Wg;
  for (int64_t i = 0; i < Hg; ++i)
    for (int64_t j = 0; j < Wg; ++j) {
      T* row = x.row(b, i, j, h);  // [C]
      const T* column = planes + i * Wg + j;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) row[c] = column[c * N];
    }
}

// acc[f] = factor * sum_c conj(a[c, f]) b[c, f] over half spectra a, b [C, F]. Written on
// interleaved (re, im) scalars: std::complex's operator* takes a slow NaN-recovery path.
template <typename T>
void sum_conj_products(const std::complex<T>* a, const std::complex<T>* b, int64_t C,
                       int64_t F, T factor, std::complex<T>* acc) {
  T* out = reinterpret_cast<T*>(acc);
  std::fill(out, out + 2 * F, T(0));
  for (int64_t c = 0; c < C; ++c) {
    const T* x = reinterpret_cast<const T*>(a + c * F);
    const T* y = reinterpret_cast<const T*>(b + c * F);
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      out[2 * f] += x[2 * f] * y[2 * f] + x[2 * f + 1] * y[2 * f + 1];
      out[2 * f + 1] += x[2 * f] * y[2 * f + 1] - x[2 * f + 1] * y[2 * f];
    }
  }
#pragma omp simd
  for (int64_t f = 0; f < 2 * F; ++f) out[f] *= factor;
}

// w[f] = factor * (conjugate ? conj(x[f]) : x[f]).
template <typename T>
void scaled_spectrum(const std::complex<T>* x, int64_t F, T factor, bool conjugate,
                     std::complex<T>* w) {
  const T* in = reinterpret_cast<const T*>(x);
  T* out = reinterpret_cast<T*>(w);
  const T sign = conjugate ? T(-1) : T(1);
#pragma omp simd
  for (int64_t f = 0; f < F; ++f) {
    out[2 * f] = factor * in[2 * f];
    out[2 * f + 1] = sign * factor * in[2 * f + 1];
  }
}

// x[c, f] *= w[f] for every channel c of x [C, F].
template <typename T>
void multiply_channels(std::complex<T>* x, const std::complex<T>* w, int64_t C, int64_t F) {
  const T* y = reinterpret_cast<const T*>(w);
  for (int64_t c = 0; c < C; ++c) {
    T* z = reinterpret_cast<T*>(x + c * F);
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const T re = z[2 * f] * y[2 * f] - z[2 * f + 1] * y[2 * f + 1];
      const T im = z[2 * f] * y[2 * f + 1] + z[2 * f + 1] * y[2 * f];
      z[2 * f] = re;
      z[2 * f + 1] = im;
    }
  }
}

// a [n] <- softmax(a), max-subtracted, normaliser accumulated in double (n reaches 10^4 and
// more). Returns false, leaving `a` unspecified, when a logit is not finite (overflow).
template <typename T>
bool softmax_in_place(T* a, int64_t n) {
  T max = a[0];
  T poison = 0;
  for (int64_t i = 0; i < n; ++i) {
    max = std::max(max, a[i]);
    poison += a[i] * T(0);
  }
  if (poison != T(0)) return false;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    a[i] = std::exp(a[i] - max);
    sum += a[i];
  }
  const T inverse = static_cast<T>(1.0 / sum);  // sum >= 1: the maximum contributes exp(0)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) a[i] *= inverse;
  return true;
}

// <x, y> over n entries, accumulated in double.
template <typename T>
double dot(const T* x, const T* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * y[i];
  return sum;
}

}  // namespace subquad::circulant2d_detail
