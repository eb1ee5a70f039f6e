// 2D circulant attention on CPU: per (b, h), batched rank-2 complex FFTs over contiguous
// planes of channel pairs packed as x + i y ([C / 2, Hg, Wg]); forward D + Dv complex and 2
// more transforms of N = Hg * Wg points, backward 2D + 1.5 Dv + 4. Reference:
// circulant2d_ref.h; math and derivation: README.md.
#include "subquad/circulant2d.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <initializer_list>
#include <limits>

#include "circulant2d/circulant2d_ops.h"
#include "circulant2d/one_channel_heads.h"
#include "circulant2d/planes.h"
#include "common/fft.h"
#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/thread_scratch.h"

namespace subquad {
namespace {

using namespace circulant2d_detail;

struct Shape {
  int64_t B, Hg, Wg, H, D, Dv, N;
  int64_t key_pairs() const { return (D + 1) / 2; }
  int64_t value_pairs() const { return (Dv + 1) / 2; }
};

template <typename T>
struct Plans {
  ComplexFftPlan<T> keys;    // batch (D + 1) / 2
  ComplexFftPlan<T> values;  // batch (Dv + 1) / 2
  ComplexFftPlan<T> single;  // batch 1
};

ComplexFftLayout planes_layout(const Shape& shape, int64_t batch) {
  ComplexFftLayout layout;
  layout.rank = 2;
  layout.n0 = shape.Hg;
  layout.n1 = shape.Wg;
  layout.batch = batch;
  return layout;
}

template <typename T>
Plans<T> make_plans(const Shape& shape) {
  return {ComplexFftPlan<T>::get(planes_layout(shape, shape.key_pairs())),
          ComplexFftPlan<T>::get(planes_layout(shape, shape.value_pairs())),
          ComplexFftPlan<T>::get(planes_layout(shape, 1))};
}

// One thread's scratch, reused across the heads it runs (allocating per head would fault
// in megabytes of fresh pages every time), taken from the call's workspace frame before the
// parallel loop. Spectra are full (N bins): packed pairs are complex signals.
template <typename T>
struct HeadScratch {
  using C = std::complex<T>;
  C* planes;     // [pairs, N] packed channel pairs
  C* spec_q;     // [(D + 1) / 2, N]
  C* spec_k;     // [(D + 1) / 2, N]
  C* spec_v;     // [(Dv + 1) / 2, N]
  C* spec_dout;  // [(Dv + 1) / 2, N], backward only
  T* weights;    // s [N]
  T* dweights;   // ds, then da [N]
  C* signal;     // [N] a real signal as complex, or an inverse's complex result
  C* spec_s;     // [N]
  C* spec_w;     // [N] the factor a spectrum is multiplied by
};

// The per-thread blocks of HeadScratch: one complex block [4 D/2 + 2 Dv/2 + 3, N] (roughly)
// and one real block [2, N] per thread.
template <typename T>
class HeadScratches {
 public:
  HeadScratches(WorkspaceFrame& frame, const Context& context, const Shape& s, bool backward)
      : s_(s),
        backward_(backward),
        complex_(frame, context, complex_count(s, backward)),
        real_(frame, context, 2 * s.N) {}
  HeadScratch<T> local() const {
    const int64_t N = s_.N, kp = s_.key_pairs(), vp = s_.value_pairs();
    std::complex<T>* c = complex_.get();
    HeadScratch<T> w;
    w.planes = c;
    c += std::max(kp, vp) * N;
    w.spec_q = c;
    c += kp * N;
    w.spec_k = c;
    c += kp * N;
    w.spec_v = c;
    c += vp * N;
    w.spec_dout = backward_ ? c : nullptr;
    c += backward_ ? vp * N : 0;
    w.signal = c;
    w.spec_s = c + N;
    w.spec_w = c + 2 * N;
    w.weights = real_.get();
    w.dweights = w.weights + N;
    return w;
  }

