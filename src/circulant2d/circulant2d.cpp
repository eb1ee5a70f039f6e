// 2D circulant attention on CPU: per (b, h), batched rank-2 real FFTs over contiguous
// [C, Hg, Wg] planes; forward 2D + 2Dv + 2 transforms of N = Hg * Wg points, backward
// 4D + 3Dv + 4. Reference: circulant2d_ref.h; math and derivation: README.md.
#include "subquad/circulant2d.h"

#include <omp.h>

#include <cmath>
#include <complex>
#include <memory>
#include <vector>

#include "circulant2d/planes.h"
#include "subquad/buffer.h"
#include "subquad/fft.h"
#include "subquad/parallel.h"

namespace subquad {
namespace {

using namespace circulant2d_detail;

// Why a head failed; reported after the parallel loop (kernels never throw).
enum class HeadStatus { ok, q_not_finite, k_not_finite, v_not_finite, dout_not_finite,
                        logits_overflow };

struct Shape {
  int64_t B, Hg, Wg, H, D, Dv, N, F;  // F: half-spectrum size Hg * (Wg / 2 + 1)
};

template <typename T>
struct Plans {
  RealFftPlan<T> keys;    // batch D
  RealFftPlan<T> values;  // batch Dv
  RealFftPlan<T> single;  // batch 1
};

RealFftLayout planes_layout(const Shape& shape, int64_t batch) {
  RealFftLayout layout;
  layout.rank = 2;
  layout.n0 = shape.Hg;
  layout.n1 = shape.Wg;
  layout.batch = batch;
  return layout;
}

template <typename T>
Plans<T> make_plans(const Shape& shape) {
  return {RealFftPlan<T>::get(planes_layout(shape, shape.D)),
          RealFftPlan<T>::get(planes_layout(shape, shape.Dv)),
          RealFftPlan<T>::get(planes_layout(shape, 1))};
}

// One thread's scratch, reused across the heads it runs (allocating per head would fault
// in megabytes of fresh pages every time).
template <typename T>
struct Workspace {
  explicit Workspace(const Shape& s, bool backward)
      : real(Buffer<T>::uninitialized(std::max(s.D, s.Dv) * s.N)),
        spec_q(Buffer<std::complex<T>>::uninitialized(s.D * s.F)),
        spec_k(Buffer<std::complex<T>>::uninitialized(s.D * s.F)),
        spec_v(Buffer<std::complex<T>>::uninitialized(s.Dv * s.F)),
        spec_dout(Buffer<std::complex<T>>::uninitialized(backward ? s.Dv * s.F : 0)),
        weights(Buffer<T>::uninitialized(s.N)),
        dweights(Buffer<T>::uninitialized(s.N)),
        spec_s(Buffer<std::complex<T>>::uninitialized(s.F)),
        spec_w(Buffer<std::complex<T>>::uninitialized(s.F)) {}
  Buffer<T> real;                      // [max(D, Dv), N] planes
  Buffer<std::complex<T>> spec_q;      // [D, F]
  Buffer<std::complex<T>> spec_k;      // [D, F]
  Buffer<std::complex<T>> spec_v;      // [Dv, F]
  Buffer<std::complex<T>> spec_dout;   // [Dv, F], backward only
  Buffer<T> weights;                   // s [N]
  Buffer<T> dweights;                  // ds, then da [N]
  Buffer<std::complex<T>> spec_s;      // [F]
  Buffer<std::complex<T>> spec_w;      // [F] the factor a spectrum is multiplied by
};

// Per-thread workspaces, built lazily by the thread that uses them.
template <typename T>
class Workspaces {
 public:
  Workspaces(const Context& context, const Shape& shape, bool backward)
      : shape_(shape), backward_(backward), slots_(thread_count(context)) {}
  Workspace<T>& local() {
    auto& slot = slots_[omp_get_thread_num()];
    if (!slot) slot = std::make_unique<Workspace<T>>(shape_, backward_);
    return *slot;
  }

