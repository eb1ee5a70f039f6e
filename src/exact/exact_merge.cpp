// Merges two attention results over disjoint key sets through their log-sum-exps:
// lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b,
// and its backward. O(B N H Dv) each. Reference: exact_ref.h (merge_attention_reference*);
// tested against attention over the concatenated key set and finite differences
// (exact_merge_test.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/parallel.h"
#include "exact/exact_ops.h"

namespace subquad {

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const exact_detail::MergeParams<T>& params) {
  // Named copies, not structured bindings: lambdas capture these (C++20, but not clang 14).
  const int64_t B = params.B, N = params.N, H = params.H, Dv = params.Dv;
  const View4<const T> out_a = params.out_a, out_b = params.out_b;
  const View3<const T> lse_a = params.lse_a, lse_b = params.lse_b;
  const View4<T> out = params.out;
  const View3<T> lse = params.lse;
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
void run(Backend, const Context& context, const exact_detail::MergeBackwardParams<T>& params) {
  const int64_t B = params.B, N = params.N, H = params.H, Dv = params.Dv;
  const View4<const T> out_a = params.out_a, out_b = params.out_b, out = params.out;
  const View3<const T> lse_a = params.lse_a, lse_b = params.lse_b, lse = params.lse;
  const View4<const T> dout = params.dout;
  const View3<const T> dlse = params.dlse;
  const View4<T> dout_a = params.dout_a, dout_b = params.dout_b;
  const View3<T> dlse_a = params.dlse_a, dlse_b = params.dlse_b;
  const bool has_dout = !dout.empty(), has_dlse = !dlse.empty();
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

template void run<float>(Backend, const Context&, const exact_detail::MergeParams<float>&);
template void run<double>(Backend, const Context&, const exact_detail::MergeParams<double>&);
template void run<float>(Backend, const Context&,
                         const exact_detail::MergeBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const exact_detail::MergeBackwardParams<double>&);

}  // namespace cpu
}  // namespace subquad
