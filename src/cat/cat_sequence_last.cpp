// Non-causal CAT forward and backward on sequence-last memory (cat_sequence_last.h): per head
// s = softmax(z); per pair of value columns, their two contiguous rows interleaved as one
// complex signal x + i y, one complex FFT of length N, the product with the head's filter, one
// inverse, the real and imaginary parts written to out's two rows. O(N log N Dv) per head; a
// direct O(N^2 Dv) path below the same crossover as cat.cpp. Reference: cat_ref.h.
#include "cat/cat_sequence_last.h"

#include <algorithm>
#include <complex>

#include "cat/cat_common.h"
#include "cat/cat_head.h"
#include "common/fft.h"
#include "common/parallel.h"

namespace subquad {
namespace {

using cat_detail::padded;
using cat_detail::sequence_contiguous;
using cat_detail::ThreadScratch;

// Distance between the tokens of column c of a view: 1 on sequence-last memory; a view in
// the other layout is read and written through the same loops, strided.
template <typename T>
int64_t sequence_stride(const View4<T>& x) {
  return sequence_contiguous(x) ? 1 : x.strides[1];
}

// pair[n] = x(b, n, h, c) + i x(b, n, h, c + 1), the imaginary part 0 when c is the last
// column: two rows of v moved into one row of scratch (in cache), the only move of this
// layout. Packed pairs run Debian's FFTW's complex SIMD codelets: 1.3-1.6x faster per forward
// than real transforms straight on v's rows (README, "Sequence-last layout").
template <typename T>
void pack_pair(View4<const T> x, int64_t b, int64_t h, int64_t c, std::complex<T>* pair) {
  const int64_t N = x.shape[1], stride = sequence_stride(x);
  const T* re = &x(b, 0, h, c);
  T* p = reinterpret_cast<T*>(pair);
  if (c + 1 == x.shape[3]) {
    for (int64_t n = 0; n < N; ++n) {
      p[2 * n] = re[n * stride];
      p[2 * n + 1] = T(0);
    }
    return;
  }
  const T* im = &x(b, 0, h, c + 1);
  if (stride == 1) {
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) {
      p[2 * n] = re[n];
      p[2 * n + 1] = im[n];
    }
  } else {
    for (int64_t n = 0; n < N; ++n) {
      p[2 * n] = re[n * stride];
      p[2 * n + 1] = im[n * stride];
    }
  }
}

// The inverse move: x(b, n, h, c) = Re pair[n], x(b, n, h, c + 1) = Im pair[n] (when c + 1 is
// a column).
template <typename T>
void unpack_pair(const std::complex<T>* pair, int64_t b, int64_t h, int64_t c, View4<T> x) {
  const int64_t N = x.shape[1], stride = sequence_stride(x);
  const T* p = reinterpret_cast<const T*>(pair);
  T* re = &x(b, 0, h, c);
  if (c + 1 == x.shape[3]) {
    for (int64_t n = 0; n < N; ++n) re[n * stride] = p[2 * n];
    return;
  }
  T* im = &x(b, 0, h, c + 1);
  if (stride == 1) {
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) {
      re[n] = p[2 * n];
      im[n] = p[2 * n + 1];
    }
  } else {
    for (int64_t n = 0; n < N; ++n) {
      re[n * stride] = p[2 * n];
      im[n * stride] = p[2 * n + 1];
    }
  }
}

// Column c of head (b, h) into row [N] (the direct path).
template <typename T>
void load_column(View4<const T> x, int64_t b, int64_t h, int64_t c, T* row) {
  const int64_t N = x.shape[1], stride = sequence_stride(x);
  const T* first = &x(b, 0, h, c);
  for (int64_t n = 0; n < N; ++n) row[n] = first[n * stride];
}

