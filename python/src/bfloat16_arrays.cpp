// Dtype checks of bfloat16 calls (bfloat16_arrays.h).
#include "bfloat16_arrays.h"

namespace subquad::python {

bool all_bfloat16(std::initializer_list<Named> arrays) {
  if (arrays.size() == 0 || !is_bfloat16(arrays.begin()->array)) return false;
  for (const Named& named : arrays)
    check(is_bfloat16(named.array), named.name, ": expected dtype bfloat16 like ",
          arrays.begin()->name, ", got ", dtype_name(named.array.dtype()));
  return true;
}

void check_float32(const Array& array, const char* name, const char* why) {
  check(array.dtype() == nb::dtype<float>(), name, ": expected dtype float32 (", why, "), got ",
        dtype_name(array.dtype()));
}

}  // namespace subquad::python
