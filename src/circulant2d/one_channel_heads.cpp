// 2D circulant attention with one-channel heads: a group of W heads per job, gathered into
// W / 2 contiguous complex planes of head pairs x_h + i x_{h+1} ([W / 2, N]) and transformed
// by one batched plan; the spectral products separate each pair's two real spectra on the fly
// and the softmax runs along the planes (a vector holds tokens of two heads).
// O(N log N) per head like the general path, with 6 (forward) and 11 (backward) batched
// transforms per group instead of 6 and 11 single-plane ones per head. Reference:
// circulant2d_ref.h; math: README.md ("One-channel heads").
#include "circulant2d/one_channel_heads.h"

#include <algorithm>
#include <complex>
#include <limits>
#include <utility>

#include "common/fft.h"
#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/column_pairs.h"
#include "cpu/simd.h"
#include "cpu/thread_scratch.h"

namespace subquad::circulant2d_detail {
namespace {

// Floats of one [W / 2, N] array of a job: the forward keeps 3 such arrays live, the
// backward 7; 16384 floats (64 KiB) keep them near a 512 KiB L2.
constexpr int64_t kGroupFloats = 16384;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A vector of L doubles (sums of float lanes accumulated in double).
template <int L>
struct WideOf {
  typedef double type __attribute__((vector_size(sizeof(double) * L)));
};

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
  // The complex values in reverse order (lanes 2c, 2c + 1 from 2 (V - 1 - c), ...).
  static Vec reversed(Vec v) {
    return __builtin_shuffle(v,
                             indices([](int l) { return (kLanes / 2 - 1 - l / 2) * 2 + l % 2; }));
  }
  static Vec conj(Vec v) { return v * -minus_plus(); }
  static Vec times_i(Vec v) { return swapped(v) * minus_plus(); }  // i (a + ib) = -b + ia
  static Vec multiply(Vec p, Vec q) {
    return real_parts(p) * q + imag_parts(p) * swapped(q) * minus_plus();
  }
};

// One job's arrays (one block per thread from the call's workspace frame, reused across its
// groups), each W / 2 planes [W / 2, N] of packed head pairs (or the real values of two
// heads), transformed in place.
template <typename T>
struct GroupWorkspace {
  using C = std::complex<T>;
  C* spec_q;  // Q; forward: then the output
  C* spec_k;  // K; forward: then V
  C* z;       // logits, weights s (real); forward: then S
  C* spec_s;  // S (backward)
  C* spec_v;  // V, then dq (backward)
  C* spec_g;  // G = fft2(dout), then dk (backward)
  C* x;       // dv, ds, DA (backward)
};

template <typename T>
class GroupWorkspaces {
 public:
  // 3 arrays of N * W / 2 per thread forward, 7 backward.
  GroupWorkspaces(WorkspaceFrame& frame, const Context& context, int64_t N, int64_t W,
                  bool backward)
      : plane_(N * W / 2), backward_(backward),
        arrays_(frame, context, (backward ? 7 : 3) * plane_) {}
  GroupWorkspace<T> local() const {
    std::complex<T>* a = arrays_.get();
    const int64_t p = plane_;
    if (!backward_) return {a, a + p, a + 2 * p, nullptr, nullptr, nullptr, nullptr};
    return {a, a + p, a + 2 * p, a + 3 * p, a + 4 * p, a + 5 * p, a + 6 * p};
  }

