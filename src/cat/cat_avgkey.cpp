// Averaged-key CAT: z[b, i, h] = scale <q[b, i, h], mean_j k[b, j, h]>, then cat_forward;
// the backward chains cat_backward's dz into dq and dk. O(N D) on top of CAT per head.
// Reference: cat_ref.h (cat_avgkey_scores, cat_avgkey_backward).
#include <algorithm>
#include <cmath>

#include "cat/cat_common.h"
#include "cat/cat_ops.h"
#include "common/parallel.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

template <typename T>
void check_qkv(View4<const T> q, View4<const T> k, View4<const T> v) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  cat_detail::expect_shape(k, q.shape, "k");
  check(v.shape[0] == q.shape[0] && v.shape[1] == q.shape[1] && v.shape[2] == q.shape[2], "v: ",
        "expected shape [B, N, H, Dv] with [B, N, H] of q ", shape_text(q.shape), ", got ",
        shape_text(v.shape));
}

double resolve_scale(const CatAvgKeyOptions& options, int64_t D) {
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  check(std::isfinite(scale) && scale > 0, "scale: expected a finite value > 0, got ", scale);
  return scale;
}

// mean [B, H, D] = mean over tokens of k, in double.
template <typename T>
void mean_keys(const Context& context, View4<const T> k, double* mean) {
  const int64_t B = k.shape[0], N = k.shape[1], H = k.shape[2], D = k.shape[3];
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    double* m = mean + task * D;
    std::fill(m, m + D, 0.0);
    for (int64_t j = 0; j < N; ++j) {
      const T* row = k.row(b, j, h);
      for (int64_t e = 0; e < D; ++e) m[e] += row[e];
    }
    for (int64_t e = 0; e < D; ++e) m[e] /= static_cast<double>(N);
  });
}

// z [B, N, H] contiguous, from q [B, N, H, D] and mean [B, H, D].
template <typename T>
void scores(const Context& context, View4<const T> q, const double* mean, double scale, T* z) {
  const int64_t B = q.shape[0], N = q.shape[1], H = q.shape[2], D = q.shape[3];
  parallel_for(context, B * N, [&](int64_t task) {
    const int64_t b = task / N, i = task % N;
    for (int64_t h = 0; h < H; ++h) {
      const T* row = q.row(b, i, h);
      const double* m = mean + (b * H + h) * D;
      // Without the pragma the float64 sum is one serial add chain (no fast-math): it cost
      // more than the CAT forward itself at N = 4096.
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t e = 0; e < D; ++e) dot += row[e] * m[e];
      z[task * H + h] = static_cast<T>(scale * dot);
    }
  });
}

// The scratch of both directions, from the call's workspace frame: mean [B, H, D] and
// z [B, N, H].
template <typename T>
struct Scores {
  double* mean;
  T* z;
  Scores(WorkspaceFrame& frame, const Context& context, View4<const T> q, View4<const T> k,
         double scale)
      : mean(frame.take<double>(q.shape[0] * q.shape[2] * q.shape[3])),
        z(frame.take<T>(q.shape[0] * q.shape[1] * q.shape[2])) {
    mean_keys(context, k, mean);
    scores(context, q, mean, scale, z);
  }
};

}  // namespace

