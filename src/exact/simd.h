// Portable SIMD vectors (GCC vector extensions) for the exact-attention kernels: the
// width follows the target ISA (64 bytes with AVX-512, 32 with AVX2, else 16), so one
// code path serves native and portable builds. exp2 is a polynomial (see README.md).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace subquad::exact_detail {

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

  static Vec load(const T* p) {
    Vec v;
    std::memcpy(&v, p, sizeof(Vec));
    return v;
  }
  static void store(T* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
  // A shuffle of lane 0 (one vbroadcast), not Vec{} + x: adding +0 is no identity (-0).
  static Vec splat(T x) { return __builtin_shuffle(Vec{x}, IntVec{}); }
  static T reduce_max(Vec v) {
    T m = v[0];
    for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
    return m;
  }
  static T reduce_sum(Vec v) {
    T s = v[0];
    for (int i = 1; i < kLanes; ++i) s += v[i];
    return s;
  }

  // Taylor degree of exp2 below: y^(d+1) / (d+1)! < ulp / 2 for |y| <= ln(2) / 2.
  static constexpr int kDegree = sizeof(T) == 4 ? 7 : 13;
  static constexpr T inverse_factorial(int k) {
    double f = 1.0;
    for (int i = 2; i <= k; ++i) f *= i;
    return static_cast<T>(1.0 / f);
  }

  // 2^x for x <= 0 (the softmax's range; larger x is clamped to the largest finite power).
  // x = n + f with n = round(x), |f| <= 1/2; 2^f = e^(f ln 2) by its Taylor series to the
  // degree where the truncation error is below half an ulp of T; 2^n is built in the
  // exponent bits. x <= min_exponent gives exactly 0 (-inf included); NaN stays NaN.
  static Vec exp2(Vec x) {
    constexpr int mantissa_bits = std::numeric_limits<T>::digits - 1;
    constexpr int bias = std::numeric_limits<T>::max_exponent - 1;
    const T lowest = -static_cast<T>(bias);  // gives exponent bits 0: exactly 0
    const T highest = static_cast<T>(bias);
    // Adding then subtracting 1.5 * 2^mantissa_bits rounds to the nearest integer.
    const T round_magic = static_cast<T>(1.5) * static_cast<T>(Bits(1) << mantissa_bits);
    x = x < lowest ? splat(lowest) : x;  // written so that a NaN x passes through
    x = x > highest ? splat(highest) : x;
    const Vec n = (x + round_magic) - round_magic;
    const Vec y = (x - n) * static_cast<T>(0.6931471805599453094);  // |y| <= ln(2) / 2
    Vec p = splat(inverse_factorial(kDegree));
    for (int k = kDegree - 1; k >= 0; --k) p = p * y + inverse_factorial(k);
    // n is integral in [-bias, bias]; NaN lanes convert 0 instead (p is NaN there anyway).
    const IntVec exponent = __builtin_convertvector(n == n ? n : splat(T(0)), IntVec) + bias;
    const BitsVec bits = reinterpret_cast<const BitsVec&>(exponent) << mantissa_bits;
    Vec power;
    std::memcpy(&power, &bits, sizeof(Vec));
    return p * power;
  }
};

}  // namespace subquad::exact_detail
