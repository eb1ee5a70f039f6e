// bfloat16 storage: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 fraction
// bits). A storage type only: kernels convert to float32, compute there and round back.
// float -> bfloat16 rounds to nearest, ties to even; NaN stays a (quiet) NaN, +-inf stays
// +-inf, and finite values beyond the largest bfloat16 round to +-inf as IEEE rounding does.
// bfloat16 -> float is exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace subquad {

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  // Rounds to nearest even (see above).
  explicit bfloat16(float value) : bits(round_bits(value)) {}
  explicit operator float() const { return to_float(bits); }

  static bfloat16 from_bits(uint16_t bits) {
    bfloat16 value;
    value.bits = bits;
    return value;
  }
  static float to_float(uint16_t bits) {
    const uint32_t wide = uint32_t(bits) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    return value;
  }
  static uint16_t round_bits(float value) {
    uint32_t wide;
    std::memcpy(&wide, &value, sizeof(wide));
    // NaN: keep sign and payload's top bits, force the quiet bit (rounding could carry a
    // NaN with a low payload into inf).
    if ((wide & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((wide >> 16) | 0x0040u);
    // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; a carry
    // into the exponent is the correct rounding up (to inf beyond the largest finite).
    wide += 0x7FFFu + ((wide >> 16) & 1u);
    return uint16_t(wide >> 16);
  }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 is 16 bits, so arrays of it are packed");

// The type kernels compute in, and keep statistics such as lse in, for storage type T:
// float for bfloat16, T itself for float and double.
template <typename T>
using Accumulate = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

}  // namespace subquad
