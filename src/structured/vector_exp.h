// Softmax row helper of the MLR backward: x[i] <- exp(x[i] - shift), returning the row sum.
// float uses an AVX-512 Cephes-style exp (relative error ~2 float ulps, exact 0 for -inf
// inputs) since glibc's vector exp is only reachable under -ffast-math; double (and builds
// without AVX-512) use std::exp. O(n).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace subquad::mlr {

inline double exp_shifted_sum(double* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

#if defined(__AVX512F__)
// The all-lanes mask: the zero-masking forms of the intrinsics below avoid GCC 12's false
// -Wmaybe-uninitialized on the unmasked ones (they start from _mm512_undefined_ps).
inline constexpr __mmask16 kAll = 0xFFFF;

// exp of 16 floats: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-7 polynomial (Cephes
// expf), times 2^n by scalef. Inputs below -104 (exp underflows past the smallest
// denormal) are clamped there so that -inf gives exactly 0 instead of NaN.
inline __m512 exp16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-104.0f);
  const __m512 highest = _mm512_set1_ps(88.7f);
  x = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, x, lowest), highest);
  const __m512 n = _mm512_maskz_roundscale_ps(
      kAll, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}

inline float exp_shifted_sum(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
    _mm512_mask_storeu_ps(x + i, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
}
#else
inline float exp_shifted_sum(float* x, int64_t n, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}
#endif

}  // namespace subquad::mlr
