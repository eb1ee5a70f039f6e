// Merges two attention results over disjoint key sets through their log-sum-exps:
// lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b,
// and its backward. O(B N H Dv) each. Reference: exact_ref.h (merge_attention_reference*);
// tested against attention over the concatenated key set and finite differences
// (exact_merge_test.cpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "subquad/exact.h"
#include "subquad/parallel.h"

namespace subquad {

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
  constexpr T minus_inf = -std::numeric_limits<T>::infinity();
  // Each (b, i) writes its own rows; elementwise, so out may alias out_a or out_b.
  parallel_for(context, B * N, [&](int64_t index) {
    const int64_t b = index / N, i = index % N;
    for (int64_t h = 0; h < H; ++h) {
      const T la = lse_a(b, h, i), lb = lse_b(b, h, i);
      const T top = std::max(la, lb);
      const T* a = out_a.row(b, i, h);
      const T* c = out_b.row(b, i, h);
      T* o = out.row(b, i, h);
      if (top == minus_inf) {  // neither part saw a key
        std::fill(o, o + Dv, T(0));
        lse(b, h, i) = minus_inf;
        continue;
      }
      // Relative to the larger lse, so neither weight overflows; a -inf part weighs 0.
      const T wa = std::exp(la - top), wb = std::exp(lb - top);
      const T total = wa + wb;
      for (int64_t d = 0; d < Dv; ++d) o[d] = (wa * a[d] + wb * c[d]) / total;
      lse(b, h, i) = top + std::log(total);
    }
  });
}

template <typename T>
void merge_attention_backward(const Context& context, View4<const T> out_a,
                              View3<const T> lse_a, View4<const T> out_b, View3<const T> lse_b,
                              View4<const T> out, View3<const T> lse, View4<const T> dout,
                              View3<const T> dlse, View4<T> dout_a, View3<T> dlse_a,
                              View4<T> dout_b, View3<T> dlse_b) {
  check_view(out_a, "out_a");
  const int64_t B = out_a.dim(0), N = out_a.dim(1), H = out_a.dim(2), Dv = out_a.dim(3);
  const std::array<int64_t, 4> rows{B, N, H, Dv};
  const std::array<int64_t, 3> stats{B, H, N};
  auto check_rows = [&](auto view, const char* name) {
    check_view(view, name);
    check(view.shape == rows, name, ": expected shape ", shape_string(rows),
          " (the shape of out_a [B, N, H, Dv]), got ", shape_string(view.shape));
  };
  auto check_stats = [&](auto view, const char* name) {
    check_view(view, name);
    check(view.shape == stats, name, ": expected shape ", shape_string(stats),
          " ([B, H, N] from out_a [B, N, H, Dv]), got ", shape_string(view.shape));
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
  const bool has_dout = !dout.empty(), has_dlse = !dlse.empty();
  if (has_dout) check_rows(dout, "dout");
  if (has_dlse) check_stats(dlse, "dlse");
  constexpr T minus_inf = -std::numeric_limits<T>::infinity();
  // In the forward: out = w_a out_a + w_b out_b with w_p = exp(lse_p - lse).
  parallel_for(context, B * N, [&](int64_t index) {
    const int64_t b = index / N, i = index % N;
    for (int64_t h = 0; h < H; ++h) {
      const T merged = lse(b, h, i);
      const T* o = out.row(b, i, h);
      const T* g = has_dout ? dout.row(b, i, h) : nullptr;
      const T row_dlse = has_dlse ? dlse(b, h, i) : T(0);
      auto part = [&](const T* out_p, T lse_p, T* dout_p, T& dlse_p) {
        const T w = merged == minus_inf ? T(0) : std::exp(lse_p - merged);
        T dot = 0;  // <dout, out_p - out>
        for (int64_t d = 0; d < Dv; ++d) {
          const T gd = g ? g[d] : T(0);
          dout_p[d] = w * gd;
          dot += gd * (out_p[d] - o[d]);
        }
        dlse_p = w * (dot + row_dlse);
      };
      part(out_a.row(b, i, h), lse_a(b, h, i), dout_a.row(b, i, h), dlse_a(b, h, i));
      part(out_b.row(b, i, h), lse_b(b, h, i), dout_b.row(b, i, h), dlse_b(b, h, i));
    }
  });
}

template void merge_attention<float>(const Context&, View4<const float>, View3<const float>,
                                     View4<const float>, View3<const float>, View4<float>,
                                     View3<float>);
template void merge_attention<double>(const Context&, View4<const double>, View3<const double>,
                                      View4<const double>, View3<const double>, View4<double>,
                                      View3<double>);

template void merge_attention_backward<float>(
    const Context&, View4<const float>, View3<const float>, View4<const float>,
    View3<const float>, View4<const float>, View3<const float>, View4<const float>,
    View3<const float>, View4<float>, View3<float>, View4<float>, View3<float>);
template void merge_attention_backward<double>(
    const Context&, View4<const double>, View3<const double>, View4<const double>,
    View3<const double>, View4<const double>, View3<const double>, View4<const double>,
    View3<const double>, View4<double>, View3<double>, View4<double>, View3<double>);

}  // namespace subquad
