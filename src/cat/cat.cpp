// CAT forward and backward, both conventions: per head s = softmax(z), out = corr(s, v) (roll)
// or conv(s, v) (conv) with real FFTs over contiguous [Dv, N] rows, O(N log N Dv) per head;
// a direct O(N^2 Dv) gather below a measured crossover. Reference: cat_ref.h.
#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>

#include "cat/cat_common.h"
#include "subquad/cat.h"
#include "subquad/parallel.h"

namespace subquad {
namespace {

using cat_detail::padded;
using cat_detail::ThreadScratch;

// Below this N the direct gather beats the FFT path. Measured with subquad_cat_bench
// (BM_CatForward/direct vs BM_CatForward/fft, one thread, Dv = 64): 3.1 vs 4.0 us at N = 16,
// 7.7 vs 7.2 us at N = 32, 27.9 vs 12.7 us at N = 64.
constexpr int64_t kDirectMaxN = 24;
// Value columns moved to rows per gather/scatter (64 bytes of each token: whole cache lines);
// the forward then transforms them one at a time. Forward, one thread, Dv = 64: 8 ran 5-30%
// slower than 16 at N = 4096 .. 65536 (half lines per pass), 32 within the noise of 16.
constexpr int64_t kColumnChunk = 16;

bool use_direct(CatPath path, int64_t N) {
  return path == CatPath::direct || (path == CatPath::automatic && N <= kDirectMaxN);
}

// e[n] = exp(z[b, n, h] - max_n z[b, n, h]), computed in double; returns sum_n e[n], so the
// softmax is e / total.
template <typename T>
double exp_scores(View3<const T> z, int64_t b, int64_t h, T* e) {
  const int64_t N = z.shape[1];
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n < N; ++n) high = std::max(high, static_cast<double>(z(b, n, h)));
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double value = std::exp(static_cast<double>(z(b, n, h)) - high);
    e[n] = static_cast<T>(value);
    total += value;
  }
  return total;
}

// s[n] = softmax over n of z[b, n, h], computed in double.
template <typename T>
void softmax_scores(View3<const T> z, int64_t b, int64_t h, T* s) {
  const int64_t N = z.shape[1];
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n < N; ++n) high = std::max(high, static_cast<double>(z(b, n, h)));
  double total = 0;
  for (int64_t n = 0; n < N; ++n) total += std::exp(static_cast<double>(z(b, n, h)) - high);
  for (int64_t n = 0; n < N; ++n)
    s[n] = static_cast<T>(std::exp(static_cast<double>(z(b, n, h)) - high) / total);
}

// Index of the value that weight s[n] multiplies in row i: roll v[i + n], conv v[i - n].
inline int64_t partner(CatConvention convention, int64_t i, int64_t n, int64_t N) {
  const int64_t j = convention == CatConvention::roll ? i + n : i - n + N;
  return j >= N ? j - N : j;
}

template <typename T>
void forward_direct_head(View4<const T> v, const T* s, CatConvention convention, int64_t b,
                         int64_t h, T* acc, View4<T> out) {
  const int64_t N = v.shape[1], Dv = v.shape[3];
  for (int64_t i = 0; i < N; ++i) {
    std::fill(acc, acc + Dv, T(0));
    for (int64_t n = 0; n < N; ++n) {
      const T weight = s[n];
      const T* row = v.row(b, partner(convention, i, n, N), h);
#pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) acc[c] += weight * row[c];
    }
    std::copy(acc, acc + Dv, out.row(b, i, h));
  }
}

