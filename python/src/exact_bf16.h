// bfloat16 calls of exact attention's bindings (exact.cpp hands them on when q is
// bfloat16): bfloat16 q, k, v, out, dout and gradients, float32 lse and dlse.
#pragma once

#include <optional>

#include "arrays.h"
#include "subquad/exact.h"

namespace subquad::python {

// -> (out [B, N, H, Dv] bfloat16 (DLPack), lse [B, H, N] float32 (NumPy)).
nb::tuple exact_forward_bf16(const Array& q, const Array& k, const Array& v,
                             const ExactOptions& options, const Context& context);

// -> (dq, dk, dv), bfloat16 (DLPack).
nb::tuple exact_backward_bf16(const Array& q, const Array& k, const Array& v, const Array& out,
                              const Array& lse, const Array& dout, const std::optional<Array>& dlse,
                              const ExactOptions& options, const Context& context);

}  // namespace subquad::python
