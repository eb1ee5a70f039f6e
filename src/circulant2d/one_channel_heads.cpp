// 2D circulant attention with one-channel heads: a group of W heads per job, laid out
// [N, W] (token-major, the heads in the vector lanes) and transformed as W / 2 complex planes
// of head pairs; the spectral products separate each pair's two real spectra on the fly.
// O(N log N) per head like the general path, with 6 (forward) and 11 (backward) batched
// transforms per group instead of 6 and 11 single-plane ones per head. Reference:
// circulant2d_ref.h; math: README.md ("One-channel heads").
#include "circulant2d/one_channel_heads.h"

#include <omp.h>

#include <algorithm>
#include <complex>
#include <memory>
#include <utility>

#include "cpu/column_pairs.h"
#include "cpu/simd.h"
#include "subquad/buffer.h"
#include "subquad/fft.h"
#include "subquad/parallel.h"

namespace subquad::circulant2d_detail {
namespace {

// Floats of one [N, W] array of a job. The forward keeps 4 such arrays live, the backward 8;
// 16384 floats (64 KiB) keep them in a 512 KiB L2 (measured against 8192 and 32768: README).
constexpr int64_t kGroupFloats = 16384;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Vector operations on interleaved complex values (re, im, re, im, ...), a vector holding
// kLanes / 2 of them.
template <typename T>
struct ComplexLanes {
  using S = cpu::Simd<T>;
  using Vec = typename S::Vec;
  using IntVec = typename S::IntVec;
  static constexpr int kLanes = S::kLanes;

  template <typename F>
  static IntVec indices(F index) {
    return [&]<int... I>(std::integer_sequence<int, I...>) { return IntVec{index(I)...}; }
    (std::make_integer_sequence<int, kLanes>{});
  }
  static Vec real_parts(Vec v) {
    return __builtin_shuffle(v, indices([](int l) { return l & ~1; }));
  }
  static Vec imag_parts(Vec v) {
    return __builtin_shuffle(v, indices([](int l) { return l | 1; }));
  }
  static Vec swapped(Vec v) {
    return __builtin_shuffle(v, indices([](int l) { return l ^ 1; }));
  }
  // (-1, +1, -1, +1, ...) and (+1, -1, +1, -1, ...).
  static Vec minus_plus() {
    return [&]<int... I>(std::integer_sequence<int, I...>) {
      return Vec{(I % 2 ? T(1) : T(-1))...};
    }
    (std::make_integer_sequence<int, kLanes>{});
  }
  static Vec conj(Vec v) { return v * -minus_plus(); }
  static Vec times_i(Vec v) { return swapped(v) * minus_plus(); }  // i (a + ib) = -b + ia
  static Vec multiply(Vec p, Vec q) {
    return real_parts(p) * q + imag_parts(p) * swapped(q) * minus_plus();
  }
};

// One job's arrays (allocated once per thread, reused across its groups), each [N, W] real
// or [N, W / 2] packed head pairs, transformed in place.
template <typename T>
struct GroupWorkspace {
  using C = std::complex<T>;
  GroupWorkspace(int64_t N, int64_t W, bool backward)
      : spec_q(Buffer<C>::uninitialized(N * W / 2)),
        spec_k(Buffer<C>::uninitialized(N * W / 2)),
        z(Buffer<C>::uninitialized(N * W / 2)),
        spec_s(Buffer<C>::uninitialized(backward ? N * W / 2 : 0)),
        spec_v(Buffer<C>::uninitialized(backward ? N * W / 2 : 0)),
        spec_g(Buffer<C>::uninitialized(backward ? N * W / 2 : 0)),
        x(Buffer<C>::uninitialized(backward ? N * W / 2 : 0)) {}
  Buffer<C> spec_q;  // Q; forward: then the output
  Buffer<C> spec_k;  // K; forward: then V
  Buffer<C> z;       // logits, weights s (real); forward: then S
  Buffer<C> spec_s;  // S (backward)
  Buffer<C> spec_v;  // V, then dq (backward)
  Buffer<C> spec_g;  // G = fft2(dout), then dk (backward)
  Buffer<C> x;       // dv, ds, DA (backward)
};

template <typename T>
class GroupWorkspaces {
 public:
  GroupWorkspaces(const Context& context, int64_t N, int64_t W, bool backward)
      : N_(N), W_(W), backward_(backward), slots_(thread_count(context)) {}
  GroupWorkspace<T>& local() {
    auto& slot = slots_[omp_get_thread_num()];
    if (!slot) slot = std::make_unique<GroupWorkspace<T>>(N_, W_, backward_);
    return *slot;
  }