// dv[j] = sum_i A[i, j] dout[i], ds[n] = sum_i <dout[i], v[partner(i, n)]>.
template <typename T>
void backward_direct_head(View4<const T> v, View4<const T> dout, const T* s,
                          CatConvention convention, int64_t b, int64_t h, T* acc, double* ds,
                          View4<T> dv) {
  const int64_t N = v.shape[1], Dv = v.shape[3];
  // The transpose of "row i reads v[partner(i, n)]" is "row j reads dout[partner'(j, n)]"
  // with the opposite convention.
  const CatConvention transposed =
      convention == CatConvention::roll ? CatConvention::conv : CatConvention::roll;
  for (int64_t j = 0; j < N; ++j) {
    std::fill(acc, acc + Dv, T(0));
    for (int64_t n = 0; n < N; ++n) {
      const T weight = s[n];
      const T* row = dout.row(b, partner(transposed, j, n, N), h);
#pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) acc[c] += weight * row[c];
    }
    std::copy(acc, acc + Dv, dv.row(b, j, h));
  }
  for (int64_t n = 0; n < N; ++n) {
    double total = 0;
    for (int64_t i = 0; i < N; ++i) {
      const T* g = dout.row(b, i, h);
      const T* x = v.row(b, partner(convention, i, n, N), h);
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < Dv; ++c) dot += g[c] * x[c];
      total += dot;
    }
    ds[n] = total;
  }
}

// dz = s * (ds - <s, ds>): the softmax Jacobian applied to ds.
template <typename T>
void softmax_backward(const T* s, const double* ds, int64_t N, int64_t b, int64_t h,
                      View3<T> dz) {
  double inner = 0;
  for (int64_t n = 0; n < N; ++n) inner += s[n] * ds[n];
  for (int64_t n = 0; n < N; ++n) dz(b, n, h) = static_cast<T>(s[n] * (ds[n] - inner));
}

// Plans for full column chunks and for the last partial chunk of Dv.
template <typename T>
struct ChunkPlans {
  RealFftPlan<T> single, full, tail;
  int64_t row_distance, spectrum_distance;

  ChunkPlans(int64_t N, int64_t Dv)
      : single(RealFftPlan<T>::get(cat_detail::row_layout<T>(N, 1))),
        full(RealFftPlan<T>::get(
            cat_detail::row_layout<T>(N, std::max<int64_t>(1, std::min(kColumnChunk, Dv))))),
        tail(RealFftPlan<T>::get(
            cat_detail::row_layout<T>(N, Dv % kColumnChunk ? Dv % kColumnChunk : 1))),
        row_distance(cat_detail::row_distance<T>(N)),
        spectrum_distance(cat_detail::row_distance<std::complex<T>>(N / 2 + 1)) {}
  const RealFftPlan<T>& for_count(int64_t count) const {
    return count == full.layout().batch ? full : tail;
  }
};

template <typename T>
void check_forward(View3<const T> z, View4<const T> v, View4<T> out) {
  cat_detail::check_scores_and_values(z, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
}

}  // namespace