template <typename T>
void store_column(const T* row, int64_t b, int64_t h, int64_t c, View4<T> x) {
  const int64_t N = x.shape[1], stride = sequence_stride(x);
  T* first = &x(b, 0, h, c);
  for (int64_t n = 0; n < N; ++n) first[n * stride] = row[n];
}

// y[i] = sum_n s[n] x[partner(i, n)]: one column of the direct path.
template <typename T>
void direct_column(const T* s, const T* x, CatConvention convention, int64_t N, T* y) {
  for (int64_t i = 0; i < N; ++i) {
    T acc = 0;
    for (int64_t n = 0; n < N; ++n) acc += s[n] * x[cat_detail::partner(convention, i, n, N)];
    y[i] = acc;
  }
}

// The plans of this layout (the same layouts, hence the same cached plans, as cat.cpp's): a
// real transform for the scores, a complex one for the packed pairs.
template <typename T>
struct Plans {
  RealFftPlan<T> scores;
  ComplexFftPlan<T> pairs;
  explicit Plans(int64_t N)
      : scores(RealFftPlan<T>::get(cat_detail::row_layout<T>(N, 1))),
        pairs(ComplexFftPlan<T>::get(cat_detail::complex_row_layout(N))) {}
};

}  // namespace

namespace cpu {

template <typename T>
void run_sequence_last(const Context& context, const cat_detail::CatForwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v;
  const View4<T> out = params.out;
  const CatConvention convention = params.options.convention;
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  const int threads = thread_count(context);
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const int64_t row = padded<T>(N);

  if (cat_detail::use_direct(params.options.path, N)) {
    ThreadScratch<T> scratch(frame, threads, 3 * row);  // s, a column in, a column out
    parallel_for(context, B * H, [&](int64_t task) {
      const int64_t b = task / H, h = task % H;
      T* s = scratch.get();
      cat_detail::softmax_scores(z, b, h, s);
      for (int64_t c = 0; c < Dv; ++c) {
        load_column(v, b, h, c, s + row);
        direct_column(s, s + row, convention, N, s + 2 * row);
        store_column(s + 2 * row, b, h, c, out);
      }
    });
    return;
  }

  using C = std::complex<T>;
  const Plans<T> plans(N);
  const int64_t filter = padded<C>(N / 2 + 1), signal = padded<C>(N);
  ThreadScratch<T> real_scratch(frame, threads, row);
  ThreadScratch<C> complex_scratch(frame, threads, filter + 2 * signal);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* e = real_scratch.get();
    C* W = complex_scratch.get();
    C* X = W + filter;
    C* pair = X + signal;
    // W = conj?(rfft(s)) / N with s = e / total, as in cat.cpp: roll corr(s, v) =
    // ifft(conj(S) V), conv ifft(S V); the normaliser and 1/N ride on the filter.
    const double total = cat_detail::exp_scores(z, b, h, e);
    plans.scores.forward(e, W);
    cat_detail::scale_spectrum(W, N / 2 + 1, static_cast<T>(1 / (total * N)),
                               convention == CatConvention::roll);
    for (int64_t c = 0; c < Dv; c += 2) {
      pack_pair(v, b, h, c, pair);
      plans.pairs.forward(pair, X);
      cat_detail::multiply_by_real_spectrum(X, W, N);
      plans.pairs.inverse(X, pair);
      unpack_pair(pair, b, h, c, out);
    }
  });
}

