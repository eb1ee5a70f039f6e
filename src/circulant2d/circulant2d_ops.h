// The 2D circulant family's operators as the backends see them: what the boundary checks
// (circulant2d.cpp) produce and dispatch (common/dispatch.h) hands to a backend. Shapes are
// checked, B H >= 1, the scale resolved. The CPU backend's run overloads are in
// circulant2d.cpp.
#pragma once

#include "common/dispatch.h"
#include "subquad/circulant2d.h"

namespace subquad::circulant2d_detail {

// q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv], weights
// [B, H, Hg, Wg] (may be empty).
template <typename T>
struct Circulant2dForwardParams {
  View5<const T> q, k, v;
  double scale;
  View5<T> out;
  View4<T> weights;
};

// q, k, v, dout [B, Hg, Wg, H, Dv] -> dq, dk [B, Hg, Wg, H, D], dv [B, Hg, Wg, H, Dv].
template <typename T>
struct Circulant2dBackwardParams {
  View5<const T> q, k, v, dout;
  double scale;
  View5<T> dq, dk, dv;
};

}  // namespace subquad::circulant2d_detail

namespace subquad::cpu {

template <typename T>
void run(Backend, const Context& context,
         const circulant2d_detail::Circulant2dForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context,
         const circulant2d_detail::Circulant2dBackwardParams<T>& params);

}  // namespace subquad::cpu
