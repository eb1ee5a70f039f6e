// CAT forward and backward, both conventions: per head s = softmax(z), out = corr(s, v) (roll)
// or conv(s, v) (conv) with complex FFTs of v's column pairs packed as x + i y in contiguous
// rows, O(N log N Dv) per head; a direct O(N^2 Dv) gather below a measured crossover.
// Reference: cat_ref.h.
#include <algorithm>
#include <complex>
#include <type_traits>

#include "cat/cat_common.h"
#include "cat/cat_fft_lower_bound.h"
#include "cat/cat_head.h"
#include "cat/cat_ops.h"
#include "cat/cat_sequence_last.h"
#include "common/fft_columns.h"
#include "common/parallel.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

using cat_detail::exp_scores;
using cat_detail::padded;
using cat_detail::partner;
using cat_detail::softmax_backward;
using cat_detail::softmax_scores;
using cat_detail::ThreadScratch;
using cat_detail::use_direct;
// Value columns moved to rows per gather/scatter: 256 bytes of each token (float), 32 complex
// rows of column pairs, then transformed one row at a time. Forward, one thread, Dv = 64, with
// the gather's prefetch (BM_CatForward, N = 4096 / 16384 / 65536): 16 columns 481 / 3233 /
// 16868 us, 32 columns 448 / 2773 / 13393 us, 64 columns 424 / 2509 / 13337 us. Whole token
// segments stream better than several passes over the tokens, although at N >= 16384 the
// rows no longer stay in L2.
constexpr int64_t kColumnChunk = 64;
// The backward moves v and dout (two row sets) per pass: 32 columns keep them at half the
// forward's footprint. Backward, one thread, Dv = 64, N = 4096 / 16384 / 65536: 16 columns
// 894 / 5203 / 34062 us, 32 columns 811 / 4707 / 30554 us, 64 columns 799 / 4520 / 40461 us.
constexpr int64_t kBackwardColumnChunk = 32;
// float32 forward, power-of-two N at least this: the head's [N, Dv] slice of v goes through
// ColumnFft in place (row stride H Dv), the filter product fused into it: no moves to rows.
// Measured faster than the packed rows below at N = 256 .. 65536 with H = 1 and 8, Dv = 64
// (docs/perf/cat.md); smaller N were not measured and stay on the packed rows.
constexpr int64_t kColumnFftMinN = 256;
// Except where the row stride is a multiple of 4 KiB: the segments that one ColumnFft pass reads
// from successive tokens then share one L1 set (and, at multiples of 64 KiB, one L2 set). With
// H Dv = 1024 floats (H = 8, Dv = 128) the column path measured 1.35-1.56x slower than the
// packed rows at N = 1024, 2048 and 4096, and 1.1-1.2x faster at N = 256, 512 and 16384 (CPU-time
// minima of 3 alternating runs, one thread; docs/perf/cat.md, "Performance targets"): such
// strides take the packed rows at those three lengths.
constexpr int64_t kAliasingStrideBytes = 4096;
constexpr int64_t kAliasedPackedMinN = 1024, kAliasedPackedMaxN = 4096;