namespace cpu {

// The scores go through the public cat_forward / cat_backward (their own checks and
// dispatch: the scores are finite when q and k are).
template <typename T>
void run(Backend, const Context& context, const cat_detail::CatAvgKeyForwardParams<T>& params) {
  const View4<const T> q = params.q;
  WorkspaceFrame frame(context);  // the scores: none allocated with a workspace
  const Scores<T> s(frame, context, q, params.k, params.scale);
  const View3<const T> z_view(s.z, {q.shape[0], q.shape[1], q.shape[2]});
  cat_forward(context, z_view, params.v, params.cat, params.out);
}

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatAvgKeyBackwardParams<T>& params) {
  const View4<const T> q = params.q, k = params.k, v = params.v, dout = params.dout;
  const View4<T> dq = params.dq, dk = params.dk, dv = params.dv;
  const double scale = params.scale;
  const int64_t B = q.shape[0], N = q.shape[1], H = q.shape[2], D = q.shape[3];
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  const Scores<T> s(frame, context, q, k, scale);
  T* dz = frame.take<T>(B * N * H);                                        // [B, N, H]
  cat_detail::ThreadScratch<double> dmean_scratch(frame, thread_count(context), D);  // [D]
  const View3<const T> z_view(s.z, {B, N, H});
  cat_backward(context, z_view, v, dout, params.cat, View3<T>(dz, {B, N, H}), dv);
  // In the forward: z[i] = scale <q[i], kbar>, kbar = (1/N) sum_j k[j].
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    const double* m = s.mean + task * D;
    double* dmean = dmean_scratch.get();
    std::fill(dmean, dmean + D, 0.0);
    for (int64_t i = 0; i < N; ++i) {
      const double g = scale * dz[(b * N + i) * H + h];
      const T* qi = q.row(b, i, h);
      T* dqi = dq.row(b, i, h);
      for (int64_t e = 0; e < D; ++e) {
        dqi[e] = static_cast<T>(g * m[e]);
        dmean[e] += g * qi[e];
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      T* dkj = dk.row(b, j, h);
      for (int64_t e = 0; e < D; ++e) dkj[e] = static_cast<T>(dmean[e] / N);
    }
  });
}

template void run<float>(Backend, const Context&,
                         const cat_detail::CatAvgKeyForwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const cat_detail::CatAvgKeyForwardParams<double>&);
template void run<float>(Backend, const Context&,
                         const cat_detail::CatAvgKeyBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const cat_detail::CatAvgKeyBackwardParams<double>&);

}  // namespace cpu

// The public operators: checks, then the one dispatch on Context::device.
template <typename T>
void cat_avgkey_forward(const Context& context, View4<const T> q, View4<const T> k,
                        View4<const T> v, const CatAvgKeyOptions& options, View4<T> out) {
  check_qkv(q, k, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
  const double scale = resolve_scale(options, q.shape[3]);
  // Zero volume returns at once, whatever the other sides (no loop over them).
  if (out.size() == 0) return;
  dispatch(context, cat_detail::CatAvgKeyForwardParams<T>{
                        q, k, v, scale, CatOptions{options.convention, options.path}, out});
}

template <typename T>
void cat_avgkey_backward(const Context& context, View4<const T> q, View4<const T> k,
                         View4<const T> v, View4<const T> dout, const CatAvgKeyOptions& options,
                         View4<T> dq, View4<T> dk, View4<T> dv) {
  check_qkv(q, k, v);
  check_view(dq, "dq");
  cat_detail::expect_shape(dq, q.shape, "dq");
  check_view(dk, "dk");
  cat_detail::expect_shape(dk, k.shape, "dk");
  const double scale = resolve_scale(options, q.shape[3]);
  if (checked_product({q.shape[0], q.shape[1], q.shape[2]}, "q") == 0) return;
  dispatch(context, cat_detail::CatAvgKeyBackwardParams<T>{
                        q, k, v, dout, scale, CatOptions{options.convention, options.path},
                        dq, dk, dv});
}

#define SUBQUAD_CAT_AVGKEY_INSTANTIATE(T)                                                    \
  template void cat_avgkey_forward<T>(const Context&, View4<const T>, View4<const T>,        \
                                      View4<const T>, const CatAvgKeyOptions&, View4<T>);    \
  template void cat_avgkey_backward<T>(const Context&, View4<const T>, View4<const T>,       \
                                       View4<const T>, View4<const T>,                       \
                                       const CatAvgKeyOptions&, View4<T>, View4<T>, View4<T>);
SUBQUAD_CAT_AVGKEY_INSTANTIATE(float)
SUBQUAD_CAT_AVGKEY_INSTANTIATE(double)
#undef SUBQUAD_CAT_AVGKEY_INSTANTIATE

}  // namespace subquad
