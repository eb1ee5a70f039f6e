// The exact family's public operators (subquad/exact.h): each checks its arguments once,
// builds the operator's parameters (exact_ops.h) and goes through the one dispatch on
// Context::device (common/dispatch.h). The CPU kernels are exact_forward.cpp,
// exact_backward.cpp and exact_merge.cpp.
#include <algorithm>
#include <array>

#include "exact/exact_ops.h"
#include "subquad/checked_size.h"

namespace subquad {
namespace {

// x[b, j, h, :] = 0 for every row of x [B, M, Hkv, C]; nothing when x has no volume.
template <typename T>
void zero_rows(View4<T> x) {
  if (checked_product({x.shape[0], x.shape[1], x.shape[2], x.shape[3]}, "gradient") == 0) return;
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t j = 0; j < x.shape[1]; ++j)
      for (int64_t h = 0; h < x.shape[2]; ++h) std::fill_n(x.row(b, j, h), x.shape[3], T(0));
}

}  // namespace

template <typename T>
void exact_attention_forward(const Context& context, View4<const T> q, View4<const T> k,
                             View4<const T> v, const ExactOptions& options, View4<T> out,
                             View3<Accumulate<T>> lse) {
  using namespace exact_detail;
  const Sizes s = check_inputs(q, k, v, options);
  check_view(out, "out");
  check_shape(out, {s.B, s.N, s.H, s.Dv}, "out (expected [B, N, H, Dv])");
  if (!lse.empty()) {
    check_view(lse, "lse");
    check_shape(lse, {s.B, s.H, s.N}, "lse (expected [B, H, N])");
  }
  if (checked_product({s.B, s.N, s.H}, "q") == 0) return;
  dispatch(context, ExactForwardParams<T>{s, q, k, v, out, lse});
}

template <typename T>
void exact_attention_backward(const Context& context, View4<const T> q, View4<const T> k,
                              View4<const T> v, View4<const T> out,
                              View3<const Accumulate<T>> lse, View4<const T> dout,
                              View3<const Accumulate<T>> dlse, const ExactOptions& options,
                              View4<T> dq, View4<T> dk, View4<T> dv) {
  using namespace exact_detail;
  const Sizes s = check_inputs(q, k, v, options);
  check_view(out, "out");
  check_shape(out, {s.B, s.N, s.H, s.Dv}, "out (expected [B, N, H, Dv])");
  check_view(dout, "dout");
  check_shape(dout, {s.B, s.N, s.H, s.Dv}, "dout (expected [B, N, H, Dv])");
  check_view(lse, "lse");
  check_shape(lse, {s.B, s.H, s.N}, "lse (expected [B, H, N])");
  if (!dlse.empty()) {
    check_view(dlse, "dlse");
    check_shape(dlse, {s.B, s.H, s.N}, "dlse (expected [B, H, N], the shape of lse)");
  }
  check_view(dq, "dq");
  check_shape(dq, {s.B, s.N, s.H, s.D}, "dq (expected [B, N, H, D])");
  check_view(dk, "dk");
  check_shape(dk, {s.B, s.M, s.Hkv, s.D}, "dk (expected [B, M, Hkv, D])");
  check_view(dv, "dv");
  check_shape(dv, {s.B, s.M, s.Hkv, s.Dv}, "dv (expected [B, M, Hkv, Dv])");
  // No queries: dq is empty and no query reads a key, so dk = dv = 0; return at once however
  // large B is (the kernel's loop over B H heads ran for minutes at B = 1e9, N = M = 0).
  if (checked_product({s.B, s.N, s.H}, "q") == 0) {
    zero_rows(dk);
    zero_rows(dv);
    return;
  }
  dispatch(context, ExactBackwardParams<T>{s, q, k, v, out, lse, dout, dlse, dq, dk, dv});
}

template <typename T>
void merge_attention(const Context& context, View4<const T> out_a, View3<const T> lse_a,
                     View4<const T> out_b, View3<const T> lse_b, View4<T> out, View3<T> lse) {
  check_view(out_a, "out_a");
  check_view(out_b, "out_b");
  check_view(lse_a, "lse_a");
  check_view(lse_b, "lse_b");
  check_view(out, "out");
  check_view(lse, "lse");
  const int64_t B = out_a.dim(0), N = out_a.dim(1), H = out_a.dim(2), Dv = out_a.dim(3);
  check_shape(out_b, {B, N, H, Dv}, "out_b (expected the shape of out_a [B, N, H, Dv])");
  check_shape(out, {B, N, H, Dv}, "out (expected the shape of out_a [B, N, H, Dv])");
  check_shape(lse_a, {B, H, N}, "lse_a (expected [B, H, N] from out_a [B, N, H, Dv])");
  check_shape(lse_b, {B, H, N}, "lse_b (expected [B, H, N] from out_a [B, N, H, Dv])");
  check_shape(lse, {B, H, N}, "lse (expected [B, H, N] from out_a [B, N, H, Dv])");
  dispatch(context,
           exact_detail::MergeParams<T>{B, N, H, Dv, out_a, lse_a, out_b, lse_b, out, lse});
}