bool use_column_fft(int64_t N, int64_t v_row_bytes, int64_t out_row_bytes) {
  if (N < kColumnFftMinN || (N & (N - 1)) != 0 || N > (int64_t(1) << 24)) return false;
  const bool aliased =
      v_row_bytes % kAliasingStrideBytes == 0 || out_row_bytes % kAliasingStrideBytes == 0;
  return !(aliased && N >= kAliasedPackedMinN && N <= kAliasedPackedMaxN);
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
  forward_direct_head(dout, s, transposed, b, h, acc, dv);
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

// The plans of the FFT path: a real transform for the scores (their spectrum is Hermitian) and
// a complex one for the packed column pairs, with the row distances of their workspaces.
template <typename T>
struct PackedPlans {
  RealFftPlan<T> scores;
  ComplexFftPlan<T> pairs;
  int64_t real_distance, complex_distance;

  explicit PackedPlans(int64_t N)
      : scores(RealFftPlan<T>::get(cat_detail::row_layout<T>(N, 1))),
        pairs(ComplexFftPlan<T>::get(cat_detail::complex_row_layout(N))),
        real_distance(cat_detail::row_distance<T>(N)),
        complex_distance(cat_detail::row_distance<std::complex<T>>(N)) {}
};

// filter[0 .. N / 2] = scale * conj?(rfft(e)): the half spectrum of a real filter, applied to
// the packed pairs' full spectra by multiply_by_real_spectrum.
template <typename T>
void filter_spectrum(const PackedPlans<T>& plans, const T* e, int64_t N, double scale,
                     bool conjugate, std::complex<T>* filter) {
  plans.scores.forward(e, filter);
  cat_detail::scale_spectrum(filter, N / 2 + 1, static_cast<T>(scale), conjugate);
}

}  // namespace

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatForwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v;
  const CatOptions& options = params.options;
  const View4<T> out = params.out;
  // Sequence-last memory: the columns are rows already (cat_sequence_last.cpp).
  if (!cat_detail::last_axis_contiguous(v) || !cat_detail::last_axis_contiguous(out))
    return run_sequence_last(context, params);
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  const int threads = thread_count(context);
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const CatConvention convention = options.convention;

  if (use_direct(options.path, N)) {
    ThreadScratch<T> scratch(frame, threads, padded<T>(N) + Dv);
    parallel_for(context, B * H, [&](int64_t task) {
      const int64_t b = task / H, h = task % H;
      T* s = scratch.get();
      softmax_scores(z, b, h, s);
      forward_direct_head(v, s, convention, b, h, s + padded<T>(N), out);
    });
    return;
  }

  const PackedPlans<T> plans(N);
  using C = std::complex<T>;
  if constexpr (std::is_same_v<T, float>) {
    const int64_t bytes = sizeof(float);
    if (use_column_fft(N, v.strides[1] * bytes, out.strides[1] * bytes)) {
      const ColumnFft& columns = ColumnFft::get(N);
      ThreadScratch<T> real_scratch(frame, threads, plans.real_distance);
      ThreadScratch<C> filter_scratch(frame, threads, N);
      ThreadScratch<float> column_scratch(frame, threads, columns.scratch_floats());
      parallel_for(context, B * H, [&](int64_t task) {
        const int64_t b = task / H, h = task % H;
        T* e = real_scratch.get();
        C* W = filter_scratch.get();  // [N]: the half spectrum below, then its mirror
        const double total = exp_scores(z, b, h, e);
        filter_spectrum(plans, e, N, 1 / (total * N), convention == CatConvention::roll, W);
        for (int64_t f = 1; f < N / 2; ++f) W[N - f] = std::conj(W[f]);
        columns.filter(v.row(b, 0, h), v.strides[1], Dv, W, out.row(b, 0, h), out.strides[1],
                       column_scratch.get());
      });
      return;
    }
  }
  const int64_t rows = plans.complex_distance;
  const int64_t pairs = (std::min(kColumnChunk, Dv) + 1) / 2;
  ThreadScratch<T> real_scratch(frame, threads, plans.real_distance);
  ThreadScratch<C> complex_scratch(frame, threads, rows * (pairs + 2));
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* e = real_scratch.get();
    C* W = complex_scratch.get();
    C* X = W + rows;
    C* x = X + rows;  // [pairs, rows]
    // W = conj?(rfft(s)) / N with s = e / total: the softmax normaliser and the inverse
    // transform's 1/N ride on the spectrum, so no pass over e or the output scales.
    // roll: corr(s, v) = ifft(conj(S) V); conv: ifft(S V).
    const double total = exp_scores(z, b, h, e);
    filter_spectrum(plans, e, N, 1 / (total * N), convention == CatConvention::roll, W);
    for (int64_t c0 = 0; c0 < Dv; c0 += kColumnChunk) {
      const int64_t count = std::min(kColumnChunk, Dv - c0);
      cat_detail::gather_column_pairs(v, b, h, c0, count, rows, x);
      // One pair at a time: its spectrum stays in L1/L2 between the transforms.
      for (int64_t p = 0; p < (count + 1) / 2; ++p) {
        plans.pairs.forward(x + p * rows, X);
        cat_detail::multiply_by_real_spectrum(X, W, N);
        plans.pairs.inverse(X, x + p * rows);
      }
      cat_detail::scatter_column_pairs(x, rows, b, h, c0, count, out);
    }
  });
}

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatBackwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v, dout = params.dout;
  const CatOptions& options = params.options;
  const View3<T> dz = params.dz;
  const View4<T> dv = params.dv;
  if (!cat_detail::last_axis_contiguous(v) || !cat_detail::last_axis_contiguous(dout) ||
      !cat_detail::last_axis_contiguous(dv))
    return run_sequence_last(context, params);
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  const int threads = thread_count(context);
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const CatConvention convention = options.convention;

  if (use_direct(options.path, N)) {
    ThreadScratch<T> scratch(frame, threads, padded<T>(N) + Dv);
    ThreadScratch<double> ds_scratch(frame, threads, N);
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

  const PackedPlans<T> plans(N);
  using C = std::complex<T>;
  const int64_t rows = plans.complex_distance;
  const int64_t pairs = (std::min(kBackwardColumnChunk, Dv) + 1) / 2;
  ThreadScratch<T> real_scratch(frame, threads, plans.real_distance);
  ThreadScratch<C> complex_scratch(frame, threads, rows * (2 * pairs + 4));
  ThreadScratch<double> ds_scratch(frame, threads, N);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* s = real_scratch.get();
    C* W = complex_scratch.get();
    C* Q = W + rows;          // sum over column pairs of the ds spectra
    C* XV = Q + rows;
    C* XG = XV + rows;
    C* xv = XG + rows;        // [pairs, rows]
    C* xg = xv + pairs * rows;  // [pairs, rows]
    double* ds = ds_scratch.get();
    softmax_scores(z, b, h, s);
    // roll: dv = conv(s, dout) = ifft(S DOUT) / N; conv: dv = corr(s, dout), conj(S).
    const bool roll = convention == CatConvention::roll;
    filter_spectrum(plans, s, N, 1.0 / N, /*conjugate=*/!roll, W);
    std::fill(Q, Q + N, C(0));
    // ds = sum_c corr(dout_c, v_c) (roll) or corr(v_c, dout_c) (conv). For a packed pair
    // g = d + i d', x = v + i v': Re(sum_i conj(g[i]) x[i + n]) = corr(d, v) + corr(d', v'),
    // so ds = Re(ifft(sum_pairs conj(G) X)) / N (roll), conj(X) G (conv).
    for (int64_t c0 = 0; c0 < Dv; c0 += kBackwardColumnChunk) {
      const int64_t count = std::min(kBackwardColumnChunk, Dv - c0);
      cat_detail::gather_column_pairs(v, b, h, c0, count, rows, xv);
      cat_detail::gather_column_pairs(dout, b, h, c0, count, rows, xg);
      for (int64_t p = 0; p < (count + 1) / 2; ++p) {
        plans.pairs.forward(xv + p * rows, XV);
        plans.pairs.forward(xg + p * rows, XG);
        if (roll)
          cat_detail::accumulate_conj_product(Q, XG, XV, N);
        else
          cat_detail::accumulate_conj_product(Q, XV, XG, N);
        cat_detail::multiply_by_real_spectrum(XG, W, N);
        plans.pairs.inverse(XG, xg + p * rows);
      }
      cat_detail::scatter_column_pairs(xg, rows, b, h, c0, count, dv);
    }
    plans.pairs.inverse(Q, XV);
    for (int64_t n = 0; n < N; ++n) ds[n] = static_cast<double>(XV[n].real()) / N;
    softmax_backward(s, ds, N, b, h, dz);
  });
}

