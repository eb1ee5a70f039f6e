// The structured family's operators as the backends see them: what the boundary checks
// produce and dispatch (common/dispatch.h) hands to a backend. Shapes and options are
// checked. The CPU backend's run overloads are in mlr_forward.cpp, mlr_backward.cpp,
// bilinear_mlr.cpp, btt.cpp, mlbtc.cpp and mlr_decoder.cpp.
#pragma once

#include <span>
#include <vector>

#include "common/dispatch.h"
#include "subquad/structured.h"

namespace subquad::mlr {

// q [B, N, H, D], k [B, N, Hkv, D], v [B, N, Hkv, Dv] -> out [B, N, H, Dv], lse [B, H, N]
// (may be empty); B N H >= 1.
template <typename T>
struct MlrForwardParams {
  View4<const T> q, k, v;
  const MlrOptions& options;
  View4<T> out;
  View3<T> lse;
};

// The forward's inputs, out, lse and dout [B, N, H, Dv] -> dq [B, N, H, D],
// dk [B, N, Hkv, D], dv [B, N, Hkv, Dv]; B N H >= 1.
template <typename T>
struct MlrBackwardParams {
  View4<const T> q, k, v, out;
  View3<const T> lse;
  View4<const T> dout;
  const MlrOptions& options;
  View4<T> dq, dk, dv;
};

}  // namespace subquad::mlr

namespace subquad::projection {

// x [B, N, Dm], one weight per level -> y [B, N, H, sum_l 2^l r_l].
template <typename T>
struct BilinearForwardParams {
  View3<const T> x;
  const std::vector<View3<const T>>& weights;
  const BilinearMlrOptions& options;
  View4<T> y;
};

// x, weights, dy -> dx [B, N, Dm], dweights (shaped as weights).
template <typename T>
struct BilinearBackwardParams {
  View3<const T> x;
  const std::vector<View3<const T>>& weights;
  View4<const T> dy;
  const BilinearMlrOptions& options;
  View3<T> dx;
  const std::vector<View3<T>>& dweights;
};

// x [B, N, Dm], w1, w2 -> y [B, N, H, D].
template <typename T>
struct BttForwardParams {
  View3<const T> x, w1, w2;
  const BttOptions& options;
  View4<T> y;
};

// x, w1, w2, dy -> dx, dw1, dw2 (shaped as x, w1, w2).
template <typename T>
struct BttBackwardParams {
  View3<const T> x, w1, w2;
  View4<const T> dy;
  const BttOptions& options;
  View3<T> dx, dw1, dw2;
};

}  // namespace subquad::projection

namespace subquad::mlr {

// mlr_decode (checked there): rows t0 .. t0 + T - 1 (t0 = S - T) of B sequences from the
// level caches keys[l] [B, Hkv, block_sizes[l], r_l] (r_l = offsets[l + 1] - offsets[l]) and
// values v [B, S, Hkv, Dv]; q [B, T, H, D] -> out [B, T, H, Dv].
template <typename T>
struct MlrDecodeParams {
  std::span<const View4<const T>> keys;
  const int64_t *offsets, *block_sizes;
  View4<const T> v;
  bool block_divide;
  View4<const T> q;
  View4<T> out;
};

}  // namespace subquad::mlr

namespace subquad::mlbtc {

// MlbtcMap::apply: x [in_dim] -> y [out_dim] through the levels (checked by the map's
// constructor).
struct MlbtcApplyParams {
  const std::vector<MlbtcLevel>* levels;
  int64_t in_dim, out_dim;
  const double* x;
  double* y;
};

}  // namespace subquad::mlbtc

namespace subquad::cpu {

void run(Backend, const Context& context, const mlbtc::MlbtcApplyParams& params);
template <typename T>
void run(Backend, const Context& context, const mlr::MlrDecodeParams<T>& params);

template <typename T>
void run(Backend, const Context& context, const mlr::MlrForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const mlr::MlrBackwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const projection::BilinearForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const projection::BilinearBackwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const projection::BttForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const projection::BttBackwardParams<T>& params);

}  // namespace subquad::cpu