template <typename T>
void merge_attention_backward(const Context& context, View4<const T> out_a, View3<const T> lse_a,
                              View4<const T> out_b, View3<const T> lse_b, View4<const T> out,
                              View3<const T> lse, View4<const T> dout, View3<const T> dlse,
                              View4<T> dout_a, View3<T> dlse_a, View4<T> dout_b, View3<T> dlse_b) {
  check_view(out_a, "out_a");
  const int64_t B = out_a.dim(0), N = out_a.dim(1), H = out_a.dim(2), Dv = out_a.dim(3);
  const std::array<int64_t, 4> rows{B, N, H, Dv};
  const std::array<int64_t, 3> stats{B, H, N};
  auto check_rows = [&](auto view, const char* name) {
    check_view(view, name);
    check(view.shape == rows, name, ": expected shape ", shape_text(rows),
          " (the shape of out_a [B, N, H, Dv]), got ", shape_text(view.shape));
  };
  auto check_stats = [&](auto view, const char* name) {
    check_view(view, name);
    check(view.shape == stats, name, ": expected shape ", shape_text(stats),
          " ([B, H, N] from out_a [B, N, H, Dv]), got ", shape_text(view.shape));
  };
  check_rows(out_b, "out_b");
  check_rows(out, "out");
  check_rows(dout_a, "dout_a");
  check_rows(dout_b, "dout_b");
  check_stats(lse_a, "lse_a");
  check_stats(lse_b, "lse_b");
  check_stats(lse, "lse");
  check_stats(dlse_a, "dlse_a");
  check_stats(dlse_b, "dlse_b");
  if (!dout.empty()) check_rows(dout, "dout");
  if (!dlse.empty()) check_stats(dlse, "dlse");
  dispatch(context,
           exact_detail::MergeBackwardParams<T>{B, N, H, Dv, out_a, lse_a, out_b, lse_b, out, lse,
                                                dout, dlse, dout_a, dlse_a, dout_b, dlse_b});
}

#define SUBQUAD_EXACT_INSTANTIATE(T)                                                               \
  template void exact_attention_forward<T>(const Context&, View4<const T>, View4<const T>,         \
                                           View4<const T>, const ExactOptions&, View4<T>,          \
                                           View3<T>);                                              \
  template void exact_attention_backward<T>(const Context&, View4<const T>, View4<const T>,        \
                                            View4<const T>, View4<const T>, View3<const T>,        \
                                            View4<const T>, View3<const T>, const ExactOptions&,   \
                                            View4<T>, View4<T>, View4<T>);                         \
  template void merge_attention<T>(const Context&, View4<const T>, View3<const T>, View4<const T>, \
                                   View3<const T>, View4<T>, View3<T>);                            \
  template void merge_attention_backward<T>(const Context&, View4<const T>, View3<const T>,        \
                                            View4<const T>, View3<const T>, View4<const T>,        \
                                            View3<const T>, View4<const T>, View3<const T>,        \
                                            View4<T>, View3<T>, View4<T>, View3<T>);
SUBQUAD_EXACT_INSTANTIATE(float)
SUBQUAD_EXACT_INSTANTIATE(double)
#undef SUBQUAD_EXACT_INSTANTIATE
// bfloat16 storage: forward and backward (lse, dlse float32); no merge.
template void exact_attention_forward<bfloat16>(const Context&, View4<const bfloat16>,
                                                View4<const bfloat16>, View4<const bfloat16>,
                                                const ExactOptions&, View4<bfloat16>,
                                                View3<float>);
template void exact_attention_backward<bfloat16>(
    const Context&, View4<const bfloat16>, View4<const bfloat16>, View4<const bfloat16>,
    View4<const bfloat16>, View3<const float>, View4<const bfloat16>, View3<const float>,
    const ExactOptions&, View4<bfloat16>, View4<bfloat16>, View4<bfloat16>);

}  // namespace subquad