 private:
  int64_t N_, W_;
  bool backward_;
  std::vector<std::unique_ptr<GroupWorkspace<T>>> slots_;
};

struct Group {
  int64_t Hg, Wg, N, W;
  int64_t b, h0, count;  // heads h0 .. h0 + count - 1 of batch b; lanes past count are zero
};

// Tokens ahead that the head gathers and scatters prefetch: a group reads W of each
// token's H floats, lines H floats apart, which the hardware prefetcher does not follow
// (96 x 96, 192 heads: the copies took a quarter of the forward without it).
constexpr int64_t kPrefetchTokens = 16;

// x[b, :, :, h0 : h0 + count, 0] -> dst [N, W], zeros in lanes count .. W - 1.
template <typename T>
void gather_heads(View5<const T> x, const Group& g, T* dst) {
  using S = cpu::Simd<T>;
  const int64_t stride = x.strides[3];
  const int64_t token = x.strides[2], row = x.strides[1];
  const bool vectors = stride == 1 && g.count == g.W;
  for (int64_t i = 0; i < g.Hg; ++i)
    for (int64_t j = 0; j < g.Wg; ++j) {
      const T* src = x.row(g.b, i, j, g.h0);
      const int64_t ahead = j + kPrefetchTokens < g.Wg
                                ? kPrefetchTokens * token
                                : kPrefetchTokens * token - g.Wg * token + row;
      if (i + 1 < g.Hg || j + kPrefetchTokens < g.Wg)
        prefetch_segment(src + ahead, g.count * stride * int64_t(sizeof(T)), false);
      T* d = dst + (i * g.Wg + j) * g.W;
      if (vectors) {
        for (int64_t l = 0; l < g.W; l += S::kLanes) S::store(d + l, S::load(src + l));
        continue;
      }
      for (int64_t l = 0; l < g.count; ++l) d[l] = src[l * stride];
      std::fill(d + g.count, d + g.W, T(0));
    }
}

// src [N, W] lanes 0 .. count - 1 -> x[b, :, :, h0 : h0 + count, 0].
template <typename T>
void scatter_heads(const T* src, const Group& g, View5<T> x) {
  using S = cpu::Simd<T>;
  const int64_t stride = x.strides[3];
  const int64_t token = x.strides[2], row = x.strides[1];
  const bool vectors = stride == 1 && g.count == g.W;
  for (int64_t i = 0; i < g.Hg; ++i)
    for (int64_t j = 0; j < g.Wg; ++j) {
      T* d = x.row(g.b, i, j, g.h0);
      const int64_t ahead = j + kPrefetchTokens < g.Wg
                                ? kPrefetchTokens * token
                                : kPrefetchTokens * token - g.Wg * token + row;
      if (i + 1 < g.Hg || j + kPrefetchTokens < g.Wg)
        prefetch_segment(d + ahead, g.count * stride * int64_t(sizeof(T)), true);
      const T* s = src + (i * g.Wg + j) * g.W;
      if (vectors) {
        for (int64_t l = 0; l < g.W; l += S::kLanes) S::store(d + l, S::load(s + l));
        continue;
      }
      for (int64_t l = 0; l < g.count; ++l) d[l * stride] = s[l];
    }
}

// Marks `failure` on every head (lane < count) of x [N, W] holding a non-finite value whose
// status is still ok, and zeroes such lanes: the pair transforms would otherwise spread the
// value to the partner head. Checked on x while it is in cache (x * 0 is 0 for finite x).
template <typename T>
void isolate_non_finite(T* x, const Group& g, HeadStatus failure, HeadStatus* status) {
  using S = cpu::Simd<T>;
  constexpr int L = S::kLanes;
  for (int64_t c = 0; c < g.W; c += L) {
    typename S::Vec poison{};
    for (int64_t n = 0; n < g.N; ++n) poison += S::load(x + n * g.W + c) * T(0);
    for (int l = 0; l < L && c + l < g.count; ++l) {
      if (poison[l] == T(0)) continue;
      if (status[c + l] == HeadStatus::ok) status[c + l] = failure;
      for (int64_t n = 0; n < g.N; ++n) x[n * g.W + c + l] = T(0);
    }
  }
}

// x [N, W] <- softmax over n of every lane, max-subtracted, the normaliser summed in
// double. A lane whose logits are not finite (overflow) is marked and made uniform.
template <typename T>
void softmax_lanes(T* x, const Group& g, HeadStatus* status) {
  using S = cpu::Simd<T>;
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  typedef double Wide __attribute__((vector_size(sizeof(double) * L)));
  isolate_non_finite(x, g, HeadStatus::logits_overflow, status);
  const Vec log2e = S::splat(static_cast<T>(1.4426950408889634074));
  for (int64_t c = 0; c < g.W; c += L) {
    Vec max = S::load(x + c);
    for (int64_t n = 1; n < g.N; ++n) {
      const Vec a = S::load(x + n * g.W + c);
      max = a > max ? a : max;
    }
    Wide sum{};
    for (int64_t n = 0; n < g.N; ++n) {
      T* p = x + n * g.W + c;
      const Vec e = S::exp2((S::load(p) - max) * log2e);
      S::store(p, e);
      sum += __builtin_convertvector(e, Wide);
    }
    const Vec inverse = __builtin_convertvector(1.0 / sum, Vec);  // sum >= 1: exp(0) at the max
    for (int64_t n = 0; n < g.N; ++n) {
      T* p = x + n * g.W + c;
      S::store(p, S::load(p) * inverse);
    }
  }
}

// ds [N, W] <- s * (ds - <s, ds>) per lane (the softmax's backward), the dot in double.
template <typename T>
void softmax_backward_lanes(const T* s, T* ds, const Group& g) {
  using S = cpu::Simd<T>;
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  typedef double Wide __attribute__((vector_size(sizeof(double) * L)));
  for (int64_t c = 0; c < g.W; c += L) {
    Wide dot{};
    for (int64_t n = 0; n < g.N; ++n)
      dot += __builtin_convertvector(S::load(s + n * g.W + c), Wide) *
             __builtin_convertvector(S::load(ds + n * g.W + c), Wide);
    const Vec mean = __builtin_convertvector(dot, Vec);
    for (int64_t n = 0; n < g.N; ++n) {
      T* p = ds + n * g.W + c;
      S::store(p, S::load(s + n * g.W + c) * (S::load(p) - mean));
    }
  }
}

// z [N, W / 2] = factor (P_a + i P_b) for every head pair (a, b) packed in the spectra A, B
// [N, W / 2]: P_h = op(A_h) B_h, op = conj when `conjugate`, else identity. The real planes'
// spectra come out of a packed spectrum X as X_a[f] = (X[f] + conj X[-f]) / 2 and
// X_b[f] = -i (X[f] - conj X[-f]) / 2. With (u, u') = (conj A[f], A[-f]) when conjugating,
// else (A[f], conj A[-f]), and (y, y') = (B[f], conj B[-f]):
//   P_a + i P_b = ((u + u')(y + y') +- i (u - u')(y - y')) / 4,  + when conjugating.
// P_a and P_b are spectra of real planes, so the inverse of z is p_a + i p_b: [N, W] real.
template <typename T>
void pair_products(const std::complex<T>* A, const std::complex<T>* B, const Group& g,
                   bool conjugate, T factor, std::complex<T>* z) {
  using CL = ComplexLanes<T>;
  using S = typename CL::S;
  using Vec = typename CL::Vec;
  constexpr int L = CL::kLanes;
  const T* a = reinterpret_cast<const T*>(A);
  const T* b = reinterpret_cast<const T*>(B);
  T* out = reinterpret_cast<T*>(z);
  const Vec scale = S::splat(factor / 4);
  const T sign = conjugate ? T(1) : T(-1);
  for (int64_t i = 0; i < g.Hg; ++i) {
    const int64_t i_neg = (g.Hg - i) % g.Hg;
    for (int64_t j = 0; j < g.Wg; ++j) {
      const int64_t f = (i * g.Wg + j) * g.W, f_neg = (i_neg * g.Wg + (g.Wg - j) % g.Wg) * g.W;
      for (int64_t c = 0; c < g.W; c += L) {
        const Vec a_f = S::load(a + f + c), a_neg = S::load(a + f_neg + c);
        const Vec u = conjugate ? CL::conj(a_f) : a_f;
        const Vec u_neg = conjugate ? a_neg : CL::conj(a_neg);
        const Vec y = S::load(b + f + c), y_neg = CL::conj(S::load(b + f_neg + c));
        const Vec even = CL::multiply(u + u_neg, y + y_neg);
        const Vec odd = CL::multiply(u - u_neg, y - y_neg);
        S::store(out + f + c, (even + sign * CL::times_i(odd)) * scale);
      }
    }
  }
}

template <typename T>
T* as_real(std::complex<T>* x) {
  return reinterpret_cast<T*>(x);
}

// Gathers heads of x into `planes` [N, W], isolates non-finite heads, and transforms the
// planes in place (in-place plans: measured 1.1-1.5x faster than out-of-place here).
template <typename T>
void gather_and_transform(const ComplexFftPlan<T>& plan, View5<const T> x, const Group& g,
                          HeadStatus failure, std::complex<T>* planes, HeadStatus* status) {
  gather_heads(x, g, as_real(planes));
  isolate_non_finite(as_real(planes), g, failure, status);
  plan.forward(planes, planes);
}

// Logits and softmax of a group: leaves the packed spectra of q and k in spec_q, spec_k and
// the weights s [N, W] in `weights`.
template <typename T>
void group_weights(const ComplexFftPlan<T>& plan, const Group& g, View5<const T> q,
                   View5<const T> k, T scale, std::complex<T>* spec_q, std::complex<T>* spec_k,
                   std::complex<T>* weights, HeadStatus* status) {
  gather_and_transform(plan, q, g, HeadStatus::q_not_finite, spec_q, status);
  gather_and_transform(plan, k, g, HeadStatus::k_not_finite, spec_k, status);
  // a_h = c corr(q_h, k_h) = (c / N) ifft2(conj(Q_h) K_h).
  pair_products(spec_q, spec_k, g, true, static_cast<T>(scale / g.N), weights);
  plan.inverse(weights, weights);
  softmax_lanes(as_real(weights), g, status);
}

template <typename T>
void group_forward(const ComplexFftPlan<T>& plan, Group g, View5<const T> q, View5<const T> k,
                   View5<const T> v, T scale, View5<T> out, View4<T> weights, GroupWorkspace<T>& w,
                   HeadStatus* status) {
  std::complex<T>*a = w.spec_q.data(), *b = w.spec_k.data(), *z = w.z.data();
  group_weights(plan, g, q, k, scale, a, b, z, status);
  if (!weights.empty()) {
    const T* s = as_real(z);
    for (int64_t l = 0; l < g.count; ++l)
      for (int64_t i = 0; i < g.Hg; ++i) {
        T* row = weights.row(g.b, g.h0 + l, i);
        for (int64_t j = 0; j < g.Wg; ++j) row[j] = s[(i * g.Wg + j) * g.W + l];
      }
  }
  plan.forward(z, z);                                                     // S
  gather_and_transform(plan, v, g, HeadStatus::v_not_finite, b, status);  // V
  // out_h = corr(s_h, v_h) = (1 / N) ifft2(conj(S_h) V_h).
  pair_products(z, b, g, true, static_cast<T>(1.0 / g.N), a);
  plan.inverse(a, a);
  scatter_heads(as_real(a), g, out);
}

template <typename T>
void group_backward(const ComplexFftPlan<T>& plan, Group g, View5<const T> q, View5<const T> k,
                    View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                    View5<T> dv, GroupWorkspace<T>& w, HeadStatus* status) {
  std::complex<T>*spec_q = w.spec_q.data(), *spec_k = w.spec_k.data(), *s = w.z.data();
  std::complex<T>*spec_s = w.spec_s.data(), *spec_v = w.spec_v.data(), *spec_g = w.spec_g.data();
  std::complex<T>* x = w.x.data();
  group_weights(plan, g, q, k, scale, spec_q, spec_k, s, status);
  const T inverse_n = static_cast<T>(1.0 / g.N);
  std::copy_n(s, g.N * g.W / 2, spec_s);
  plan.forward(spec_s, spec_s);                                                      // S
  gather_and_transform(plan, v, g, HeadStatus::v_not_finite, spec_v, status);        // V
  gather_and_transform(plan, dout, g, HeadStatus::dout_not_finite, spec_g, status);  // G

  // In the forward: out = corr(s, v). So dv = conv(s, dout) = (1 / N) ifft2(S G) per head,
  pair_products(spec_s, spec_g, g, false, inverse_n, x);
  plan.inverse(x, x);
  scatter_heads(as_real(x), g, dv);
  // and ds = corr(dout, v) = (1 / N) ifft2(conj(G) V).
  pair_products(spec_g, spec_v, g, true, inverse_n, x);
  plan.inverse(x, x);
  // s = softmax(a): da = s * (ds - <s, ds>).
  softmax_backward_lanes(as_real(s), as_real(x), g);
  plan.forward(x, x);  // DA
  // a = c corr(q, k): dq = c corr(da, k) = (c / N) ifft2(conj(DA) K),
  // dk = c conv(da, q) = (c / N) ifft2(DA Q).
  const T factor = static_cast<T>(scale / g.N);
  pair_products(x, spec_k, g, true, factor, spec_v);
  plan.inverse(spec_v, spec_v);
  scatter_heads(as_real(spec_v), g, dq);
  pair_products(x, spec_q, g, false, factor, spec_g);
  plan.inverse(spec_g, spec_g);
  scatter_heads(as_real(spec_g), g, dk);
}

// The batched plan of a group: W / 2 planes of head pairs, element (i, j) of pair p at
// (i Wg + j) W / 2 + p.
template <typename T>
ComplexFftPlan<T> group_plan(int64_t Hg, int64_t Wg, int64_t W) {
  ComplexFftLayout layout;
  layout.rank = 2;
  layout.n0 = Hg;
  layout.n1 = Wg;
  layout.batch = W / 2;
  layout.stride = W / 2;
  layout.distance = 1;
  layout.in_place = true;
  return ComplexFftPlan<T>::get(layout);
}

// Runs body(group, workspace, statuses of the group's heads) for every (batch, group).
template <typename T, typename Body>
void for_each_group(const Context& context, View5<const T> q, bool backward,
                    std::vector<HeadStatus>& statuses, Body&& body) {
  const int64_t B = q.dim(0), Hg = q.dim(1), Wg = q.dim(2), H = q.dim(3), N = Hg * Wg;
  const int64_t W = one_channel_group_width<T>(N, H), groups = ceil_div(H, W);
  const ComplexFftPlan<T> plan = group_plan<T>(Hg, Wg, W);
  GroupWorkspaces<T> workspaces(context, N, W, backward);
  parallel_for(context, B * groups, [&](int64_t job) {
    const int64_t b = job / groups, h0 = (job % groups) * W;
    const Group g{Hg, Wg, N, W, b, h0, std::min(W, H - h0)};
    body(plan, g, workspaces.local(), statuses.data() + b * H + h0);
  });
}

}  // namespace

template <typename T>
int64_t one_channel_group_width(int64_t N, int64_t H) {
  constexpr int64_t L = cpu::Simd<T>::kLanes;
  const int64_t widest = std::max(L, kGroupFloats / N / L * L);
  const int64_t groups = ceil_div(ceil_div(H, L) * L, widest);
  return ceil_div(ceil_div(H, groups), L) * L;
}

template <typename T>
void one_channel_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, T scale, View5<T> out, View4<T> weights,
                         std::vector<HeadStatus>& statuses) {
  for_each_group<T>(
      context, q, false, statuses,
      [&](const ComplexFftPlan<T>& plan, const Group& g, GroupWorkspace<T>& w, HeadStatus* status) {
        group_forward(plan, g, q, k, v, scale, out, weights, w, status);
      });
}

template <typename T>
void one_channel_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                          View5<T> dv, std::vector<HeadStatus>& statuses) {
  for_each_group<T>(
      context, q, true, statuses,
      [&](const ComplexFftPlan<T>& plan, const Group& g, GroupWorkspace<T>& w, HeadStatus* status) {
        group_backward(plan, g, q, k, v, dout, scale, dq, dk, dv, w, status);
      });
}

#define SUBQUAD_INSTANTIATE(T)                                                                 \
  template int64_t one_channel_group_width<T>(int64_t, int64_t);                               \
  template void one_channel_forward<T>(const Context&, View5<const T>, View5<const T>,         \
                                       View5<const T>, T, View5<T>, View4<T>,                  \
                                       std::vector<HeadStatus>&);                              \
  template void one_channel_backward<T>(const Context&, View5<const T>, View5<const T>,        \
                                        View5<const T>, View5<const T>, T, View5<T>, View5<T>, \
                                        View5<T>, std::vector<HeadStatus>&);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad::circulant2d_detail
