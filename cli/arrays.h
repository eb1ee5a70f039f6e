// Glue between .npy arrays and library views for the CLI's methods: rank-checked views,
// the precision rule (float64 when every input is float64, else float32), output arrays, and
// the inputs and outputs shared by the attention operators with an lse.
#pragma once

#include <array>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/npy.h"
#include "subquad/checked_size.h"
#include "subquad/error.h"
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

// outputs[name]: a zero-filled output array of precision T and the given shape, and a view
// into it. `name` is the option the array is written to ("out", "lse", ...): a shape too
// large to allocate is an OutOfMemory naming it.
template <typename T, int Rank>
View<T, Rank> output_view(std::map<std::string, NpyArray>& outputs, const std::string& name,
                          const std::array<int64_t, Rank>& shape) {
  NpyArray& array = outputs[name];
  array.dtype = dtype_of<T>();
  array.shape.assign(shape.begin(), shape.end());
  const std::string what = "the output --" + name + " of shape " + shape_string(shape);
  const size_t bytes = checked_bytes(checked_product(shape, what.c_str()), sizeof(T), what.c_str());
  try {
    array.bytes.assign(bytes, 0);
  } catch (const std::bad_alloc&) {
    throw_out_of_memory(bytes, what);
  } catch (const std::length_error&) {
    throw_out_of_memory(bytes, what);
  }
  return View<T, Rank>(array.data<T>(), shape);
}

// Runs `body.template operator()<T>(arrays converted to T)` in float64 when every input is
// float64, else in float32.
template <typename Body>
std::map<std::string, NpyArray> in_precision(std::vector<NpyArray> arrays, Body&& body) {
  std::vector<const NpyArray*> pointers;
  for (const NpyArray& array : arrays) pointers.push_back(&array);
  if (compute_dtype(pointers) == DType::float64) return body.template operator()<double>(arrays);
  for (NpyArray& array : arrays) array = array.converted(DType::float32);
  return body.template operator()<float>(arrays);
}

// For the attention operators with a log-sum-exp output: qkv = q [B, N, H, D], k, v [B, M,
// Hkv, D | Dv] in precision T; returns "out" [B, N, H, Dv] and "lse" [B, H, N], filled by
// forward(q, k, v, out, lse).
template <typename T, typename Forward>
std::map<std::string, NpyArray> attend_with_lse(const std::vector<NpyArray>& qkv,
                                                Forward&& forward) {
  const View4<const T> q = input_view<T, 4>(qkv[0], "q");
  const View4<const T> k = input_view<T, 4>(qkv[1], "k");
  const View4<const T> v = input_view<T, 4>(qkv[2], "v");
  std::map<std::string, NpyArray> outputs;
  const View4<T> out = output_view<T, 4>(outputs, "out", {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  const View3<T> lse = output_view<T, 3>(outputs, "lse", {q.dim(0), q.dim(2), q.dim(1)});
  forward(q, k, v, out, lse);
  return outputs;
}

}  // namespace subquad::cli