template <typename T>
void cat_forward(const Context& context, View3<const T> z, View4<const T> v,
                 const CatOptions& options, View4<T> out) {
  check_forward(z, v, View4<T>(out));
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  if (B * N * H * Dv == 0) return;
  const int threads = thread_count(context);
  const CatConvention convention = options.convention;

  if (use_direct(options.path, N)) {
    ThreadScratch<T> scratch(threads, padded<T>(N) + Dv);
    parallel_for(context, B * H, [&](int64_t task) {
      const int64_t b = task / H, h = task % H;
      T* s = scratch.get();
      softmax_scores(z, b, h, s);
      forward_direct_head(v, s, convention, b, h, s + padded<T>(N), out);
    });
    return;
  }

  const RealFftPlan<T> plan = RealFftPlan<T>::get(cat_detail::row_layout<T>(N, 1));
  using C = std::complex<T>;
  const int64_t rows = cat_detail::row_distance<T>(N);
  const int64_t spec = cat_detail::row_distance<C>(N / 2 + 1);
  const int64_t chunk = std::min(kColumnChunk, Dv);
  ThreadScratch<T> real_scratch(threads, rows * (chunk + 1));
  ThreadScratch<C> spectrum_scratch(threads, 2 * spec);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* e = real_scratch.get();
    T* x = e + rows;  // [chunk, rows]
    C* W = spectrum_scratch.get();
    C* X = W + spec;
    // W = conj?(rfft(s)) / N with s = e / total: the softmax normaliser and the inverse
    // transform's 1/N ride on the spectrum, so no pass over e or the output scales.
    const double total = exp_scores(z, b, h, e);
    plan.forward(e, W);
    // roll: corr(s, v) = irfft(conj(S) V); conv: irfft(S V).
    cat_detail::scale_spectrum(W, N / 2 + 1, static_cast<T>(1 / (total * N)),
                               convention == CatConvention::roll);
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0);
      cat_detail::gather_columns(v, b, h, 0, N, c0, count, rows, x);
      // One column at a time: its spectrum stays in L1/L2 between the transforms, and
      // FFTW's single-row plans ran faster than batched ones (BM_FftLayout).
      for (int64_t c = 0; c < count; ++c) {
        plan.forward(x + c * rows, X);
        cat_detail::multiply_spectrum(X, W, N / 2 + 1, /*conjugate_y=*/false);
        plan.inverse(X, x + c * rows);
      }
      cat_detail::scatter_columns(x, rows, T(1), b, h, c0, count, out);
    }
  });
}

template <typename T>
void cat_backward(const Context& context, View3<const T> z, View4<const T> v,
                  View4<const T> dout, const CatOptions& options, View3<T> dz, View4<T> dv) {
  cat_detail::check_scores_and_values(z, v);
  check_view(dout, "dout");
  cat_detail::expect_shape(dout, v.shape, "dout");
  check_view(dz, "dz");
  cat_detail::expect_shape(dz, z.shape, "dz");
  check_view(dv, "dv");
  cat_detail::expect_shape(dv, v.shape, "dv");
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  if (B * N * H == 0) return;
  const int threads = thread_count(context);
  const CatConvention convention = options.convention;

  if (use_direct(options.path, N)) {
    ThreadScratch<T> scratch(threads, padded<T>(N) + Dv);
    ThreadScratch<double> ds_scratch(threads, N);
    parallel_for(context, B * H, [&](int64_t task) {
      const int64_t b = task / H, h = task % H;
      T* s = scratch.get();
      double* ds = ds_scratch.get();
      softmax_scores(z, b, h, s);
      backward_direct_head(v, dout, s, convention, b, h, s + padded<T>(N), ds, dv);
      softmax_backward(s, ds, N, b, h, dz);
    });
    return;
  }

  const ChunkPlans<T> plans(N, Dv);
  using C = std::complex<T>;
  const int64_t rows = plans.row_distance, spec = plans.spectrum_distance;
  const int64_t chunk = std::max<int64_t>(1, std::min(kColumnChunk, Dv));
  ThreadScratch<T> real_scratch(threads, rows * (2 * chunk + 2));
  ThreadScratch<C> spectrum_scratch(threads, spec * (2 * chunk + 2));
  ThreadScratch<double> ds_scratch(threads, N);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* s = real_scratch.get();
    T* ds_real = s + rows;
    T* xv = ds_real + rows;          // [chunk, rows]
    T* xg = xv + chunk * rows;       // [chunk, rows]
    C* S = spectrum_scratch.get();
    C* Q = S + spec;                 // sum over columns of the ds spectra
    C* XV = Q + spec;                // [chunk, spec]
    C* XG = XV + chunk * spec;       // [chunk, spec]
    double* ds = ds_scratch.get();
    softmax_scores(z, b, h, s);
    plans.single.forward(s, S);
    std::fill(Q, Q + N / 2 + 1, C(0));
    // roll: dv = conv(s, dout), ds = sum_c corr(dout_c, v_c) = irfft(conj(DOUT) V).
    // conv: dv = corr(s, dout), ds = sum_c corr(v_c, dout_c) = irfft(conj(V) DOUT).
    const bool roll = convention == CatConvention::roll;
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0);
      const RealFftPlan<T>& plan = plans.for_count(count);
      cat_detail::gather_columns(v, b, h, 0, N, c0, count, rows, xv);
      cat_detail::gather_columns(dout, b, h, 0, N, c0, count, rows, xg);
      plan.forward(xv, XV);
      plan.forward(xg, XG);
      for (int64_t c = 0; c < count; ++c) {
        C* fv = XV + c * spec;
        C* fg = XG + c * spec;
        if (roll)
          cat_detail::accumulate_conj_product(Q, fg, fv, N / 2 + 1);
        else
          cat_detail::accumulate_conj_product(Q, fv, fg, N / 2 + 1);
        cat_detail::multiply_spectrum(fg, S, N / 2 + 1, /*conjugate_y=*/!roll);
      }
      plan.inverse(XG, xg);
      cat_detail::scatter_columns(xg, rows, T(1) / static_cast<T>(N), b, h, c0, count, dv);
    }
    plans.single.inverse(Q, ds_real);
    for (int64_t n = 0; n < N; ++n) ds[n] = static_cast<double>(ds_real[n]) / N;
    softmax_backward(s, ds, N, b, h, dz);
  });
}

