// Building blocks of the FFT path of 2D circulant attention: moving one head's channels
// between the strided [Hg, Wg, H, C] layout and contiguous [C, Hg, Wg] planes (so FFTW runs
// over contiguous data), products of half spectra, and the max-subtracted softmax. Each is
// O(N C) or O(N); the reference they are checked against is circulant2d_ref.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "common/transpose.h"
#include "subquad/view.h"

namespace subquad::circulant2d_detail {

// Tokens moved per block and channels per pass: the block's rows of x stay in L1 while
// each plane receives one contiguous run, instead of C scattered stores (each to a
// different page) per token.
inline constexpr int64_t kTokenBlock = 32;
inline constexpr int64_t kChannelBlock = 64;

// 0 when x[0:n] is finite, NaN otherwise (x * 0 is 0 for finite x, NaN for inf or NaN).
template <typename T>
T poison_of(const T* x, int64_t n) {
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t i = 0; i < n; ++i) poison += x[i] * T(0);
  return poison;
}

// Row pointers x[b, n / Wg, n % Wg, h, :] for the tokens n of [first, first + count).
template <typename T>
void token_rows(View5<T> x, int64_t b, int64_t h, int64_t first, int64_t count, T** rows) {
  const int64_t Wg = x.dim(2);
  for (int64_t t = 0; t < count; ++t) rows[t] = x.row(b, (first + t) / Wg, (first + t) % Wg, h);
}

// x[b, :, :, h, 0:C] -> planes [C, Hg * Wg]. Returns false when a value is not finite.
template <typename T>
bool gather_planes(View5<const T> x, int64_t b, int64_t h, T* planes) {
  const int64_t C = x.dim(4), N = x.dim(1) * x.dim(2);
  const T* rows[kTokenBlock];
  T* columns[kChannelBlock];
  T poison = 0;
  for (int64_t first = 0; first < N; first += kTokenBlock) {
    const int64_t count = std::min(kTokenBlock, N - first);
    token_rows(x, b, h, first, count, rows);
    for (int64_t t = 0; t < count; ++t) poison += poison_of(rows[t], C);
    for (int64_t c0 = 0; c0 < C; c0 += kChannelBlock) {
      const int64_t channels = std::min(kChannelBlock, C - c0);
      for (int64_t c = 0; c < channels; ++c) columns[c] = planes + (c0 + c) * N + first;
      if (c0 > 0)
        for (int64_t t = 0; t < count; ++t) rows[t] += kChannelBlock;
      transpose_block(rows, columns, count, channels);
    }
  }
  return poison == T(0);
}

// planes [C, Hg * Wg] -> x[b, :, :, h, 0:C].
template <typename T>
void scatter_planes(const T* planes, int64_t b, int64_t h, View5<T> x) {
  const int64_t C = x.dim(4), N = x.dim(1) * x.dim(2);
  T* rows[kTokenBlock];
  const T* columns[kChannelBlock];
  for (int64_t first = 0; first < N; first += kTokenBlock) {
    const int64_t count = std::min(kTokenBlock, N - first);
    token_rows(x, b, h, first, count, rows);
    for (int64_t c0 = 0; c0 < C; c0 += kChannelBlock) {
      const int64_t channels = std::min(kChannelBlock, C - c0);
      for (int64_t c = 0; c < channels; ++c) columns[c] = planes + (c0 + c) * N + first;
      if (c0 > 0)
        for (int64_t t = 0; t < count; ++t) rows[t] += kChannelBlock;
      transpose_block(columns, rows, channels, count);
    }
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
