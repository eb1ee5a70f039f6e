// Dtype checks and the execution context of the bindings (arrays.h).
#include "arrays.h"

#include <string>

#include "interrupt.h"

namespace subquad::python {

std::string dtype_name(nb::dlpack::dtype dtype) {
  const std::string bits = std::to_string(int(dtype.bits));
  switch (nb::dlpack::dtype_code(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      return "int" + bits;
    case nb::dlpack::dtype_code::UInt:
      return "uint" + bits;
    case nb::dlpack::dtype_code::Float:
      return "float" + bits;
    case nb::dlpack::dtype_code::Complex:
      return "complex" + bits;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    case nb::dlpack::dtype_code::Bfloat:
      return "bfloat" + bits;
    default:
      return "an unsupported " + bits + "-bit type";
  }
}

Scalar common_scalar(std::span<const Named> arrays) {
  const Named* first = nullptr;
  Scalar scalar = Scalar::f32;
  for (const Named& named : arrays) {
    Scalar this_scalar;
    if (named.array.dtype() == nb::dtype<float>()) {
      this_scalar = Scalar::f32;
    } else if (named.array.dtype() == nb::dtype<double>()) {
      this_scalar = Scalar::f64;
    } else {
      throw_error(named.name, ": expected dtype float32 or float64, got ",
                  dtype_name(named.array.dtype()));
    }
    if (first == nullptr) {
      first = &named;
      scalar = this_scalar;
    }
    check(this_scalar == scalar, named.name, ": expected dtype ",
          scalar == Scalar::f32 ? "float32" : "float64", " like ", first->name, ", got ",
          this_scalar == Scalar::f32 ? "float32" : "float64");
  }
  return scalar;
}

Context context_for(int64_t threads) {
  Context context;
  context.threads = check_threads(threads, "threads");
  context.workspace = current_workspace();
  context.interrupt = interrupt_for_call();
  return context;
}

}  // namespace subquad::python
