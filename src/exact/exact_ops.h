// The exact family's operators as the backends see them: what the boundary checks
// (exact_api.cpp) produce and dispatch (common/dispatch.h) hands to a backend. The CPU backend
// defines run(cpu::Backend, ...) for each in exact_forward.cpp, exact_backward.cpp and
// exact_merge.cpp; a GPU backend defines its own run overloads in its files.
#pragma once

#include <cstdint>

#include "common/dispatch.h"
#include "exact/exact_internal.h"

namespace subquad::exact_detail {

// q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv], lse [B, H, N]
// (lse may be empty). Checked: shapes, options; B N H >= 1.
template <typename T>
struct ExactForwardParams {
  Sizes sizes;
  View4<const T> q, k, v;
  View4<T> out;
  View3<Accumulate<T>> lse;  // float for bfloat16 storage
};

// The forward's inputs and outputs, dout [B, N, H, Dv], dlse [B, H, N] (may be empty)
// -> dq [B, N, H, D], dk [B, M, Hkv, D], dv [B, M, Hkv, Dv].
template <typename T>
struct ExactBackwardParams {
  Sizes sizes;
  View4<const T> q, k, v, out;
  View3<const Accumulate<T>> lse;  // float for bfloat16 storage, as dlse
  View4<const T> dout;
  View3<const Accumulate<T>> dlse;
  View4<T> dq, dk, dv;
};

// out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> out [B, N, H, Dv], lse [B, H, N].
template <typename T>
struct MergeParams {
  int64_t B, N, H, Dv;
  View4<const T> out_a;
  View3<const T> lse_a;
  View4<const T> out_b;
  View3<const T> lse_b;
  View4<T> out;
  View3<T> lse;
};

// The merge's inputs and outputs, dout [B, N, H, Dv] and dlse [B, H, N] (either may be
// empty) -> dout_a, dout_b [B, N, H, Dv], dlse_a, dlse_b [B, H, N].
template <typename T>
struct MergeBackwardParams {
  int64_t B, N, H, Dv;
  View4<const T> out_a;
  View3<const T> lse_a;
  View4<const T> out_b;
  View3<const T> lse_b;
  View4<const T> out;  // the merged result
  View3<const T> lse;
  View4<const T> dout;
  View3<const T> dlse;
  View4<T> dout_a;
  View3<T> dlse_a;
  View4<T> dout_b;
  View3<T> dlse_b;
};

}  // namespace subquad::exact_detail

namespace subquad::cpu {

template <typename T>
void run(Backend, const Context& context, const exact_detail::ExactForwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const exact_detail::ExactBackwardParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const exact_detail::MergeParams<T>& params);
template <typename T>
void run(Backend, const Context& context, const exact_detail::MergeBackwardParams<T>& params);

}  // namespace subquad::cpu