template <typename T>
void run_sequence_last(const Context& context, const cat_detail::CatBackwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v, dout = params.dout;
  const View3<T> dz = params.dz;
  const View4<T> dv = params.dv;
  const CatConvention convention = params.options.convention;
  const bool roll = convention == CatConvention::roll;
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  const int threads = thread_count(context);
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const int64_t row = padded<T>(N);
  ThreadScratch<double> ds_scratch(frame, threads, N);

  if (cat_detail::use_direct(params.options.path, N)) {
    // The transpose of "row i reads v[partner(i, n)]" is "row j reads dout[partner'(j, n)]"
    // with the opposite convention.
    const CatConvention transposed = roll ? CatConvention::conv : CatConvention::roll;
    ThreadScratch<T> scratch(frame, threads, 4 * row);  // s, columns of v, dout and dv
    parallel_for(context, B * H, [&](int64_t task) {
      const int64_t b = task / H, h = task % H;
      T* s = scratch.get();
      T* x = s + row;
      T* g = x + row;
      T* y = g + row;
      double* ds = ds_scratch.get();
      cat_detail::softmax_scores(z, b, h, s);
      std::fill(ds, ds + N, 0.0);
      for (int64_t c = 0; c < Dv; ++c) {
        load_column(v, b, h, c, x);
        load_column(dout, b, h, c, g);
        direct_column(s, g, transposed, N, y);
        store_column(y, b, h, c, dv);
        // ds[n] = sum_i <dout[i], v[partner(i, n)]>, one column at a time.
        for (int64_t n = 0; n < N; ++n) {
          T dot = 0;
          for (int64_t i = 0; i < N; ++i) dot += g[i] * x[cat_detail::partner(convention, i, n, N)];
          ds[n] += dot;
        }
      }
      cat_detail::softmax_backward(s, ds, N, b, h, dz);
    });
    return;
  }

  using C = std::complex<T>;
  const Plans<T> plans(N);
  const int64_t filter = padded<C>(N / 2 + 1), signal = padded<C>(N);
  ThreadScratch<T> real_scratch(frame, threads, row);
  ThreadScratch<C> complex_scratch(frame, threads, filter + 4 * signal);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    T* s = real_scratch.get();
    C* W = complex_scratch.get();
    C* Q = W + filter;  // sum over column pairs of the ds spectra
    C* XV = Q + signal;
    C* XG = XV + signal;
    C* pair = XG + signal;
    double* ds = ds_scratch.get();
    cat_detail::softmax_scores(z, b, h, s);
    // roll: dv = conv(s, dout) = ifft(S DOUT) / N; conv: dv = corr(s, dout), conj(S).
    plans.scores.forward(s, W);
    cat_detail::scale_spectrum(W, N / 2 + 1, static_cast<T>(1.0 / N), /*conjugate=*/!roll);
    std::fill(Q, Q + N, C(0));
    // ds as in cat.cpp: for g = d + i d', x = v + i v', Re(sum_i conj(g[i]) x[i + n]) =
    // corr(d, v) + corr(d', v'), so ds = Re(ifft(sum_pairs conj(G) X)) / N (roll),
    // conj(X) G (conv).
    for (int64_t c = 0; c < Dv; c += 2) {
      pack_pair(v, b, h, c, pair);
      plans.pairs.forward(pair, XV);
      pack_pair(dout, b, h, c, pair);
      plans.pairs.forward(pair, XG);
      if (roll)
        cat_detail::accumulate_conj_product(Q, XG, XV, N);
      else
        cat_detail::accumulate_conj_product(Q, XV, XG, N);
      cat_detail::multiply_by_real_spectrum(XG, W, N);
      plans.pairs.inverse(XG, pair);
      unpack_pair(pair, b, h, c, dv);
    }
    plans.pairs.inverse(Q, XV);
    for (int64_t n = 0; n < N; ++n) ds[n] = static_cast<double>(XV[n].real()) / N;
    cat_detail::softmax_backward(s, ds, N, b, h, dz);
  });
}

template void run_sequence_last<float>(const Context&, const cat_detail::CatForwardParams<float>&);
template void run_sequence_last<double>(const Context&,
                                        const cat_detail::CatForwardParams<double>&);
template void run_sequence_last<float>(const Context&, const cat_detail::CatBackwardParams<float>&);
template void run_sequence_last<double>(const Context&,
                                        const cat_detail::CatBackwardParams<double>&);

}  // namespace cpu
}  // namespace subquad
