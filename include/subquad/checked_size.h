// Size arithmetic that never overflows silently: element counts, byte counts and offsets
// of shapes that come from outside (files, Python, the CLI) go through these, so a hostile
// shape such as (999999999999999999, 0, 3) or one whose product exceeds int64 ends in an
// Error naming the argument instead of signed overflow.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "subquad/error.h"

namespace subquad {

// a * b for non-negative a, b; throws Error naming `what` when it does not fit in int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    throw_error(what, ": size product ", a, " * ", b, " overflows int64");
  return product;
}

// a + b for non-negative a, b; throws Error naming `what` when it does not fit in int64.
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    throw_error(what, ": size sum ", a, " + ", b, " overflows int64");
  return sum;
}

// The product of `extents` (any range of integers). A zero extent makes the product zero
// whatever the others are (a zero-volume shape is valid however large its other sides);
// otherwise every partial product must fit in int64.
template <typename Extents>
int64_t checked_product(const Extents& extents, const char* what) {
  for (auto extent : extents)
    if (extent == 0) return 0;
  int64_t product = 1;
  for (auto extent : extents) {
    check(extent >= 0, what, ": negative extent ", static_cast<int64_t>(extent));
    product = checked_mul(product, static_cast<int64_t>(extent), what);
  }
  return product;
}

inline int64_t checked_product(std::initializer_list<int64_t> extents, const char* what) {
  return checked_product<std::initializer_list<int64_t>>(extents, what);
}

// Bytes of `count` elements of `element_size` bytes each, as size_t.
inline size_t checked_bytes(int64_t count, size_t element_size, const char* what) {
  return static_cast<size_t>(checked_mul(count, static_cast<int64_t>(element_size), what));
}

}  // namespace subquad
