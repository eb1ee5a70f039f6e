// Portable SIMD vectors (GCC vector extensions) for the exact-attention kernels: the
// width follows the target ISA (64 bytes with AVX-512, 32 with AVX2, else 16), so one
// code path serves native and portable builds. exp2 is a polynomial (see README.md);
// with AVX-512 its 2^n step is one vscalef instruction.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace subquad::cpu {

#if defined(__AVX512F__)
inline constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
inline constexpr int kVectorBytes = 32;
#else
inline constexpr int kVectorBytes = 16;
#endif

// The unsigned integer of the same width as T, for building 2^n from exponent bits.
template <typename T> struct BitsOf;
template <> struct BitsOf<float> { using type = uint32_t; };
template <> struct BitsOf<double> { using type = uint64_t; };

template <typename T>
struct Simd {
  static constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(T));
  using Bits = typename BitsOf<T>::type;
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  typedef Bits BitsVec __attribute__((vector_size(kVectorBytes)));
  typedef std::make_signed_t<Bits> IntVec __attribute__((vector_size(kVectorBytes)));

  // Unaligned, aliasing access (memcpy of a vector makes GCC 12 bounce stores through
  // the stack).
  typedef T UnalignedVec
      __attribute__((vector_size(kVectorBytes), aligned(alignof(T)), may_alias));
  static Vec load(const T* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
  static void store(T* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }
  // A shuffle of lane 0 (one vbroadcast), not Vec{} + x: adding +0 is no identity (-0).
  static Vec splat(T x) { return __builtin_shuffle(Vec{x}, IntVec{}); }
  // Horizontal reductions as a tree of lane rotations: log2(lanes) dependent steps.
  template <int By>
  static Vec rotate(Vec v) {
    return [&]<int... I>(std::integer_sequence<int, I...>) {
      return __builtin_shuffle(v, IntVec{((I + By) % kLanes)...});
    }(std::make_integer_sequence<int, kLanes>{});
  }
  template <int By = kLanes / 2>
  static T reduce_max(Vec v) {
    const Vec w = rotate<By>(v);
    v = w > v ? w : v;
    if constexpr (By > 1) return reduce_max<By / 2>(v);
    return v[0];
  }
  template <int By = kLanes / 2>
  static T reduce_sum(Vec v) {
    v += rotate<By>(v);
    if constexpr (By > 1) return reduce_sum<By / 2>(v);
    return v[0];
  }

  // Taylor degree of 2^f = e^(f ln 2), |f| <= 1/2: (ln(2) / 2)^(d+1) / (d+1)! < ulp / 2.
  static constexpr int kDegree = sizeof(T) == 4 ? 7 : 13;
  // The Taylor coefficient of f^k: ln(2)^k / k!.
  static constexpr T coefficient(int k) {
    double c = 1.0;
    for (int i = 1; i <= k; ++i) c *= 0.6931471805599453094 / i;
    return static_cast<T>(c);
  }
  static Vec poly(Vec f) {
    Vec p = splat(coefficient(kDegree));
    for (int k = kDegree - 1; k >= 0; --k) p = p * f + coefficient(k);
    return p;
  }

  // 2^x for the softmax's x <= 0: x = n + f with n = round(x), 2^f by poly, times 2^n.
  // x below the smallest normal power (-inf included) gives exactly 0; NaN stays NaN.
  // x > 0 gives 1: callers pass s c - max with s c contracted into one multiply-add, whose
  // result at the maximum is the rounding error of max (up to an ulp of huge scores, which
  // would overflow 2^x); the weights are <= 1 by construction.
  static Vec exp2(Vec x) {
#if defined(__AVX512F__)
    // vscalefps/pd multiplies by 2^n with IEEE over/underflow: 4 operations besides poly.
    // The masked forms (all lanes) avoid GCC 12's false -Wmaybe-uninitialized on the
    // unmasked intrinsics' undefined pass-through operand.
    constexpr int rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if constexpr (sizeof(T) == 4) {
      constexpr __mmask16 all = 0xFFFF;
      // max(lo, NaN) is NaN; 2^-160 underflows to exactly 0.
      x = _mm512_mask_max_ps(x, all, _mm512_set1_ps(-160.0f), x);
      x = _mm512_mask_min_ps(x, all, _mm512_setzero_ps(), x);  // min(0, NaN) is NaN
      const Vec n = _mm512_mask_roundscale_ps(x, all, x, rounding);
      const Vec p = poly(x - n);
      return _mm512_mask_scalef_ps(p, all, p, n);
    } else {
      constexpr __mmask8 all = 0xFF;
      x = _mm512_mask_max_pd(x, all, _mm512_set1_pd(-1100.0), x);
      x = _mm512_mask_min_pd(x, all, _mm512_setzero_pd(), x);
      const Vec n = _mm512_mask_roundscale_pd(x, all, x, rounding);
      const Vec p = poly(x - n);
      return _mm512_mask_scalef_pd(p, all, p, n);
    }
#else
    constexpr int mantissa_bits = std::numeric_limits<T>::digits - 1;
    constexpr int bias = std::numeric_limits<T>::max_exponent - 1;
    const T lowest = -static_cast<T>(bias);  // gives exponent bits 0: exactly 0
    const T highest = 0;
    // Adding then subtracting 1.5 * 2^mantissa_bits rounds to the nearest integer.
    const T round_magic = static_cast<T>(1.5) * static_cast<T>(Bits(1) << mantissa_bits);
    x = x < lowest ? splat(lowest) : x;  // written so that a NaN x passes through
    x = x > highest ? splat(highest) : x;
    const Vec n = (x + round_magic) - round_magic;
    const Vec p = poly(x - n);
    // n is integral in [-bias, bias]; NaN lanes convert 0 instead (p is NaN there anyway).
    const IntVec exponent = __builtin_convertvector(n == n ? n : splat(T(0)), IntVec) + bias;
    const BitsVec bits = reinterpret_cast<const BitsVec&>(exponent) << mantissa_bits;
    Vec power;
    std::memcpy(&power, &bits, sizeof(Vec));
    return p * power;
#endif
  }
};

}  // namespace subquad::cpu