template void run<float>(Backend, const Context&, const cat_detail::CatForwardParams<float>&);
template void run<double>(Backend, const Context&, const cat_detail::CatForwardParams<double>&);
template void run<float>(Backend, const Context&, const cat_detail::CatBackwardParams<float>&);
template void run<double>(Backend, const Context&, const cat_detail::CatBackwardParams<double>&);

}  // namespace cpu

// The public operators: checks, then the one dispatch on Context::device.
template <typename T>
void cat_forward(const Context& context, View3<const T> z, View4<const T> v,
                 const CatOptions& options, View4<T> out) {
  cat_detail::check_cat_forward_views(z, v, out);
  if (checked_product({v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, "v") == 0) return;
  dispatch(context, cat_detail::CatForwardParams<T>{z, v, options, out});
}

template <typename T>
void cat_backward(const Context& context, View3<const T> z, View4<const T> v,
                  View4<const T> dout, const CatOptions& options, View3<T> dz, View4<T> dv) {
  cat_detail::check_cat_backward_views(z, v, dout, dz, dv);
  if (checked_product({v.shape[0], v.shape[1], v.shape[2]}, "z") == 0) return;
  dispatch(context, cat_detail::CatBackwardParams<T>{z, v, dout, options, dz, dv});
}

template <typename T>
CatFftLowerBound<T>::CatFftLowerBound(View4<const T> v, CatFftPacking packing)
    : packing_(packing), heads_(v.shape[0] * v.shape[2]), length_(v.shape[1]),
      columns_(v.shape[3]) {
  check_view(v, "v");
  const int64_t H = v.shape[2];
  const bool packed = packing == CatFftPacking::packed_pairs;
  signals_ = packed ? (columns_ + 1) / 2 : columns_;
  // Distances in units of T: a complex row holds 2 T per element.
  distance_ = packed ? 2 * cat_detail::row_distance<std::complex<T>>(length_)
                     : cat_detail::row_distance<T>(length_);
  rows_ = Buffer<T>(heads_ * signals_ * distance_);
  inverse_ = Buffer<T>(heads_ * signals_ * distance_);
  for (int64_t task = 0; task < heads_; ++task) {
    T* head = rows_.data() + task * signals_ * distance_;
    if (packed)
      cat_detail::gather_column_pairs(v, task / H, task % H, 0, columns_, distance_ / 2,
                                      reinterpret_cast<std::complex<T>*>(head));
    else
      cat_detail::gather_columns(v, task / H, task % H, 0, length_, 0, columns_, distance_,
                                 head);
  }
}

// One contiguous row per plan, the fastest layout measured for the transforms alone
// (BM_FftLayout in cat_bench.cpp, one thread, Dv = 64: batches of 16 rows ran 5-15% slower,
// FFTW's interleaved transforms of 16 columns 2.5-3.5x slower); cat_forward does the same.
template <typename T>
void CatFftLowerBound<T>::run(const Context& context) {
  if (checked_product({heads_, length_, columns_}, "v") == 0) return;
  dispatch(context, cat_detail::CatFftLowerBoundParams<T>{packing_, heads_, length_, signals_,
                                                          distance_, rows_.data(),
                                                          inverse_.data()});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatFftLowerBoundParams<T>& params) {
  using C = std::complex<T>;
  const bool packed = params.packing == CatFftPacking::packed_pairs;
  const int64_t signals = params.signals, distance = params.distance;
  const PackedPlans<T> plans(params.length);
  WorkspaceFrame frame(context);
  ThreadScratch<C> spectrum_scratch(frame, thread_count(context), plans.complex_distance);
  parallel_for(context, params.heads, [&](int64_t task) {
    C* X = spectrum_scratch.get();
    for (int64_t signal = 0; signal < signals; ++signal) {
      const int64_t offset = (task * signals + signal) * distance;
      if (packed) {
        plans.pairs.forward(reinterpret_cast<const C*>(params.rows + offset), X);
        plans.pairs.inverse(X, reinterpret_cast<C*>(params.inverse + offset));
      } else {
        plans.scores.forward(params.rows + offset, X);
        plans.scores.inverse(X, params.inverse + offset);
      }
    }
  });
}

template void run<float>(Backend, const Context&, const cat_detail::CatFftLowerBoundParams<float>&);
template void run<double>(Backend, const Context&,
                          const cat_detail::CatFftLowerBoundParams<double>&);

}  // namespace cpu

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
