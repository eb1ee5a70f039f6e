// Decoding causal CAT over caller-owned z and v (cat_causal_decode, subquad/cat.h): each new
// row i costs O(i Dv) per head, since every output row re-weights all cached values
// (out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]): the lag pairs the
// newest score with the oldest value). Reference: row i of cat_causal_forward (cat_ref.h);
// tested against it in cat_causal_test.cpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cat/cat_common.h"
#include "cat/cat_ops.h"
#include "common/parallel.h"
#include "subquad/cat.h"

namespace subquad {

template <typename T>
void cat_causal_decode(const Context& context, View3<const T> z, View4<const T> v,
                       View4<T> out) {
  check_view(z, "z");
  check_view(v, "v");
  check_view(out, "out");
  const int64_t B = z.dim(0), S = z.dim(1), H = z.dim(2);
  cat_detail::expect_shape(v, {B, S, H, v.dim(3)}, "v (expected [B, S, H, Dv] like z [B, S, H])");
  const int64_t tokens = out.dim(1);
  check(tokens >= 0 && tokens <= S, "out: expected at most the S = ", S,
        " tokens of z as new tokens, got ", tokens);
  cat_detail::expect_shape(out, {B, tokens, H, v.dim(3)}, "out (expected [B, T, H, Dv])");
  // Scores and values are not scanned: a non-finite one propagates to the rows that see it,
  // as in cat_causal_forward.
  dispatch(context, cat_detail::CatDecodeParams<T>{z, v, out});
}

template void cat_causal_decode<float>(const Context&, View3<const float>, View4<const float>,
                                       View4<float>);
template void cat_causal_decode<double>(const Context&, View3<const double>,
                                        View4<const double>, View4<double>);

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatDecodeParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v;
  const View4<T> out = params.out;
  const int64_t B = out.dim(0), T_new = out.dim(1), H = out.dim(2), Dv = out.dim(3);
  const int64_t first = z.dim(1) - T_new;
  if (B * H == 0 || Dv == 0) return;
  WorkspaceFrame frame(context);  // the accumulators: none allocated with a workspace
  cat_detail::ThreadScratch<double> acc_scratch(frame, thread_count(context), Dv);  // [Dv]
  parallel_for(context, B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    double* acc = acc_scratch.get();
    for (int64_t t = 0; t < T_new; ++t) {
      const int64_t i = first + t;
      // The normaliser sum_{k <= i} exp(z[k] - max), relative to the max over k <= i.
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k <= i; ++k) max = std::max(max, static_cast<double>(z(b, k, h)));
      double sum = 0;
      std::fill(acc, acc + Dv, 0.0);
      for (int64_t k = 0; k <= i; ++k) {
        const double w = std::exp(static_cast<double>(z(b, k, h)) - max);
        sum += w;
        const T* x = v.row(b, i - k, h);
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) acc[c] += w * x[c];
      }
      T* row = out.row(b, t, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[c] / sum);
    }
  });
}

template void run<float>(Backend, const Context&, const cat_detail::CatDecodeParams<float>&);
template void run<double>(Backend, const Context&, const cat_detail::CatDecodeParams<double>&);

}  // namespace cpu
}  // namespace subquad
