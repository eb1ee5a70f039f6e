// bfloat16 arrays at the Python boundary. NumPy has no bfloat16, so bfloat16 inputs come
// through DLPack (torch.bfloat16 tensors, read in place like every input) and bfloat16
// outputs leave as nanobind ndarrays that export DLPack only (torch.from_dlpack turns them
// into torch.bfloat16 tensors without a copy).
#pragma once

#include <initializer_list>

#include "arrays.h"
#include "subquad/bfloat16.h"

namespace subquad::python {

inline bool is_bfloat16(const Array& array) { return array.dtype() == dtype_of<bfloat16>(); }

// True when the first array is bfloat16; then every array must be (an Error names the
// first that is not). False when the first is not: the float32/float64 path checks the rest.
bool all_bfloat16(std::initializer_list<Named> arrays);

// The array `array` must be float32 (lse and dlse of a bfloat16 call); Error otherwise.
void check_float32(const Array& array, const char* name, const char* why);

// A new bfloat16 output (Output: a DLPack ndarray, or an outputs_from allocator's tensor).
template <int Rank>
using Bf16Output = Output<bfloat16, Rank>;

}  // namespace subquad::python
