// Merges two attention results over disjoint key sets through their log-sum-exps:
// lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// O(B N H Dv). Tested against attention over the concatenated key set (exact_test.cpp).
#include <algorithm>
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

template void merge_attention<float>(const Context&, View4<const float>, View3<const float>,
                                     View4<const float>, View3<const float>, View4<float>,
                                     View3<float>);
template void merge_attention<double>(const Context&, View4<const double>, View3<const double>,
                                      View4<const double>, View3<const double>, View4<double>,
                                      View3<double>);

}  // namespace subquad
