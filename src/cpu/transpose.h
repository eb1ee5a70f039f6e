// Out-of-place transposes between strided rows, used to move a head's [tokens, channels]
// slice into contiguous per-channel rows (FFTs over contiguous rows are 3-5x faster than
// over strided columns) and back. 8 x 8 float tiles go through AVX registers, 8 x 8 tiles of
// 64-bit elements (a float pair: one complex<float>) through AVX-512 registers, or AVX ones.
// Reference: the scalar loops below, which also handle edges and other types.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#ifdef __AVX__
#include <immintrin.h>
#endif

namespace subquad {

inline constexpr int64_t kTransposeTile = 8;

#ifdef __AVX__
// dst[k][0:8] = scale * (src[0][k], ..., src[7][k]) for k < 8: an 8 x 8 tile in registers.
inline void transpose8x8(const float* const* src, float* const* dst, float scale) {
  const __m256 factor = _mm256_set1_ps(scale);
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(_mm256_loadu_ps(src[i]), factor);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst[i], _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst[i + 4], _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

#ifdef __AVX512F__
// dst[k][0:8] = (src[0][k], ..., src[7][k]) for k < 8 on 64-bit elements: an 8 x 8 tile in
// registers. Untyped pointers: the tile only moves bits (two floats or one double each).
inline void transpose8x8_64bit(const void* const* src, void* const* dst) {
  // a[2i] holds the even columns of rows 2i, 2i + 1, a[2i + 1] the odd ones, as (row 2i,
  // row 2i + 1) pairs (an unpack; written as permutes, as GCC 12 warns that unpack's
  // undefined pass-through operand may be used uninitialised).
  const __m512i even = _mm512_setr_epi64(0, 8, 2, 10, 4, 12, 6, 14);
  const __m512i odd = _mm512_setr_epi64(1, 9, 3, 11, 5, 13, 7, 15);
  __m512d r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_pd(src[i]);
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm512_permutex2var_pd(r[2 * i], even, r[2 * i + 1]);
    a[2 * i + 1] = _mm512_permutex2var_pd(r[2 * i], odd, r[2 * i + 1]);
  }
  // b[4g + j], for rows 4g .. 4g + 3: columns {0, 4}, {2, 6}, {1, 5}, {3, 7} for j = 0 .. 3.
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int g = 0; g < 2; ++g) {
    b[4 * g] = _mm512_permutex2var_pd(a[4 * g], first, a[4 * g + 2]);
    b[4 * g + 1] = _mm512_permutex2var_pd(a[4 * g], second, a[4 * g + 2]);
    b[4 * g + 2] = _mm512_permutex2var_pd(a[4 * g + 1], first, a[4 * g + 3]);
    b[4 * g + 3] = _mm512_permutex2var_pd(a[4 * g + 1], second, a[4 * g + 3]);
  }
  // Rows 0 .. 3 from b[j], rows 4 .. 7 from b[j + 4]: the low halves give column
  // kLowColumn[j], the high halves that column + 4.
  const __m512i low = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11);
  const __m512i high = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
  constexpr int kLowColumn[4] = {0, 2, 1, 3};
  for (int j = 0; j < 4; ++j) {
    _mm512_storeu_pd(dst[kLowColumn[j]], _mm512_permutex2var_pd(b[j], low, b[j + 4]));
    _mm512_storeu_pd(dst[kLowColumn[j] + 4], _mm512_permutex2var_pd(b[j], high, b[j + 4]));
  }
}
#elif defined(__AVX__)
// The same through AVX registers, as four 4 x 4 blocks. Without it an AVX2 machine moved the
// pair tiles element by element: the gather / scatter of CAT's column pairs took 50-64% of the
// forward on Zen 3 (H = 8, Dv = 64; docs/perf/cat.md).
inline void transpose8x8_64bit(const void* const* src, void* const* dst) {
  for (int row0 = 0; row0 < 8; row0 += 4)
    for (int col0 = 0; col0 < 8; col0 += 4) {
      __m256d r[4], t[4];
      for (int i = 0; i < 4; ++i)
        r[i] = _mm256_loadu_pd(static_cast<const double*>(src[row0 + i]) + col0);
      // t[0] = (r0[0], r1[0], r0[2], r1[2]), t[1] = (r0[1], r1[1], r0[3], r1[3]); t[2], t[3]
      // the same for rows 2 and 3.
      t[0] = _mm256_unpacklo_pd(r[0], r[1]);
      t[1] = _mm256_unpackhi_pd(r[0], r[1]);
      t[2] = _mm256_unpacklo_pd(r[2], r[3]);
      t[3] = _mm256_unpackhi_pd(r[2], r[3]);
      double* column[4];
      for (int k = 0; k < 4; ++k) column[k] = static_cast<double*>(dst[col0 + k]) + row0;
      _mm256_storeu_pd(column[0], _mm256_permute2f128_pd(t[0], t[2], 0x20));
      _mm256_storeu_pd(column[1], _mm256_permute2f128_pd(t[1], t[3], 0x20));
      _mm256_storeu_pd(column[2], _mm256_permute2f128_pd(t[0], t[2], 0x31));
      _mm256_storeu_pd(column[3], _mm256_permute2f128_pd(t[1], t[3], 0x31));
    }
}
#endif

// dst[k][r] = scale * src[r][k] for r < rows <= 8, k < cols <= 8.
template <typename S, typename T>
void transpose_tile(const S* const* src, T* const* dst, int64_t rows, int64_t cols, T scale) {
#ifdef __AVX__
  if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {
    if (rows == kTransposeTile && cols == kTransposeTile) return transpose8x8(src, dst, scale);
  }
#endif
  for (int64_t k = 0; k < cols; ++k)
    for (int64_t r = 0; r < rows; ++r) dst[k][r] = scale * static_cast<T>(src[r][k]);
}

}  // namespace subquad