 private:
  static int64_t complex_count(const Shape& s, bool backward) {
    const int64_t kp = s.key_pairs(), vp = s.value_pairs();
    return (std::max(kp, vp) + 2 * kp + (backward ? 2 : 1) * vp + 3) * s.N;
  }
  Shape s_;
  bool backward_;
  cpu::ThreadScratch<std::complex<T>> complex_;
  cpu::ThreadScratch<T> real_;
};

// spectrum = fft2(x) of a real plane x [N], through the complex plan (x + 0i).
template <typename T>
void real_plane_spectrum(const Plans<T>& plans, const T* x, int64_t N, const HeadScratch<T>& w,
                         std::complex<T>* spectrum) {
  for (int64_t n = 0; n < N; ++n) w.signal[n] = std::complex<T>(x[n], T(0));
  plans.single.forward(w.signal, spectrum);
}

// x [N] = Re(ifft2(spectrum)), unnormalised.
template <typename T>
void real_part_of_inverse(const Plans<T>& plans, const std::complex<T>* spectrum, int64_t N,
                          const HeadScratch<T>& w, T* x) {
  plans.single.inverse(spectrum, w.signal);
  for (int64_t n = 0; n < N; ++n) x[n] = w.signal[n].real();
}

// Logits and softmax of head (b, h): leaves fft2 of q's and k's packed pairs in spec_q,
// spec_k and s in `weights`. a = c * sum_d corr(q_d, k_d); for a pair x = q_d + i q_{d+1},
// y = k_d + i k_{d+1}: Re(corr(x, y)) = corr(q_d, k_d) + corr(q_{d+1}, k_{d+1}), so
// a = (c / N) Re(ifft2(sum_pairs conj(Q) K)).
template <typename T>
HeadStatus head_weights(const Plans<T>& plans, const Shape& s, View5<const T> q,
                        View5<const T> k, int64_t b, int64_t h, T scale, const HeadScratch<T>& w) {
  if (!gather_pair_planes(q, b, h, w.planes)) return HeadStatus::q_not_finite;
  plans.keys.forward(w.planes, w.spec_q);
  if (!gather_pair_planes(k, b, h, w.planes)) return HeadStatus::k_not_finite;
  plans.keys.forward(w.planes, w.spec_k);
  sum_conj_products(w.spec_q, w.spec_k, s.key_pairs(), s.N,
                    static_cast<T>(scale / s.N), w.spec_s);
  real_part_of_inverse(plans, w.spec_s, s.N, w, w.weights);
  if (!softmax_in_place(w.weights, s.N)) return HeadStatus::logits_overflow;
  return HeadStatus::ok;
}

template <typename T>
HeadStatus head_forward(const Plans<T>& plans, const Shape& s, View5<const T> q,
                        View5<const T> k, View5<const T> v, int64_t b, int64_t h, T scale,
                        View5<T> out, View4<T> weights, const HeadScratch<T>& w) {
  const HeadStatus status = head_weights(plans, s, q, k, b, h, scale, w);
  if (status != HeadStatus::ok) return status;
  if (!weights.empty())
    for (int64_t i = 0; i < s.Hg; ++i)
      std::copy_n(w.weights + i * s.Wg, s.Wg, weights.row(b, h, i));
  // out = corr(s, v) = (1 / N) ifft2(conj(S) V) per packed value pair (s is real).
  real_plane_spectrum(plans, w.weights, s.N, w, w.spec_s);
  scaled_spectrum(w.spec_s, s.N, static_cast<T>(1.0 / s.N), true, w.spec_w);
  if (!gather_pair_planes(v, b, h, w.planes)) return HeadStatus::v_not_finite;
  plans.values.forward(w.planes, w.spec_v);
  multiply_channels(w.spec_v, w.spec_w, s.value_pairs(), s.N);
  plans.values.inverse(w.spec_v, w.planes);
  scatter_pair_planes(w.planes, b, h, out);
  return HeadStatus::ok;
}

template <typename T>
HeadStatus head_backward(const Plans<T>& plans, const Shape& s, View5<const T> q,
                         View5<const T> k, View5<const T> v, View5<const T> dout, int64_t b,
                         int64_t h, T scale, View5<T> dq, View5<T> dk, View5<T> dv,
                         const HeadScratch<T>& w) {
  const HeadStatus status = head_weights(plans, s, q, k, b, h, scale, w);
  if (status != HeadStatus::ok) return status;
  const T inverse_n = static_cast<T>(1.0 / s.N);
  real_plane_spectrum(plans, w.weights, s.N, w, w.spec_s);  // S
  if (!gather_pair_planes(v, b, h, w.planes)) return HeadStatus::v_not_finite;
  plans.values.forward(w.planes, w.spec_v);  // V
  if (!gather_pair_planes(dout, b, h, w.planes)) return HeadStatus::dout_not_finite;
  plans.values.forward(w.planes, w.spec_dout);  // G = fft2(dout)

  // In the forward: out = corr(s, v). So ds = sum_c corr(dout_c, v_c)
  // = (1 / N) Re(ifft2(sum_pairs conj(G) V)) (the pair identity of head_weights)
  sum_conj_products(w.spec_dout, w.spec_v, s.value_pairs(), s.N, inverse_n,
                    w.spec_w);
  real_part_of_inverse(plans, w.spec_w, s.N, w, w.dweights);
  // and dv = conv(s, dout) = (1 / N) ifft2(S G) per pair.
  scaled_spectrum(w.spec_s, s.N, inverse_n, false, w.spec_w);
  multiply_channels(w.spec_dout, w.spec_w, s.value_pairs(), s.N);
  plans.values.inverse(w.spec_dout, w.planes);
  scatter_pair_planes(w.planes, b, h, dv);

  // s = softmax(a): da = s * (ds - <s, ds>).
  T* da = w.dweights;
  const T* weights = w.weights;
  const T mean = static_cast<T>(dot(weights, da, s.N));
#pragma omp simd
  for (int64_t n = 0; n < s.N; ++n) da[n] = weights[n] * (da[n] - mean);

  // a = c corr(q, k): dq = c corr(da, k) = (c / N) ifft2(conj(DA) K),
  // dk = c conv(da, q) = (c / N) ifft2(DA Q), per packed pair.
  real_plane_spectrum(plans, da, s.N, w, w.spec_s);  // DA
  const T factor = static_cast<T>(scale / s.N);
  scaled_spectrum(w.spec_s, s.N, factor, true, w.spec_w);
  multiply_channels(w.spec_k, w.spec_w, s.key_pairs(), s.N);
  plans.keys.inverse(w.spec_k, w.planes);
  scatter_pair_planes(w.planes, b, h, dq);
  scaled_spectrum(w.spec_s, s.N, factor, false, w.spec_w);
  multiply_channels(w.spec_q, w.spec_w, s.key_pairs(), s.N);
  plans.keys.inverse(w.spec_q, w.planes);
  scatter_pair_planes(w.planes, b, h, dk);
  return HeadStatus::ok;
}

// A head whose q, k, v or dout is not finite, or whose logits overflow, is non-finite input
// and propagates (docs/conventions.md): through the FFTs it would reach every output of the
// head, so the kernels stop at the first bad plane (the one-channel path isolates it from its
// pair partner) and the head's outputs are NaN, written here after the parallel loop.
template <typename T>
void fill_nan(View5<T> x, int64_t b, int64_t h) {
  for (int64_t i = 0; i < x.dim(1); ++i)
    for (int64_t j = 0; j < x.dim(2); ++j)
      std::fill_n(x.row(b, i, j, h), x.dim(4), std::numeric_limits<T>::quiet_NaN());
}

template <typename T>
void poison_failed_heads(const HeadStatus* statuses, int64_t B, int64_t H,
                         std::initializer_list<View5<T>> outputs, View4<T> weights) {
  for (int64_t job = 0; job < B * H; ++job) {
    if (statuses[job] == HeadStatus::ok) continue;
    const int64_t b = job / H, h = job % H;
    for (const View5<T>& x : outputs) fill_nan(x, b, h);
    if (!weights.empty())
      for (int64_t i = 0; i < weights.dim(2); ++i)
        std::fill_n(weights.row(b, h, i), weights.dim(3), std::numeric_limits<T>::quiet_NaN());
  }
}

template <typename T>
Shape shape_of(View5<const T> q, View5<const T> v) {
  return {q.dim(0), q.dim(1), q.dim(2), q.dim(3), q.dim(4), v.dim(4), q.dim(1) * q.dim(2)};
}

template <typename T>
Shape check_inputs(View5<const T> q, View5<const T> k, View5<const T> v,
                   const Circulant2dOptions& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  const Shape s = shape_of(q, v);
  check(s.Hg >= 1 && s.Wg >= 1, "q: the grid Hg x Wg must be non-empty, got shape ",
        shape_text(q.shape));
  check(s.D >= 1, "q: head dim D must be at least 1, got shape ", shape_text(q.shape));
  check(s.Dv >= 1, "v: value dim Dv must be at least 1, got shape ", shape_text(v.shape));
  check_shape(k, q.shape, "k");
  check_shape(v, {s.B, s.Hg, s.Wg, s.H, s.Dv}, "v");
  check(!options.scale || (std::isfinite(*options.scale) && *options.scale > 0),
        "scale: expected a finite value > 0, got ", options.scale.value_or(0.0));
  return s;
}

}  // namespace

double circulant2d_scale(const Circulant2dOptions& options, int64_t tokens, int64_t head_dim) {
  if (options.scale) return *options.scale;
  const double n = static_cast<double>(tokens);
  if (options.scale_mode == Circulant2dScaleMode::code) return 1.0 / std::sqrt(n);
  return 1.0 / (n * std::sqrt(static_cast<double>(head_dim)));
}

constexpr int64_t kMaxGridTokens = int64_t(1) << 40;

Grid circulant2d_grid_for_tokens(int64_t tokens) {
  check(tokens >= 1, "tokens: must be at least 1, got ", tokens);
  // The divisor scan is O(sqrt(tokens)): bounded so that it finishes at once.
  check(tokens <= kMaxGridTokens, "tokens: expected at most ", kMaxGridTokens, ", got ", tokens);
  Grid grid{1, tokens};
  for (int64_t rows = 1; rows * rows <= tokens; ++rows)
    if (tokens % rows == 0) grid = {rows, tokens / rows};
  return grid;
}

namespace cpu {

// Non-finite inputs are found by the kernels; their heads are made NaN after the loop.
template <typename T>
void run(Backend, const Context& context,
         const circulant2d_detail::Circulant2dForwardParams<T>& params) {
  const View5<const T> q = params.q, k = params.k, v = params.v;
  const View5<T> out = params.out;
  const View4<T> weights = params.weights;
  const Shape s = shape_of(q, v);
  const double scale = params.scale;
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  HeadStatus* statuses = frame.take<HeadStatus>(s.B * s.H);  // [B * H]
  std::fill_n(statuses, s.B * s.H, HeadStatus::ok);
  if (s.D == 1 && s.Dv == 1) {  // one-channel heads: transformed together, not one by one
    one_channel_forward(context, q, k, v, static_cast<T>(scale), out, weights, statuses);
    poison_failed_heads(statuses, s.B, s.H, {out}, weights);
    return;
  }
  const Plans<T> plans = make_plans<T>(s);
  const HeadScratches<T> scratch(frame, context, s, /*backward=*/false);
  parallel_for(context, s.B * s.H, [&](int64_t job) {
    statuses[job] = head_forward(plans, s, q, k, v, job / s.H, job % s.H,
                                 static_cast<T>(scale), out, weights, scratch.local());
  });
  poison_failed_heads(statuses, s.B, s.H, {out}, weights);
}

template <typename T>
void run(Backend, const Context& context,
         const circulant2d_detail::Circulant2dBackwardParams<T>& params) {
  const View5<const T> q = params.q, k = params.k, v = params.v, dout = params.dout;
  const View5<T> dq = params.dq, dk = params.dk, dv = params.dv;
  const Shape s = shape_of(q, v);
  const double scale = params.scale;
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  HeadStatus* statuses = frame.take<HeadStatus>(s.B * s.H);  // [B * H]
  std::fill_n(statuses, s.B * s.H, HeadStatus::ok);
  if (s.D == 1 && s.Dv == 1) {
    one_channel_backward(context, q, k, v, dout, static_cast<T>(scale), dq, dk, dv, statuses);
    poison_failed_heads(statuses, s.B, s.H, {dq, dk, dv}, View4<T>());
    return;
  }
  const Plans<T> plans = make_plans<T>(s);
  const HeadScratches<T> scratch(frame, context, s, /*backward=*/true);
  parallel_for(context, s.B * s.H, [&](int64_t job) {
    statuses[job] = head_backward(plans, s, q, k, v, dout, job / s.H, job % s.H,
                                  static_cast<T>(scale), dq, dk, dv, scratch.local());
  });
  poison_failed_heads(statuses, s.B, s.H, {dq, dk, dv}, View4<T>());
}

template void run<float>(Backend, const Context&,
                         const circulant2d_detail::Circulant2dForwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const circulant2d_detail::Circulant2dForwardParams<double>&);
template void run<float>(Backend, const Context&,
                         const circulant2d_detail::Circulant2dBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const circulant2d_detail::Circulant2dBackwardParams<double>&);

}  // namespace cpu

// The public operators: checks, then the one dispatch on Context::device.
template <typename T>
void circulant2d_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, const Circulant2dOptions& options, View5<T> out,
                         View4<T> weights) {
  const Shape s = check_inputs(q, k, v, options);
  check_view(out, "out");
  check_shape(out, v.shape, "out");
  if (!weights.empty()) {
    check_view(weights, "weights");
    check_shape(weights, {s.B, s.H, s.Hg, s.Wg}, "weights");
  }
  if (checked_product({s.B, s.H}, "q") == 0) return;
  const double scale = circulant2d_scale(options, s.N, s.D);
  dispatch(context, Circulant2dForwardParams<T>{q, k, v, scale, out, weights});
}