 private:
  int64_t plane_;  // elements of one array
  bool backward_;
  cpu::ThreadScratch<std::complex<T>> arrays_;
};

struct Group {
  int64_t Hg, Wg, N, W;
  int64_t b, h0, count;  // heads h0 .. h0 + count - 1 of batch b; lanes past count are zero
};

// Tokens ahead that the head gathers and scatters prefetch: a group reads W of each
// token's H floats, lines H floats apart, which the hardware prefetcher does not follow
// (96 x 96, 192 heads: the copies took a quarter of the forward without it).
constexpr int64_t kPrefetchTokens = 16;

// Offset of the token kPrefetchTokens after (i, j) in x, or -1 past the grid's end.
template <typename T>
int64_t prefetch_offset(const View5<T>& x, const Group& g, int64_t i, int64_t j) {
  if (j + kPrefetchTokens < g.Wg) return kPrefetchTokens * x.strides[2];
  if (i + 1 < g.Hg) return x.strides[1] + (kPrefetchTokens - g.Wg) * x.strides[2];
  return -1;
}

// x[b, :, :, h0 : h0 + count, 0] -> planes [W / 2, N]: plane p holds heads h0 + 2p (real
// part) and h0 + 2p + 1 (imaginary part); heads past count are zero.
template <typename T>
void gather_planes(View5<const T> x, const Group& g, std::complex<T>* planes) {
  const int64_t stride = x.strides[3], P = g.W / 2;
  const bool whole = stride == 1 && g.count == g.W;
  for (int64_t i = 0; i < g.Hg; ++i)
    for (int64_t j = 0; j < g.Wg; ++j) {
      const T* src = x.row(g.b, i, j, g.h0);
      const int64_t ahead = prefetch_offset(x, g, i, j);
      if (ahead >= 0) prefetch_segment(src + ahead, g.count * stride * int64_t(sizeof(T)), false);
      std::complex<T>* d = planes + i * g.Wg + j;
      if (whole) {
        for (int64_t p = 0; p < P; ++p) d[p * g.N] = {src[2 * p], src[2 * p + 1]};
        continue;
      }
      for (int64_t p = 0; p < P; ++p)
        d[p * g.N] = {2 * p < g.count ? src[2 * p * stride] : T(0),
                      2 * p + 1 < g.count ? src[(2 * p + 1) * stride] : T(0)};
    }
}

// planes [W / 2, N] heads 0 .. count - 1 -> x[b, :, :, h0 : h0 + count, 0].
template <typename T>
void scatter_planes(const std::complex<T>* planes, const Group& g, View5<T> x) {
  const int64_t stride = x.strides[3];
  for (int64_t i = 0; i < g.Hg; ++i)
    for (int64_t j = 0; j < g.Wg; ++j) {
      T* d = x.row(g.b, i, j, g.h0);
      const int64_t ahead = prefetch_offset(x, g, i, j);
      if (ahead >= 0) prefetch_segment(d + ahead, g.count * stride * int64_t(sizeof(T)), true);
      const std::complex<T>* s = planes + i * g.Wg + j;
      for (int64_t l = 0; l < g.count; ++l) {
        const std::complex<T> pair = s[(l / 2) * g.N];
        d[l * stride] = l % 2 ? pair.imag() : pair.real();
      }
    }
}

// Runs body(index, value) over the 2 N reals of a plane [N] complex: vectors of kLanes
// (f(Vec) -> Vec stored back when `store`), then the scalar tail (g(T, parity) -> T).
// Lanes alternate between the plane's two heads (even: real part, odd: imaginary part).
template <typename T, typename VectorBody, typename ScalarBody>
void for_plane(T* x, int64_t N, bool store, VectorBody&& vector_body, ScalarBody&& scalar_body) {
  using S = cpu::Simd<T>;
  const int64_t reals = 2 * N, full = reals / S::kLanes * S::kLanes;
  for (int64_t r = 0; r < full; r += S::kLanes) {
    const typename S::Vec y = vector_body(S::load(x + r));
    if (store) S::store(x + r, y);
  }
  for (int64_t r = full; r < reals; ++r) {
    const T y = scalar_body(x[r], static_cast<int>(r % 2));
    if (store) x[r] = y;
  }
}

// A vector whose even lanes are `even` and odd lanes `odd`.
template <typename T>
typename cpu::Simd<T>::Vec alternating(T even, T odd) {
  typename cpu::Simd<T>::Vec v;
  for (int l = 0; l < cpu::Simd<T>::kLanes; ++l) v[l] = l % 2 ? odd : even;
  return v;
}

// Marks `failure` on every head (< count) of planes [W / 2, N] holding a non-finite value
// whose status is still ok, and zeroes its part of the plane: the pair transform would
// otherwise spread the value to the partner head. Checked while the planes are in cache
// (x * 0 is 0 for finite x).
template <typename T>
void isolate_non_finite_planes(std::complex<T>* planes, const Group& g, HeadStatus failure,
                               HeadStatus* status) {
  using S = cpu::Simd<T>;
  for (int64_t p = 0; 2 * p < g.count; ++p) {
    T* x = reinterpret_cast<T*>(planes + p * g.N);
    typename S::Vec poison{};
    T tail[2] = {0, 0};
    for_plane(
        x, g.N, false, [&](typename S::Vec v) { return poison += v * T(0); },
        [&](T v, int parity) { return tail[parity] += v * T(0); });
    for (int part = 0; part < 2 && 2 * p + part < g.count; ++part) {
      T sum = tail[part];
      for (int l = part; l < S::kLanes; l += 2) sum += poison[l];
      if (sum == T(0)) continue;
      if (status[2 * p + part] == HeadStatus::ok) status[2 * p + part] = failure;
      for (int64_t n = 0; n < g.N; ++n) x[2 * n + part] = T(0);
    }
  }
}

// planes [W / 2, N] <- softmax over n of each of their heads (real and imaginary parts),
// max-subtracted, the normaliser summed in double. A head whose logits are not finite
// (overflow) is marked and made uniform.
template <typename T>
void softmax_planes(std::complex<T>* planes, const Group& g, HeadStatus* status) {
  using S = cpu::Simd<T>;
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  using Wide = typename WideOf<L>::type;
  isolate_non_finite_planes(planes, g, HeadStatus::logits_overflow, status);
  const T log2e = static_cast<T>(1.4426950408889634074);
  const T lowest = -std::numeric_limits<T>::infinity();
  for (int64_t p = 0; p < g.W / 2; ++p) {
    T* x = reinterpret_cast<T*>(planes + p * g.N);
    Vec vmax = S::splat(lowest);
    T max[2] = {lowest, lowest};
    for_plane(
        x, g.N, false, [&](Vec v) { return vmax = v > vmax ? v : vmax; },
        [&](T v, int parity) { return max[parity] = std::max(max[parity], v); });
    for (int l = 0; l < L; ++l) max[l % 2] = std::max(max[l % 2], vmax[l]);
    const Vec shift = alternating(max[0], max[1]);
    Wide wide{};
    double sum[2] = {0, 0};
    for_plane(
        x, g.N, true,
        [&](Vec v) {
          const Vec e = S::exp2((v - shift) * log2e);
          wide += __builtin_convertvector(e, Wide);
          return e;
        },
        [&](T v, int parity) {
          const T e = S::exp2(S::splat((v - max[parity]) * log2e))[0];
          sum[parity] += e;
          return e;
        });
    for (int l = 0; l < L; ++l) sum[l % 2] += wide[l];
    // sum >= 1: exp(0) at the max.
    const T inverse[2] = {static_cast<T>(1.0 / sum[0]), static_cast<T>(1.0 / sum[1])};
    const Vec scale = alternating(inverse[0], inverse[1]);
    for_plane(
        x, g.N, true, [&](Vec v) { return v * scale; },
        [&](T v, int parity) { return v * inverse[parity]; });
  }
}

// ds <- s * (ds - <s, ds>) per head of planes [W / 2, N] (the softmax's backward), the dot
// in double.
template <typename T>
void softmax_backward_planes(const std::complex<T>* s_planes, std::complex<T>* ds_planes,
                             const Group& g) {
  using S = cpu::Simd<T>;
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  using Wide = typename WideOf<L>::type;
  for (int64_t p = 0; p < g.W / 2; ++p) {
    const T* s = reinterpret_cast<const T*>(s_planes + p * g.N);
    T* ds = reinterpret_cast<T*>(ds_planes + p * g.N);
    const int64_t reals = 2 * g.N, full = reals / L * L;
    Wide wide{};
    for (int64_t r = 0; r < full; r += L)
      wide += __builtin_convertvector(S::load(s + r), Wide) *
              __builtin_convertvector(S::load(ds + r), Wide);
    double dot[2] = {0, 0};
    for (int64_t r = full; r < reals; ++r) dot[r % 2] += static_cast<double>(s[r]) * ds[r];
    for (int l = 0; l < L; ++l) dot[l % 2] += wide[l];
    const T mean[2] = {static_cast<T>(dot[0]), static_cast<T>(dot[1])};
    const Vec means = alternating(mean[0], mean[1]);
    for (int64_t r = 0; r < full; r += L)
      S::store(ds + r, S::load(s + r) * (S::load(ds + r) - means));
    for (int64_t r = full; r < reals; ++r) ds[r] = s[r] * (ds[r] - mean[r % 2]);
  }
}

// z [W / 2, N] = factor (P_a + i P_b) for every head pair (a, b) packed in the planes of the
// spectra A, B [W / 2, N]: P_h = op(A_h) B_h, op = conj when `conjugate`, else identity. The
// real planes' spectra come out of a packed spectrum X as X_a[f] = (X[f] + conj X[-f]) / 2
// and X_b[f] = -i (X[f] - conj X[-f]) / 2. With (u, u') = (conj A[f], A[-f]) when
// conjugating, else (A[f], conj A[-f]), and (y, y') = (B[f], conj B[-f]):
//   P_a + i P_b = ((u + u')(y + y') +- i (u - u')(y - y')) / 4,  + when conjugating.
// P_a and P_b are spectra of real planes, so the inverse of z is p_a + i p_b. Along a row,
// -f runs backwards: (i, j) -> (-i, Wg - j) for j >= 1, read as reversed vectors.
template <typename T>
void pair_products_planes(const std::complex<T>* A, const std::complex<T>* B, const Group& g,
                          bool conjugate, T factor, std::complex<T>* z) {
  using CL = ComplexLanes<T>;
  using S = typename CL::S;
  using Vec = typename CL::Vec;
  constexpr int64_t V = CL::kLanes / 2;  // complex values per vector
  const Vec scale = S::splat(factor / 4);
  const T sign = conjugate ? T(1) : T(-1);
  // One element in scalar arithmetic (std::complex's operator* takes a slow NaN path).
  const auto scalar = [&](std::complex<T> a_f, std::complex<T> a_neg, std::complex<T> b_f,
                          std::complex<T> b_neg) {
    const std::complex<T> u = conjugate ? std::conj(a_f) : a_f;
    const std::complex<T> u_neg = conjugate ? a_neg : std::conj(a_neg);
    const std::complex<T> y_neg = std::conj(b_neg);
    const T er = u.real() + u_neg.real(), ei = u.imag() + u_neg.imag();
    const T fr = b_f.real() + y_neg.real(), fi = b_f.imag() + y_neg.imag();
    const T dr = u.real() - u_neg.real(), di = u.imag() - u_neg.imag();
    const T gr = b_f.real() - y_neg.real(), gi = b_f.imag() - y_neg.imag();
    const T even_r = er * fr - ei * fi, even_i = er * fi + ei * fr;
    const T odd_r = dr * gr - di * gi, odd_i = dr * gi + di * gr;
    // even + sign i odd
    return std::complex<T>((even_r - sign * odd_i) * (factor / 4),
                           (even_i + sign * odd_r) * (factor / 4));
  };
  for (int64_t p = 0; p < g.W / 2; ++p) {
    const std::complex<T>* a = A + p * g.N;
    const std::complex<T>* b = B + p * g.N;
    std::complex<T>* out = z + p * g.N;
    for (int64_t i = 0; i < g.Hg; ++i) {
      const int64_t row = i * g.Wg, row_neg = ((g.Hg - i) % g.Hg) * g.Wg;
      out[row] = scalar(a[row], a[row_neg], b[row], b[row_neg]);  // j = 0: -j = 0
      int64_t j = 1;
      for (; j + V <= g.Wg; j += V) {
        // Columns j .. j + V - 1 and their negatives Wg - j .. Wg - j - V + 1.
        const int64_t neg = row_neg + g.Wg - j - V + 1;
        const Vec a_f = S::load(reinterpret_cast<const T*>(a + row + j));
        const Vec a_neg = CL::reversed(S::load(reinterpret_cast<const T*>(a + neg)));
        const Vec u = conjugate ? CL::conj(a_f) : a_f;
        const Vec u_neg = conjugate ? a_neg : CL::conj(a_neg);
        const Vec y = S::load(reinterpret_cast<const T*>(b + row + j));
        const Vec y_neg = CL::conj(CL::reversed(S::load(reinterpret_cast<const T*>(b + neg))));
        const Vec even = CL::multiply(u + u_neg, y + y_neg);
        const Vec odd = CL::multiply(u - u_neg, y - y_neg);
        S::store(reinterpret_cast<T*>(out + row + j), (even + sign * CL::times_i(odd)) * scale);
      }
      for (; j < g.Wg; ++j)
        out[row + j] = scalar(a[row + j], a[row_neg + g.Wg - j], b[row + j], b[row_neg + g.Wg - j]);
    }
  }
}

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
void isolate_non_finite_lanes(T* x, const Group& g, HeadStatus failure, HeadStatus* status) {
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
  using Wide = typename WideOf<L>::type;
  isolate_non_finite_lanes(x, g, HeadStatus::logits_overflow, status);
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
  using Wide = typename WideOf<L>::type;
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
void pair_products_lanes(const std::complex<T>* A, const std::complex<T>* B, const Group& g,
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
template <typename T>
const T* as_real(const std::complex<T>* x) {
  return reinterpret_cast<const T*>(x);
}

// Below this many tokens a group's arrays are token-major, [N, W] with the heads in the
// vector lanes (FFTW vectorises across the pairs; the products and softmax across heads);
// from it on they are contiguous planes [W / 2, N] (FFTW's plane transforms, no buffered
// copies). Measured (one thread, 192 heads, forward): token-major 1.3x faster at 14 x 14,
// the two equal at 32 x 32, planes 1.8x faster at 96 x 96 (README).
constexpr int64_t kPlaneMajorTokens = 2048;

bool plane_major(int64_t N, OneChannelLayout layout) {
  if (layout == OneChannelLayout::automatic) return N >= kPlaneMajorTokens;
  return layout == OneChannelLayout::plane_major;
}

struct TokenMajor {
  template <typename T>
  static void gather(View5<const T> x, const Group& g, std::complex<T>* a) {
    gather_heads(x, g, as_real(a));
  }
  template <typename T>
  static void scatter(const std::complex<T>* a, const Group& g, View5<T> x) {
    scatter_heads(as_real(a), g, x);
  }
  template <typename T>
  static void isolate(std::complex<T>* a, const Group& g, HeadStatus failure, HeadStatus* status) {
    isolate_non_finite_lanes(as_real(a), g, failure, status);
  }
  template <typename T>
  static void softmax(std::complex<T>* a, const Group& g, HeadStatus* status) {
    softmax_lanes(as_real(a), g, status);
  }
  template <typename T>
  static void softmax_backward(const std::complex<T>* s, std::complex<T>* ds, const Group& g) {
    softmax_backward_lanes(as_real(s), as_real(ds), g);
  }
  template <typename T>
  static void products(const std::complex<T>* a, const std::complex<T>* b, const Group& g,
                       bool conjugate, T factor, std::complex<T>* z) {
    pair_products_lanes(a, b, g, conjugate, factor, z);
  }
  // Head l at token n of real values stored in a.
  template <typename T>
  static T value(const std::complex<T>* a, const Group& g, int64_t l, int64_t n) {
    return as_real(a)[n * g.W + l];
  }
  static ComplexFftLayout layout(int64_t W) {  // element (i, j) of pair p at (i Wg + j) W / 2 + p
    ComplexFftLayout layout;
    layout.batch = W / 2;
    layout.stride = W / 2;
    layout.distance = 1;
    return layout;
  }
};

struct PlaneMajor {
  template <typename T>
  static void gather(View5<const T> x, const Group& g, std::complex<T>* a) {
    gather_planes(x, g, a);
  }
  template <typename T>
  static void scatter(const std::complex<T>* a, const Group& g, View5<T> x) {
    scatter_planes(a, g, x);
  }
  template <typename T>
  static void isolate(std::complex<T>* a, const Group& g, HeadStatus failure, HeadStatus* status) {
    isolate_non_finite_planes(a, g, failure, status);
  }
  template <typename T>
  static void softmax(std::complex<T>* a, const Group& g, HeadStatus* status) {
    softmax_planes(a, g, status);
  }
  template <typename T>
  static void softmax_backward(const std::complex<T>* s, std::complex<T>* ds, const Group& g) {
    softmax_backward_planes(s, ds, g);
  }
  template <typename T>
  static void products(const std::complex<T>* a, const std::complex<T>* b, const Group& g,
                       bool conjugate, T factor, std::complex<T>* z) {
    pair_products_planes(a, b, g, conjugate, factor, z);
  }
  template <typename T>
  static T value(const std::complex<T>* a, const Group& g, int64_t l, int64_t n) {
    return as_real(a + (l / 2) * g.N)[2 * n + l % 2];
  }
  static ComplexFftLayout layout(int64_t W) {  // contiguous planes [W / 2, Hg, Wg]
    ComplexFftLayout layout;
    layout.batch = W / 2;
    return layout;
  }
};

// Gathers heads of x into `planes`, isolates non-finite heads, and transforms the planes in
// place (in-place plans: measured 1.1-1.5x faster than out-of-place).
template <typename Layout, typename T>
void gather_and_transform(const ComplexFftPlan<T>& plan, View5<const T> x, const Group& g,
                          HeadStatus failure, std::complex<T>* planes, HeadStatus* status) {
  Layout::gather(x, g, planes);
  Layout::isolate(planes, g, failure, status);
  plan.forward(planes, planes);
}

// Logits and softmax of a group: leaves the packed spectra of q and k in spec_q, spec_k and
// the weights s [N, W] in `weights`.
template <typename Layout, typename T>
void group_weights(const ComplexFftPlan<T>& plan, const Group& g, View5<const T> q,
                   View5<const T> k, T scale, std::complex<T>* spec_q, std::complex<T>* spec_k,
                   std::complex<T>* weights, HeadStatus* status) {
  gather_and_transform<Layout>(plan, q, g, HeadStatus::q_not_finite, spec_q, status);
  gather_and_transform<Layout>(plan, k, g, HeadStatus::k_not_finite, spec_k, status);
  // a_h = c corr(q_h, k_h) = (c / N) ifft2(conj(Q_h) K_h).
  Layout::products(spec_q, spec_k, g, true, static_cast<T>(scale / g.N), weights);
  plan.inverse(weights, weights);
  Layout::softmax(weights, g, status);
}

template <typename Layout, typename T>
void group_forward(const ComplexFftPlan<T>& plan, Group g, View5<const T> q, View5<const T> k,
                   View5<const T> v, T scale, View5<T> out, View4<T> weights,
                   const GroupWorkspace<T>& w, HeadStatus* status) {
  std::complex<T>*a = w.spec_q, *b = w.spec_k, *z = w.z;
  group_weights<Layout>(plan, g, q, k, scale, a, b, z, status);
  if (!weights.empty()) {
    for (int64_t l = 0; l < g.count; ++l)
      for (int64_t i = 0; i < g.Hg; ++i) {
        T* row = weights.row(g.b, g.h0 + l, i);
        for (int64_t j = 0; j < g.Wg; ++j) row[j] = Layout::value(z, g, l, i * g.Wg + j);
      }
  }
  plan.forward(z, z);                                                             // S
  gather_and_transform<Layout>(plan, v, g, HeadStatus::v_not_finite, b, status);  // V
  // out_h = corr(s_h, v_h) = (1 / N) ifft2(conj(S_h) V_h).
  Layout::products(z, b, g, true, static_cast<T>(1.0 / g.N), a);
  plan.inverse(a, a);
  Layout::scatter(a, g, out);
}

template <typename Layout, typename T>
void group_backward(const ComplexFftPlan<T>& plan, Group g, View5<const T> q, View5<const T> k,
                    View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                    View5<T> dv, const GroupWorkspace<T>& w, HeadStatus* status) {
  std::complex<T>*spec_q = w.spec_q, *spec_k = w.spec_k, *s = w.z;
  std::complex<T>*spec_s = w.spec_s, *spec_v = w.spec_v, *spec_g = w.spec_g;
  std::complex<T>* x = w.x;
  group_weights<Layout>(plan, g, q, k, scale, spec_q, spec_k, s, status);
  const T inverse_n = static_cast<T>(1.0 / g.N);
  std::copy_n(s, g.N * g.W / 2, spec_s);
  plan.forward(spec_s, spec_s);                                                              // S
  gather_and_transform<Layout>(plan, v, g, HeadStatus::v_not_finite, spec_v, status);        // V
  gather_and_transform<Layout>(plan, dout, g, HeadStatus::dout_not_finite, spec_g, status);  // G

  // In the forward: out = corr(s, v). So dv = conv(s, dout) = (1 / N) ifft2(S G) per head,
  Layout::products(spec_s, spec_g, g, false, inverse_n, x);
  plan.inverse(x, x);
  Layout::scatter(x, g, dv);
  // and ds = corr(dout, v) = (1 / N) ifft2(conj(G) V).
  Layout::products(spec_g, spec_v, g, true, inverse_n, x);
  plan.inverse(x, x);
  // s = softmax(a): da = s * (ds - <s, ds>).
  Layout::softmax_backward(s, x, g);
  plan.forward(x, x);  // DA
  // a = c corr(q, k): dq = c corr(da, k) = (c / N) ifft2(conj(DA) K),
  // dk = c conv(da, q) = (c / N) ifft2(DA Q).
  const T factor = static_cast<T>(scale / g.N);
  Layout::products(x, spec_k, g, true, factor, spec_v);
  plan.inverse(spec_v, spec_v);
  Layout::scatter(spec_v, g, dq);
  Layout::products(x, spec_q, g, false, factor, spec_g);
  plan.inverse(spec_g, spec_g);
  Layout::scatter(spec_g, g, dk);
}

// Runs body(layout, plan, group, workspace, statuses of the group's heads) for every
// (batch, group), with the layout of the grid's size.
template <typename T, typename Body>
void for_each_group(const Context& context, View5<const T> q, bool backward,
                    OneChannelLayout choice, HeadStatus* statuses, Body&& body) {
  const int64_t B = q.dim(0), Hg = q.dim(1), Wg = q.dim(2), H = q.dim(3), N = Hg * Wg;
  const int64_t W = one_channel_group_width<T>(N, H, choice), groups = ceil_div(H, W);
  const auto run = [&](auto layout) {
    ComplexFftLayout plan_layout = decltype(layout)::layout(W);
    plan_layout.rank = 2;
    plan_layout.n0 = Hg;
    plan_layout.n1 = Wg;
    plan_layout.in_place = true;
    const ComplexFftPlan<T> plan = ComplexFftPlan<T>::get(plan_layout);
    WorkspaceFrame frame(context);  // the arrays: none allocated with a workspace
    const GroupWorkspaces<T> workspaces(frame, context, N, W, backward);
    parallel_for(context, B * groups, [&](int64_t job) {
      const int64_t b = job / groups, h0 = (job % groups) * W;
      const Group g{Hg, Wg, N, W, b, h0, std::min(W, H - h0)};
      body(layout, plan, g, workspaces.local(), statuses + b * H + h0);
    });
  };
  if (plane_major(N, choice)) {
    run(PlaneMajor{});
  } else {
    run(TokenMajor{});
  }
}

}  // namespace

template <typename T>
int64_t one_channel_group_width(int64_t N, int64_t H, OneChannelLayout layout) {
  // A cache line of each token at least: narrower groups would each fetch the whole line.
  // Token-major groups hold whole vectors of heads, plane-major ones whole pairs.
  constexpr int64_t line = std::max<int64_t>(64 / sizeof(T), cpu::Simd<T>::kLanes);
  const int64_t quantum = plane_major(N, layout) ? 2 : cpu::Simd<T>::kLanes;
  const int64_t padded = ceil_div(H, quantum) * quantum;
  if (padded <= line) return padded;
  const int64_t widest = std::max(line, kGroupFloats / N / line * line);
  const int64_t groups = ceil_div(padded, widest);
  return ceil_div(ceil_div(H, groups), line) * line;
}

template <typename T>
void one_channel_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, T scale, View5<T> out, View4<T> weights,
                         HeadStatus* statuses, OneChannelLayout layout) {
  for_each_group<T>(context, q, false, layout, statuses,
                    [&](auto layout, const ComplexFftPlan<T>& plan, const Group& g,
                        const GroupWorkspace<T>& w, HeadStatus* status) {
                      group_forward<decltype(layout)>(plan, g, q, k, v, scale, out, weights, w,
                                                      status);
                    });
}

template <typename T>
void one_channel_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                          View5<T> dv, HeadStatus* statuses, OneChannelLayout layout) {
  for_each_group<T>(context, q, true, layout, statuses,
                    [&](auto layout, const ComplexFftPlan<T>& plan, const Group& g,
                        const GroupWorkspace<T>& w, HeadStatus* status) {
                      group_backward<decltype(layout)>(plan, g, q, k, v, dout, scale, dq, dk, dv, w,
                                                       status);
                    });
}

#define SUBQUAD_INSTANTIATE(T)                                                                 \
  template int64_t one_channel_group_width<T>(int64_t, int64_t, OneChannelLayout);             \
  template void one_channel_forward<T>(const Context&, View5<const T>, View5<const T>,         \
                                       View5<const T>, T, View5<T>, View4<T>,                  \
                                       HeadStatus*, OneChannelLayout);            \
  template void one_channel_backward<T>(const Context&, View5<const T>, View5<const T>,        \
                                        View5<const T>, View5<const T>, T, View5<T>, View5<T>, \
                                        View5<T>, HeadStatus*, OneChannelLayout);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad::circulant2d_detail
