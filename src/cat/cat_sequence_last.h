// Non-causal CAT on sequence-last memory: v, out (and dout, dv) [B, N, H, Dv] views whose
// sequence axis is the contiguous one, e.g. [B, H, Dv, N] arrays seen through a permutation.
// Each value column is then a contiguous row: no gather or scatter of [N, Dv] tiles, only
// two rows interleaved into one cache-resident complex row per column pair (and back). Layout
// rules and boundary checks here; kernels in cat_sequence_last.cpp.
#pragma once

#include <cstdint>

#include "cat/cat_common.h"
#include "cat/cat_ops.h"
#include "subquad/view.h"

namespace subquad::cat_detail {

// The last axis contiguous: the layout of cat.cpp's gather/scatter path.
template <typename T, int Rank>
bool last_axis_contiguous(const View<T, Rank>& view) {
  return view.shape[Rank - 1] <= 1 || view.strides[Rank - 1] == 1;
}

// The sequence axis (dimension 1) contiguous.
template <typename T, int Rank>
bool sequence_contiguous(const View<T, Rank>& view) {
  return view.shape[1] <= 1 || view.strides[1] == 1;
}

// A CAT argument at the boundary: usable, with its last axis or its sequence axis contiguous
// (check_view_contiguous_in names the rule when neither is).
template <typename T, int Rank>
void check_cat_view(const View<T, Rank>& view, const char* name) {
  if (!last_axis_contiguous(view) && sequence_contiguous(view))
    check_view_contiguous_in(view, 1, name);
  else if (!last_axis_contiguous(view))
    throw_error(name, ": the last dimension (stride ", view.strides[Rank - 1],
                ") or the sequence dimension 1 (stride ", view.strides[1],
                ") must be contiguous (stride 1)");
  else
    check_view(view, name);
}

// The non-causal operators' boundary checks: every view in either layout, shapes consistent.
template <typename T>
void check_cat_forward_views(View3<const T> z, View4<const T> v, View4<T> out) {
  check_cat_view(z, "z");
  check_cat_view(v, "v");
  check_scores_match_values(z, v);
  check_cat_view(out, "out");
  expect_shape(out, v.shape, "out");
}

template <typename T>
void check_cat_backward_views(View3<const T> z, View4<const T> v, View4<const T> dout, View3<T> dz,
                              View4<T> dv) {
  check_cat_view(z, "z");
  check_cat_view(v, "v");
  check_scores_match_values(z, v);
  check_cat_view(dout, "dout");
  expect_shape(dout, v.shape, "dout");
  check_cat_view(dz, "dz");
  expect_shape(dz, z.shape, "dz");
  check_cat_view(dv, "dv");
  expect_shape(dv, v.shape, "dv");
}

}  // namespace subquad::cat_detail

namespace subquad::cpu {

// The kernels of the sequence-last layout; cat.cpp's run overloads call them when a value
// view (v, out; v, dout, dv) does not have its last axis contiguous. A view among them that
// is in the other layout is read or written by the same loops, strided (correct, not fast).
template <typename T>
void run_sequence_last(const Context& context, const cat_detail::CatForwardParams<T>& params);
template <typename T>
void run_sequence_last(const Context& context, const cat_detail::CatBackwardParams<T>& params);

}  // namespace subquad::cpu
