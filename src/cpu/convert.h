// Conversions between a kernel's storage type (float, double, bfloat16) and its compute
// type (the same, or float for bfloat16), used while packing tiles and writing results:
// the kernels compute in T and read or write In. bfloat16 -> float is a 16-bit shift;
// float -> bfloat16 rounds to nearest even (subquad/bfloat16.h), both a vector at a time.
// O(n) per row; tested through the bfloat16 tests of the families that use them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/simd.h"
#include "subquad/bfloat16.h"

namespace subquad::cpu {

// The type a kernel computes in for storage type In: float for bfloat16, else In.
template <typename In>
using Compute = Accumulate<In>;

template <typename T, typename In>
inline T to_compute(In x) {
  if constexpr (std::is_same_v<In, bfloat16>)
    return bfloat16::to_float(x.bits);
  else
    return static_cast<T>(x);
}

template <typename Out, typename T>
inline Out from_compute(T x) {
  if constexpr (std::is_same_v<Out, bfloat16>)
    return bfloat16::from_bits(bfloat16::round_bits(static_cast<float>(x)));
  else
    return static_cast<Out>(x);
}

namespace convert_detail {
constexpr int kLanes = Simd<float>::kLanes;
typedef uint16_t Half __attribute__((vector_size(kLanes * 2), aligned(2), may_alias));
typedef uint32_t Wide __attribute__((vector_size(kLanes * 4)));
typedef float FloatVec __attribute__((vector_size(kLanes * 4)));
}  // namespace convert_detail

// dst[i] = scale * src[i] for i < n, in T.
template <typename T, typename In>
inline void widen(const In* src, T* dst, int64_t n, T scale = T(1)) {
  if constexpr (std::is_same_v<In, bfloat16> && std::is_same_v<T, float>) {
    using namespace convert_detail;
    const uint16_t* bits = &src->bits;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const Half half = *reinterpret_cast<const Half*>(bits + i);
      const Wide wide = __builtin_convertvector(half, Wide) << 16;
      Simd<float>::store(dst + i, __builtin_bit_cast(FloatVec, wide) * scale);
    }
    for (; i < n; ++i) dst[i] = scale * bfloat16::to_float(bits[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = scale * to_compute<T>(src[i]);
  }
}

// dst[i] = Out(scale * src[i]) for i < n (bfloat16: rounded to nearest even).
template <typename Out, typename T>
inline void narrow(const T* src, Out* dst, int64_t n, T scale = T(1)) {
  if constexpr (std::is_same_v<Out, bfloat16> && std::is_same_v<T, float>) {
    using namespace convert_detail;
    uint16_t* bits = &dst->bits;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const FloatVec x = Simd<float>::load(src + i) * scale;
      const Wide w = __builtin_bit_cast(Wide, x);
      // As bfloat16::round_bits: NaN keeps its top bits with the quiet bit set; otherwise
      // add 0x7FFF plus the lowest kept bit (ties to even).
      const Wide nan = (w & 0x7FFFFFFFu) > 0x7F800000u;  // all ones where NaN
      const Wide rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
      const Wide quiet = (w >> 16) | 0x0040u;
      const Wide result = (nan & quiet) | (~nan & rounded);
      *reinterpret_cast<Half*>(bits + i) = __builtin_convertvector(result, Half);
    }
    for (; i < n; ++i) bits[i] = bfloat16::round_bits(scale * src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = from_compute<Out>(scale * src[i]);
  }
}

}  // namespace subquad::cpu