template <typename T>
CatFftLowerBound<T>::CatFftLowerBound(View4<const T> v)
    : heads_(v.shape[0] * v.shape[2]), length_(v.shape[1]), columns_(v.shape[3]) {
  check_view(v, "v");
  const int64_t rows = cat_detail::row_distance<T>(length_), H = v.shape[2];
  rows_ = Buffer<T>(heads_ * columns_ * rows);
  inverse_ = Buffer<T>(heads_ * columns_ * rows);
  for (int64_t task = 0; task < heads_; ++task)
    cat_detail::gather_columns(v, task / H, task % H, 0, length_, 0, columns_, rows,
                               rows_.data() + task * columns_ * rows);
}

// The fastest layout measured for the transforms alone (BM_FftLayout in cat_bench.cpp, one
// thread, Dv = 64, forward + inverse of all columns): one contiguous row per plan. Batches of
// 16 rows ran 5-15% slower, FFTW's interleaved transforms of 16 columns ([N, 16], stride 16)
// 2.5-3.5x slower; so this is what cat_forward does too.
template <typename T>
void CatFftLowerBound<T>::run(const Context& context) {
  if (heads_ * length_ * columns_ == 0) return;
  const RealFftPlan<T> plan = RealFftPlan<T>::get(cat_detail::row_layout<T>(length_, 1));
  const int64_t rows = cat_detail::row_distance<T>(length_);
  ThreadScratch<std::complex<T>> spectrum_scratch(
      thread_count(context), cat_detail::row_distance<std::complex<T>>(length_ / 2 + 1));
  parallel_for(context, heads_, [&](int64_t task) {
    std::complex<T>* X = spectrum_scratch.get();
    for (int64_t c = 0; c < columns_; ++c) {
      const int64_t offset = (task * columns_ + c) * rows;
      plan.forward(rows_.data() + offset, X);
      plan.inverse(X, inverse_.data() + offset);
    }
  });
}

#define SUBQUAD_CAT_INSTANTIATE(T)                                                        \
  template void cat_forward<T>(const Context&, View3<const T>, View4<const T>,            \
                               const CatOptions&, View4<T>);                              \
  template void cat_backward<T>(const Context&, View3<const T>, View4<const T>,           \
                                View4<const T>, const CatOptions&, View3<T>, View4<T>);  \
  template class CatFftLowerBound<T>;
SUBQUAD_CAT_INSTANTIATE(float)
SUBQUAD_CAT_INSTANTIATE(double)
#undef SUBQUAD_CAT_INSTANTIATE

}  // namespace subquad