template <typename T>
void circulant2d_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout,
                          const Circulant2dOptions& options, View5<T> dq, View5<T> dk,
                          View5<T> dv) {
  const Shape s = check_inputs(q, k, v, options);
  check_view(dout, "dout");
  check_shape(dout, v.shape, "dout");
  check_view(dq, "dq");
  check_shape(dq, q.shape, "dq");
  check_view(dk, "dk");
  check_shape(dk, q.shape, "dk");
  check_view(dv, "dv");
  check_shape(dv, v.shape, "dv");
  if (checked_product({s.B, s.H}, "q") == 0) return;
  const double scale = circulant2d_scale(options, s.N, s.D);
  dispatch(context, Circulant2dBackwardParams<T>{q, k, v, dout, scale, dq, dk, dv});
}

#define SUBQUAD_INSTANTIATE(T)                                                                \
  template void circulant2d_forward<T>(const Context&, View5<const T>, View5<const T>,        \
                                       View5<const T>, const Circulant2dOptions&, View5<T>,   \
                                       View4<T>);                                             \
  template void circulant2d_backward<T>(const Context&, View5<const T>, View5<const T>,       \
                                        View5<const T>, View5<const T>,                       \
                                        const Circulant2dOptions&, View5<T>, View5<T>,        \
                                        View5<T>);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
