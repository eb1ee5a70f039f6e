// Building blocks of the FFT path of 2D circulant attention: moving one head's channels
// between the strided [Hg, Wg, H, C] layout and contiguous planes of channel pairs packed as
// complex values ([C / 2, Hg, Wg], so FFTW runs complex transforms over contiguous data),
// spectral products, and the max-subtracted softmax. Each is O(N C) or O(N); the reference
// they are checked against is circulant2d_ref.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "cpu/column_pairs.h"
#include "subquad/view.h"

namespace subquad::circulant2d_detail {

// Why a head failed; reported after the parallel loop (kernels never throw).
enum class HeadStatus { ok, q_not_finite, k_not_finite, v_not_finite, dout_not_finite,
                        logits_overflow };

// 0 when x[0:n] is finite, NaN otherwise (x * 0 is 0 for finite x, NaN for inf or NaN).
template <typename T>
T poison_of(const T* x, int64_t n) {
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t i = 0; i < n; ++i) poison += x[i] * T(0);
  return poison;
}

// x[b, :, :, h, 0:C] -> planes [(C + 1) / 2, Hg * Wg] of pairs x_c + i x_{c+1} (0 for the
// missing partner of an odd C). Returns false when a value is not finite: checked on the
// planes just written (contiguous and in cache), since the FFT would spread it to every logit.
template <typename T>
bool gather_pair_planes(View5<const T> x, int64_t b, int64_t h, std::complex<T>* planes) {
  const int64_t C = x.dim(4), Wg = x.dim(2), N = x.dim(1) * Wg;
  gather_column_pairs([&](int64_t n) { return x.row(b, n / Wg, n % Wg, h); }, N, C, N, planes);
  return poison_of(reinterpret_cast<const T*>(planes), 2 * ((C + 1) / 2) * N) == T(0);
}

// planes [(C + 1) / 2, Hg * Wg] of pairs -> x[b, :, :, h, 0:C].
template <typename T>
void scatter_pair_planes(const std::complex<T>* planes, int64_t b, int64_t h, View5<T> x) {
  const int64_t C = x.dim(4), Wg = x.dim(2), N = x.dim(1) * Wg;
  scatter_column_pairs(planes, N, N, C, [&](int64_t n) { return x.row(b, n / Wg, n % Wg, h); });
}

// acc[f] = factor * sum_c conj(a[c, f]) b[c, f] over spectra a, b [C, F]. Written on
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
