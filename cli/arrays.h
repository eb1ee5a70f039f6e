// Glue between .npy arrays and library views for the CLI's methods: rank-checked views,
// the precision rule (float64 when every input is float64, else float32) and output arrays.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "subquad/error.h"
#include "subquad/npy.h"
#include "subquad/view.h"

namespace subquad::cli {

// float64 when every array is float64, otherwise float32.
inline DType compute_dtype(const std::vector<const NpyArray*>& arrays) {
  for (const NpyArray* array : arrays)
    if (array->dtype != DType::float64) return DType::float32;
  return DType::float64;
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::float32 : DType::float64;
}

// A read-only view of `array` (already in precision T) as rank `Rank`; `name` is the option.
template <typename T, int Rank>
View<const T, Rank> input_view(const NpyArray& array, const std::string& name) {
  check(array.dtype == dtype_of<T>(), "--", name, ": internal precision mismatch");
  check(array.shape.size() == Rank, "--", name, ": expected a rank-", Rank, " array, got shape ",
        shape_string(array.shape));
  std::array<int64_t, Rank> shape;
  for (int i = 0; i < Rank; ++i) shape[i] = array.shape[i];
  return View<const T, Rank>(array.data<T>(), shape);
}

// A zero-filled output array of precision T and the given shape, and a view into it.
template <typename T, int Rank>
View<T, Rank> output_view(NpyArray& array, const std::array<int64_t, Rank>& shape) {
  array.dtype = dtype_of<T>();
  array.shape.assign(shape.begin(), shape.end());
  array.bytes.assign(array.element_count() * sizeof(T), 0);
  return View<T, Rank>(array.data<T>(), shape);
}

}  // namespace subquad::cli