 private:
  Shape shape_;
  bool backward_;
  std::vector<std::unique_ptr<Workspace<T>>> slots_;
};

// Logits and softmax of head (b, h): leaves rfft2(q), rfft2(k) in spec_q, spec_k and s in
// `weights`. a = c * corr(q, k) summed over d = (c / N) irfft2(sum_d conj(Q_d) K_d).
template <typename T>
HeadStatus head_weights(const Plans<T>& plans, const Shape& s, View5<const T> q,
                        View5<const T> k, int64_t b, int64_t h, T scale, Workspace<T>& w) {
  if (!gather_planes(q, b, h, w.real.data())) return HeadStatus::q_not_finite;
  plans.keys.forward(w.real.data(), w.spec_q.data());
  if (!gather_planes(k, b, h, w.real.data())) return HeadStatus::k_not_finite;
  plans.keys.forward(w.real.data(), w.spec_k.data());
  sum_conj_products(w.spec_q.data(), w.spec_k.data(), s.D, s.F, static_cast<T>(scale / s.N),
                    w.spec_s.data());
  plans.single.inverse(w.spec_s.data(), w.weights.data());
  if (!softmax_in_place(w.weights.data(), s.N)) return HeadStatus::logits_overflow;
  return HeadStatus::ok;
}

template <typename T>
HeadStatus head_forward(const Plans<T>& plans, const Shape& s, View5<const T> q,
                        View5<const T> k, View5<const T> v, int64_t b, int64_t h, T scale,
                        View5<T> out, View4<T> weights, Workspace<T>& w) {
  const HeadStatus status = head_weights(plans, s, q, k, b, h, scale, w);
  if (status != HeadStatus::ok) return status;
  if (!weights.empty())
    for (int64_t i = 0; i < s.Hg; ++i)
      std::copy_n(w.weights.data() + i * s.Wg, s.Wg, weights.row(b, h, i));
  // out = corr(s, v) = (1 / N) irfft2(conj(S) V_c) per value channel c.
  plans.single.forward(w.weights.data(), w.spec_s.data());
  scaled_spectrum(w.spec_s.data(), s.F, static_cast<T>(1.0 / s.N), true, w.spec_w.data());
  if (!gather_planes(v, b, h, w.real.data())) return HeadStatus::v_not_finite;
  plans.values.forward(w.real.data(), w.spec_v.data());
  multiply_channels(w.spec_v.data(), w.spec_w.data(), s.Dv, s.F);
  plans.values.inverse(w.spec_v.data(), w.real.data());
  scatter_planes(w.real.data(), b, h, out);
  return HeadStatus::ok;
}

template <typename T>
HeadStatus head_backward(const Plans<T>& plans, const Shape& s, View5<const T> q,
                         View5<const T> k, View5<const T> v, View5<const T> dout, int64_t b,
                         int64_t h, T scale, View5<T> dq, View5<T> dk, View5<T> dv,
                         Workspace<T>& w) {
  const HeadStatus status = head_weights(plans, s, q, k, b, h, scale, w);
  if (status != HeadStatus::ok) return status;
  const T inverse_n = static_cast<T>(1.0 / s.N);
  plans.single.forward(w.weights.data(), w.spec_s.data());  // S
  if (!gather_planes(v, b, h, w.real.data())) return HeadStatus::v_not_finite;
  plans.values.forward(w.real.data(), w.spec_v.data());  // V
  if (!gather_planes(dout, b, h, w.real.data())) return HeadStatus::dout_not_finite;
  plans.values.forward(w.real.data(), w.spec_dout.data());  // G = rfft2(dout)

  // In the forward: out = corr(s, v). So ds = corr(dout, v) = (1 / N) irfft2(sum_c conj(G_c) V_c)
  sum_conj_products(w.spec_dout.data(), w.spec_v.data(), s.Dv, s.F, inverse_n,
                    w.spec_w.data());
  plans.single.inverse(w.spec_w.data(), w.dweights.data());
  // and dv = conv(s, dout) = (1 / N) irfft2(S G_c).
  scaled_spectrum(w.spec_s.data(), s.F, inverse_n, false, w.spec_w.data());
  multiply_channels(w.spec_dout.data(), w.spec_w.data(), s.Dv, s.F);
  plans.values.inverse(w.spec_dout.data(), w.real.data());
  scatter_planes(w.real.data(), b, h, dv);

  // s = softmax(a): da = s * (ds - <s, ds>).
  T* da = w.dweights.data();
  const T* weights = w.weights.data();
  const T mean = static_cast<T>(dot(weights, da, s.N));
#pragma omp simd
  for (int64_t n = 0; n < s.N; ++n) da[n] = weights[n] * (da[n] - mean);

  // a = c corr(q, k): dq = c corr(da, k) = (c / N) irfft2(conj(DA) K_d),
  // dk = c conv(da, q) = (c / N) irfft2(DA Q_d).
  plans.single.forward(da, w.spec_s.data());  // DA
  const T factor = static_cast<T>(scale / s.N);
  scaled_spectrum(w.spec_s.data(), s.F, factor, true, w.spec_w.data());
  multiply_channels(w.spec_k.data(), w.spec_w.data(), s.D, s.F);
  plans.keys.inverse(w.spec_k.data(), w.real.data());
  scatter_planes(w.real.data(), b, h, dq);
  scaled_spectrum(w.spec_s.data(), s.F, factor, false, w.spec_w.data());
  multiply_channels(w.spec_q.data(), w.spec_w.data(), s.D, s.F);
  plans.keys.inverse(w.spec_q.data(), w.real.data());
  scatter_planes(w.real.data(), b, h, dk);
  return HeadStatus::ok;
}

// Throws for the first failed head (lowest b, then h), so the message is deterministic.
void report(const std::vector<HeadStatus>& statuses, int64_t H, double scale) {
  for (size_t job = 0; job < statuses.size(); ++job) {
    const int64_t b = static_cast<int64_t>(job) / H, h = static_cast<int64_t>(job) % H;
    switch (statuses[job]) {
      case HeadStatus::ok:
        continue;
      case HeadStatus::q_not_finite:
        throw_error("q: non-finite value (inf or NaN) in batch ", b, ", head ", h);
      case HeadStatus::k_not_finite:
        throw_error("k: non-finite value (inf or NaN) in batch ", b, ", head ", h);
      case HeadStatus::v_not_finite:
        throw_error("v: non-finite value (inf or NaN) in batch ", b, ", head ", h);
      case HeadStatus::dout_not_finite:
        throw_error("dout: non-finite value (inf or NaN) in batch ", b, ", head ", h);
      case HeadStatus::logits_overflow:
        throw_error("q, k: the logits overflow (not finite) in batch ", b, ", head ", h,
                    " with scale ", scale, "; q and k are too large for this scale");
    }
  }
}

template <typename T>
Shape check_inputs(View5<const T> q, View5<const T> k, View5<const T> v,
                   const Circulant2dOptions& options) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  const Shape s{q.dim(0), q.dim(1), q.dim(2), q.dim(3), q.dim(4), v.dim(4), q.dim(1) * q.dim(2),
                q.dim(1) * (q.dim(2) / 2 + 1)};
  check(s.Hg >= 1 && s.Wg >= 1, "q: the grid Hg x Wg must be non-empty, got shape ",
        shape_string(q.shape));
  check(s.D >= 1, "q: head dim D must be at least 1, got shape ", shape_string(q.shape));
  check(s.Dv >= 1, "v: value dim Dv must be at least 1, got shape ", shape_string(v.shape));
  check_shape(k, q.shape, "k");
  check_shape(v, {s.B, s.Hg, s.Wg, s.H, s.Dv}, "v");
  check(!options.scale || std::isfinite(*options.scale),
        "scale: must be finite, got ", options.scale.value_or(0.0));
  return s;
}

}  // namespace

double circulant2d_scale(const Circulant2dOptions& options, int64_t tokens, int64_t head_dim) {
  if (options.scale) return *options.scale;
  const double n = static_cast<double>(tokens);
  if (options.scale_mode == Circulant2dScaleMode::code) return 1.0 / std::sqrt(n);
  return 1.0 / (n * std::sqrt(static_cast<double>(head_dim)));
}

Grid circulant2d_grid_for_tokens(int64_t tokens) {
  check(tokens >= 1, "tokens: must be at least 1, got ", tokens);
  Grid grid{1, tokens};
  for (int64_t rows = 1; rows * rows <= tokens; ++rows)
    if (tokens % rows == 0) grid = {rows, tokens / rows};
  return grid;
}

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
  if (s.B * s.H == 0) return;
  const double scale = circulant2d_scale(options, s.N, s.D);
  const Plans<T> plans = make_plans<T>(s);
  Workspaces<T> workspaces(context, s, /*backward=*/false);
  std::vector<HeadStatus> statuses(static_cast<size_t>(s.B * s.H), HeadStatus::ok);
  parallel_for(context, s.B * s.H, [&](int64_t job) {
    statuses[job] = head_forward(plans, s, q, k, v, job / s.H, job % s.H,
                                 static_cast<T>(scale), out, weights, workspaces.local());
  });
  report(statuses, s.H, scale);
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
  if (s.B * s.H == 0) return;
  const double scale = circulant2d_scale(options, s.N, s.D);
  const Plans<T> plans = make_plans<T>(s);
  Workspaces<T> workspaces(context, s, /*backward=*/true);
  std::vector<HeadStatus> statuses(static_cast<size_t>(s.B * s.H), HeadStatus::ok);
  parallel_for(context, s.B * s.H, [&](int64_t job) {
    statuses[job] = head_backward(plans, s, q, k, v, dout, job / s.H, job % s.H,
                                  static_cast<T>(scale), dq, dk, dv, workspaces.local());
  });
  report(statuses, s.H, scale);
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
