// Causal CAT forward and backward: out[i] = sum_{k <= i} exp(z[k] - lse[i]) v[i - k], by the
// block plan of cat_causal_plan.h (direct blocks plus float64 FFT blocks with their own
// shifts), O(N log N Dv) per head when scores span a bounded range. Reference: cat_ref.h.
#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>
#include <optional>
#include <vector>

#include "cat/cat_causal_plan.h"
#include "cat/cat_common.h"
#include "subquad/cat.h"
#include "subquad/parallel.h"

namespace subquad {
namespace {

using cat_detail::CausalBlock;
using cat_detail::padded;
using Complex = std::complex<double>;

// Nodes of at most this many rows are evaluated directly (O(n^2 Dv / 2), exact). Measured
// with subquad_cat_bench (BM_CatCausalForward/direct vs /fft, one thread, Dv = 64): 9.6 vs
// 16.4 us at N = 32, 29.1 vs 30.4 us at N = 64, 94.8 vs 60.0 us at N = 128.
constexpr int64_t kLeafRows = 64;
// An FFT block may carry weights totalling at most this many times the normaliser of its
// first row. Float64 round-off is then <~ 1.1e-16 * 3 log2(m) * 2^24 ~ 1e-7 relative to the
// row's scale (README: "Error analysis"), inside the 1e-4 row accuracy the variant promises
// even when a row's output is 256x below its scale; a smaller limit splits standard normal
// scores (first row's normaliser e^-3 against N = 65536 weights) for no accuracy need.
constexpr double kGrowthLimit = 1 << 24;
// Value columns moved to rows per gather/scatter; the transforms then run one column at a
// time, as in the non-causal forward. One thread, Dv = 64, forward + inverse of all columns
// (BM_CausalFftLayout): one row per plan took 1.18 / 6.09 / 37.9 ms at N = 4096 / 16384 /
// 65536 against 1.26 / 8.14 / 44.0 ms for batches of 8 rows; two columns packed as one
// complex signal gained nothing (1.18 / 6.81 / 42.5 ms), so the transforms stay real.
// Columns per pass, with the gathers' prefetch (BM_CatCausalForward / Backward, N = 4096 /
// 16384 / 65536): forward 16 columns 1.65 / 10.2 / 56.8 ms, 32 1.66 / 8.99 / 51.6 ms, 64
// 1.59 / 8.61 / 51.1 ms; backward (v and dout per pass) 16 3.27 / 19.3 / 111 ms, 32 3.08 /
// 18.1 / 108 ms, 64 3.61 / 20.5 / 114 ms.
constexpr int64_t kForwardColumnChunk = 64;
constexpr int64_t kBackwardColumnChunk = 32;
// Largest exponent a direct block lets its factored weights exp(z - shift) * exp(shift - lse)
// reach before it switches to one exp per pair (exp overflows past ~709).
constexpr double kMaxFactoredExponent = 600;

// One head's scores and prefix log-normalisers, and its block plan.
struct HeadPlan {
  std::vector<double> z, lse;
  std::vector<CausalBlock> blocks;
};

template <typename T>
HeadPlan plan_head(View3<const T> z, View4<const T> v, int64_t b, int64_t h, CatPath path) {
  const int64_t N = z.shape[1];
  // A non-finite value would reach every row of an FFT block, also rows before it that
  // cannot see it (a masked future token or padding): such heads take the direct path,
  // which reads only v[0..i] for row i, so masked entries never influence an output.
  for (int64_t n = 0; n < N && path != CatPath::direct; ++n) {
    const T* row = v.row(b, n, h);
    for (int64_t c = 0; c < v.shape[3]; ++c)
      if (!std::isfinite(row[c])) path = CatPath::direct;
  }
  HeadPlan plan;
  plan.z.resize(N);
  plan.lse.resize(N);
  // Scores relative to the first one: softmax is shift-invariant, and so must be the result.
  // Absolute scores of magnitude 1e17 made lse[i] = z + log(i + 1) round to z, so every
  // weight became 1 (an unnormalised prefix sum); z[k] - z[0] is exact for scores of one
  // magnitude (Sterbenz), so a common offset no longer reaches the output. z[0] is the one
  // score every row sees: a shift by the head's maximum would let a huge future score
  // (invisible to earlier rows) round their scores away.
  const double first = N ? static_cast<double>(z(b, 0, h)) : 0.0;
  for (int64_t n = 0; n < N; ++n) plan.z[n] = static_cast<double>(z(b, n, h)) - first;
  cat_detail::prefix_log_sum_exp(plan.z.data(), N, plan.lse.data());
  const int64_t leaf = path == CatPath::direct ? N : path == CatPath::fft ? 0 : kLeafRows;
  plan.blocks =
      cat_detail::plan_causal_blocks(plan.z.data(), plan.lse.data(), N, leaf, kGrowthLimit);
  return plan;
}

// Weight of the pair (row i, score k) of a direct block, as a[k] * f[i] where both factors
// stay in range, else exp(z[k] - lse[i]) per pair.
struct DirectWeights {
  std::vector<double> a, f;
  bool factored;

  DirectWeights(const HeadPlan& plan, const CausalBlock& block) {
    double shift = plan.z[block.k0];
    for (int64_t k = block.k0; k < block.k0 + block.nk; ++k) shift = std::max(shift, plan.z[k]);
    factored = shift - plan.lse[block.r0] <= kMaxFactoredExponent;
    if (!factored) return;
    a.resize(block.nk);
    f.resize(block.nr);
    for (int64_t q = 0; q < block.nk; ++q) a[q] = std::exp(plan.z[block.k0 + q] - shift);
    for (int64_t t = 0; t < block.nr; ++t) f[t] = std::exp(shift - plan.lse[block.r0 + t]);
  }
  double operator()(const HeadPlan& plan, const CausalBlock& block, int64_t i, int64_t k) const {
    return factored ? a[k - block.k0] * f[i - block.r0] : std::exp(plan.z[k] - plan.lse[i]);
  }
};

// Shifted weights of an FFT block, zero-padded to m, and their spectrum / m.
std::vector<Complex> weight_spectrum(const HeadPlan& plan, const CausalBlock& block,
                                     double* real) {
  std::fill(real, real + block.m, 0.0);
  for (int64_t q = 0; q < block.nk; ++q) real[q] = std::exp(plan.z[block.k0 + q] - block.shift);
  std::vector<Complex> spectrum(block.m / 2 + 1);
  RealFftPlan<double>::get(cat_detail::row_layout<double>(block.m, 1)).forward(real,
                                                                               spectrum.data());
  for (Complex& x : spectrum) x /= static_cast<double>(block.m);
  return spectrum;
}

// twist[n] = exp(i pi n / M) for n < M / 2, as coarse[n / kTwistRun] * fine[n % kTwistRun]:
// two small tables (exact to an ulp each) instead of one as large as a column, which streamed
// through L2 twice per column at N = 65536.
constexpr int64_t kTwistRun = 64;
struct Twist {
  std::vector<double> coarse, fine;  // interleaved re, im

  explicit Twist(int64_t M)
      : coarse(2 * ((M / 2 + kTwistRun - 1) / kTwistRun)), fine(2 * kTwistRun) {
    const double step = std::numbers::pi / static_cast<double>(M);
    for (int64_t r = 0; r < kTwistRun; ++r) {
      fine[2 * r] = std::cos(step * static_cast<double>(r));
      fine[2 * r + 1] = std::sin(step * static_cast<double>(r));
    }
    for (size_t q = 0; q < coarse.size() / 2; ++q) {
      const double angle = step * static_cast<double>(q * kTwistRun);
      coarse[2 * q] = std::cos(angle);
      coarse[2 * q + 1] = std::sin(angle);
    }
  }
};

// body(n, Re twist[n], Im twist[n]) for n < half, in vector runs of kTwistRun.
template <typename Body>
void for_each_twist(const Twist& twist, int64_t half, Body&& body) {
  const double* fine = twist.fine.data();
  for (int64_t n0 = 0; n0 < half; n0 += kTwistRun) {
    const double* coarse = twist.coarse.data() + 2 * (n0 / kTwistRun);
    const double cr = coarse[0], ci = coarse[1];
    const int64_t run = std::min(kTwistRun, half - n0);
#pragma omp simd
    for (int64_t r = 0; r < run; ++r)
      body(n0 + r, cr * fine[2 * r] - ci * fine[2 * r + 1],
           cr * fine[2 * r + 1] + ci * fine[2 * r]);
  }
}

// z[n] = (x[n] + i x[n + half]) twist[n] for n < half: a real polynomial x mod t^(2 half) + 1
// taken mod t^half - i (which keeps all of it: the other factor is the conjugate), then
// t = zeta s with zeta^half = i turns that into s^half - 1, a cyclic convolution of length half.
void fold_twist(const double* x, const Twist& twist, int64_t half, Complex* z) {
  double* out = reinterpret_cast<double*>(z);
  for_each_twist(twist, half, [&](int64_t n, double wr, double wi) {
    const double re = x[n], im = x[n + half];
    out[2 * n] = re * wr - im * wi;
    out[2 * n + 1] = re * wi + im * wr;
  });
}

// The inverse of fold_twist, added: r = z[n] conj(twist[n]), x[n] += Re r, x[n + half] += Im r.
void unfold_add(const Complex* z, const Twist& twist, int64_t half, double* x) {
  const double* in = reinterpret_cast<const double*>(z);
  for_each_twist(twist, half, [&](int64_t n, double wr, double wi) {
    const double re = in[2 * n], im = in[2 * n + 1];
    x[n] += re * wr + im * wi;
    x[n + half] += im * wr - re * wi;
  });
}

// Transforms of a split block (half_m = M): with inputs of length <= M, the linear
// convolution's positions [0, M) are (cyclic_M + negacyclic_M) / 2. `cyclic` is rfft_M(a) / 2M,
// `negacyclic` the length-M/2 transform of fold_twist(a) / M, twist[n] = exp(i pi n / M).
struct SplitWeights {
  std::vector<Complex> cyclic, negacyclic;
  Twist twist;
  RealFftPlan<double> cyclic_plan;
  ComplexFftPlan<double> negacyclic_plan;

  SplitWeights(const HeadPlan& plan, const CausalBlock& block, double* real)
      : cyclic(block.half_m / 2 + 1),
        negacyclic(block.half_m / 2),
        twist(block.half_m),
        cyclic_plan(RealFftPlan<double>::get(cat_detail::row_layout<double>(block.half_m, 1))),
        negacyclic_plan(ComplexFftPlan<double>::get(
            ComplexFftLayout{.n0 = block.half_m / 2, .in_place = true})) {
    const int64_t M = block.half_m, half = M / 2;
    std::fill(real, real + M, 0.0);
    for (int64_t q = 0; q < block.nk; ++q) real[q] = std::exp(plan.z[block.k0 + q] - block.shift);
    fold_twist(real, twist, half, negacyclic.data());
    negacyclic_plan.forward(negacyclic.data(), negacyclic.data());
    for (Complex& x : negacyclic) x /= static_cast<double>(M);
    cyclic_plan.forward(real, cyclic.data());
    for (Complex& x : cyclic) x /= static_cast<double>(2 * M);
  }

  // x [M]: one column zero padded to M on entry, its linear convolution with the weights'
  // positions [0, M) on exit. X [M / 2 + 1], folded [M / 2]: scratch.
  void convolve(double* x, Complex* X, Complex* folded) const {
    const int64_t half = static_cast<int64_t>(negacyclic.size());
    fold_twist(x, twist, half, folded);
    cyclic_plan.forward(x, X);
    cat_detail::multiply_spectrum(X, cyclic.data(), half + 1, false);
    cyclic_plan.inverse(X, x);
    negacyclic_plan.forward(folded, folded);
    cat_detail::multiply_spectrum(folded, negacyclic.data(), half, false);
    negacyclic_plan.inverse(folded, folded);
    unfold_add(folded, twist, half, x);
  }
};

// row[offset + p] = factor[p] * column[p] (factor null: 1) for p < length, zero elsewhere in
// [0, m): one column of a chunk widened to float64 and zero padded for a transform of length m.
template <typename T>
void pad_row(const T* column, int64_t length, int64_t offset, int64_t m, const double* factor,
             double* row) {
  std::fill(row, row + offset, 0.0);
  std::fill(row + offset + length, row + m, 0.0);
  double* target = row + offset;
  if (factor) {
#pragma omp simd
    for (int64_t p = 0; p < length; ++p) target[p] = factor[p] * column[p];
  } else {
#pragma omp simd
    for (int64_t p = 0; p < length; ++p) target[p] = column[p];
  }
}

// exp(shift - lse[i]) for the rows of an FFT block.
std::vector<double> row_factors(const HeadPlan& plan, const CausalBlock& block) {
  std::vector<double> factor(block.nr);
  for (int64_t t = 0; t < block.nr; ++t) factor[t] = std::exp(block.shift - plan.lse[block.r0 + t]);
  return factor;
}

// Per-head scratch. A chunk of columns is moved to compact rows of the input type (cols,
// grads: [chunk, column_distance]); each column is then padded into one float64 row (x, u)
// and transformed on its own, so the padded row and its spectrum (X, U) stay in L2. Padding
// the whole chunk at once (16 rows of 2N doubles, 16 MB at N = 65536) ran the causal forward
// at 4.1x the non-causal one, memory bound; compact chunks are the non-causal path's traffic.
template <typename T>
struct HeadScratch {
  int64_t column_distance;
  Buffer<T> cols, grads;
  Buffer<double> x, u;
  Buffer<Complex> X, U, folded;

  HeadScratch(int64_t N, int64_t max_m, int64_t chunk, bool backward, int64_t max_half_m = 0)
      : column_distance(cat_detail::row_distance<T>(N)),
        cols(Buffer<T>::uninitialized(column_distance * chunk)),
        grads(Buffer<T>::uninitialized(backward ? column_distance * chunk : 0)),
        x(Buffer<double>::uninitialized(cat_detail::padded<double>(max_m))),
        u(Buffer<double>::uninitialized(backward ? cat_detail::padded<double>(max_m) : 0)),
        X(Buffer<Complex>::uninitialized(max_m / 2 + 1)),
        U(Buffer<Complex>::uninitialized(backward ? max_m / 2 + 1 : 0)),
        folded(Buffer<Complex>::uninitialized(max_half_m / 2)) {}
};

// The single-row plan of length m (the one weight_spectrum uses too).
RealFftPlan<double> row_plan(int64_t m) {
  return RealFftPlan<double>::get(cat_detail::row_layout<double>(m, 1));
}

int64_t largest_fft(const std::vector<CausalBlock>& blocks) {
  int64_t m = 1;
  for (const CausalBlock& block : blocks) m = std::max(m, block.m);
  return m;
}

int64_t largest_split(const std::vector<CausalBlock>& blocks) {
  int64_t half_m = 0;
  for (const CausalBlock& block : blocks) half_m = std::max(half_m, block.half_m);
  return half_m;
}

template <typename T>
void check_causal(View3<const T> z, View4<const T> v) {
  cat_detail::check_scores_and_values(z, v);
}

}  // namespace

template <typename T>
void cat_causal_forward(const Context& context, View3<const T> z, View4<const T> v,
                        const CatCausalOptions& options, View4<T> out) {
  check_causal(z, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  if (checked_product({B, N, H, Dv}, "v") == 0) return;
  const int64_t chunk = std::min(kForwardColumnChunk, Dv);
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    const HeadPlan plan = plan_head(z, v, b, h, options.path);
    HeadScratch<T> scratch(N, largest_fft(plan.blocks), chunk, /*backward=*/false,
                           largest_split(plan.blocks));
    std::vector<std::vector<Complex>> spectra(plan.blocks.size());
    std::vector<std::optional<SplitWeights>> splits(plan.blocks.size());
    for (size_t i = 0; i < plan.blocks.size(); ++i) {
      const CausalBlock& block = plan.blocks[i];
      if (block.half_m)
        splits[i].emplace(plan, block, scratch.x.data());
      else if (!block.direct())
        spectra[i] = weight_spectrum(plan, block, scratch.x.data());
    }
    std::vector<std::vector<double>> factors(plan.blocks.size());
    for (size_t i = 0; i < plan.blocks.size(); ++i)
      if (!plan.blocks[i].direct()) factors[i] = row_factors(plan, plan.blocks[i]);
    std::vector<DirectWeights> direct_weights;
    for (const CausalBlock& block : plan.blocks)
      if (block.direct()) direct_weights.emplace_back(plan, block);

    // Rows accumulate in float64 [N, Dv] over the blocks; a plan of one FFT block (scores
    // within the growth limit, the common case) writes its rows straight to `out`.
    const bool single = plan.blocks.size() == 1 && !plan.blocks[0].direct();
    std::vector<double> acc(single ? 0 : N * Dv, 0.0);
    size_t direct_index = 0;
    for (const CausalBlock& block : plan.blocks) {
      if (!block.direct()) continue;
      const DirectWeights& weights = direct_weights[direct_index++];
      for (int64_t i = block.r0; i < block.r0 + block.nr; ++i) {
        double* row = acc.data() + i * Dv;
        const int64_t k_end = std::min(block.k0 + block.nk, i + 1);
        for (int64_t k = block.k0; k < k_end; ++k) {
          const double w = weights(plan, block, i, k);
          const T* x = v.row(b, i - k, h);
#pragma omp simd
          for (int64_t c = 0; c < Dv; ++c) row[c] += w * x[c];
        }
      }
    }
    const int64_t cd = scratch.column_distance;
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0);
      T* cols = scratch.cols.data();
      cat_detail::gather_columns(v, b, h, 0, N, c0, count, cd, cols);
      for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
        const CausalBlock& block = plan.blocks[bi];
        if (block.direct()) continue;
        // (Split blocks transform through their own plans; fetching theirs avoids planning m.)
        const RealFftPlan<double> fft = row_plan(block.half_m ? block.half_m : block.m);
        double* x = scratch.x.data();
        Complex* X = scratch.X.data();
        const double* factor = factors[bi].data();
        for (int64_t c = 0; c < count; ++c) {
          T* column = cols + c * cd;
          if (splits[bi]) {
            pad_row(column + block.j0, block.nj, 0, block.half_m, nullptr, x);
            splits[bi]->convolve(x, X, scratch.folded.data());
          } else {
            pad_row(column + block.j0, block.nj, 0, block.m, nullptr, x);
            fft.forward(x, X);
            cat_detail::multiply_spectrum(X, spectra[bi].data(), block.m / 2 + 1, false);
            fft.inverse(X, x);
          }
          const double* y = x + block.p0;
          if (single) {  // rows [0, N): the column's values are no longer needed
#pragma omp simd
            for (int64_t t = 0; t < N; ++t) column[t] = static_cast<T>(factor[t] * y[t]);
            continue;
          }
          for (int64_t t = 0; t < block.nr; ++t)
            acc[(block.r0 + t) * Dv + c0 + c] += factor[t] * y[t];
        }
      }
      if (single) cat_detail::scatter_columns(cols, cd, T(1), b, h, c0, count, out);
    }
    if (single) return;
    for (int64_t i = 0; i < N; ++i) {
      T* row = out.row(b, i, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[i * Dv + c]);
    }
  });
}

template <typename T>
void cat_causal_backward(const Context& context, View3<const T> z, View4<const T> v,
                         View4<const T> out, View4<const T> dout,
                         const CatCausalOptions& options, View3<T> dz, View4<T> dv) {
  check_causal(z, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
  cat_detail::check_gradient_views(z, v, dout, dz, dv);
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  if (checked_product({B, N, H}, "z") == 0) return;
  const int64_t chunk = std::max<int64_t>(1, std::min(kBackwardColumnChunk, Dv));
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t b = task / H, h = task % H;
    const HeadPlan plan = plan_head(z, v, b, h, options.path);
    HeadScratch<T> scratch(N, largest_fft(plan.blocks), chunk, /*backward=*/true);
    std::vector<std::vector<Complex>> spectra(plan.blocks.size()), score_grads(plan.blocks.size());
    std::vector<std::vector<double>> factors(plan.blocks.size());
    for (size_t i = 0; i < plan.blocks.size(); ++i)
      if (!plan.blocks[i].direct()) {
        spectra[i] = weight_spectrum(plan, plan.blocks[i], scratch.x.data());
        score_grads[i].assign(plan.blocks[i].m / 2 + 1, Complex(0));
        factors[i] = row_factors(plan, plan.blocks[i]);
      }
    std::vector<DirectWeights> direct_weights;
    for (const CausalBlock& block : plan.blocks)
      if (block.direct()) direct_weights.emplace_back(plan, block);

    // dz[k] = sum_{i >= k} P[i, k] <dout[i], v[i - k]>  -  sum_{i >= k} P[i, k] <dout[i], out[i]>
    // with P[i, k] = exp(z[k] - lse[i]); `through_values` gathers the first sum.
    std::vector<double> through_values(N, 0.0);
    // dv rows [N, Dv] in float64; a single FFT block (j0 = 0, nj = N) writes dv directly.
    const bool single = plan.blocks.size() == 1 && !plan.blocks[0].direct();
    std::vector<double> acc(single ? 0 : N * Dv, 0.0);
    size_t direct_index = 0;
    for (const CausalBlock& block : plan.blocks) {
      if (!block.direct()) continue;
      // In the forward: out[i] += P[i, k] v[i - k].
      const DirectWeights& weights = direct_weights[direct_index++];
      for (int64_t i = block.r0; i < block.r0 + block.nr; ++i) {
        const T* g = dout.row(b, i, h);
        const int64_t k_end = std::min(block.k0 + block.nk, i + 1);
        for (int64_t k = block.k0; k < k_end; ++k) {
          const double w = weights(plan, block, i, k);
          const T* x = v.row(b, i - k, h);
          double* dx = acc.data() + (i - k) * Dv;
          double dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < Dv; ++c) {
            dx[c] += w * g[c];
            dot += static_cast<double>(g[c]) * x[c];
          }
          through_values[k] += w * dot;
        }
      }
    }
    const int64_t cd = scratch.column_distance;
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0);
      T* cols = scratch.cols.data();
      T* grads = scratch.grads.data();
      cat_detail::gather_columns(v, b, h, 0, N, c0, count, cd, cols);
      cat_detail::gather_columns(dout, b, h, 0, N, c0, count, cd, grads);
      for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
        const CausalBlock& block = plan.blocks[bi];
        if (block.direct()) continue;
        // In the forward: y = a (*) b (circular, length m), out[r0 + t] += f[t] y[p0 + t]
        // with f[t] = exp(shift - lse[r0 + t]). So with u[p0 + t] = f[t] dout[r0 + t]:
        // db = corr(a, u) = irfft(conj(A) U), da = corr(b, u) = irfft(conj(B) U).
        const RealFftPlan<double> fft = row_plan(block.m);
        double* x = scratch.x.data();
        double* u = scratch.u.data();
        Complex* X = scratch.X.data();
        Complex* U = scratch.U.data();
        for (int64_t c = 0; c < count; ++c) {
          T* grad = grads + c * cd;
          pad_row(cols + c * cd + block.j0, block.nj, 0, block.m, nullptr, x);
          pad_row(grad + block.r0, block.nr, block.p0, block.m, factors[bi].data(), u);
          fft.forward(x, X);
          fft.forward(u, U);
          cat_detail::accumulate_conj_product(score_grads[bi].data(), X, U, block.m / 2 + 1);
          cat_detail::multiply_spectrum(U, spectra[bi].data(), block.m / 2 + 1,
                                        /*conjugate_y=*/true);
          fft.inverse(U, u);
          if (single) {  // values [0, N): the column's dout is no longer needed
#pragma omp simd
            for (int64_t p = 0; p < N; ++p) grad[p] = static_cast<T>(u[p]);
            continue;
          }
          for (int64_t p = 0; p < block.nj; ++p) acc[(block.j0 + p) * Dv + c0 + c] += u[p];
        }
      }
      if (single) cat_detail::scatter_columns(grads, cd, T(1), b, h, c0, count, dv);
    }
    for (int64_t j = 0; j < N && !single; ++j) {
      T* row = dv.row(b, j, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[j * Dv + c]);
    }
    // Score gradients of the FFT blocks: da[q] = irfft(Q)[q] / m, dz[k0 + q] += a[q] da[q].
    for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
      const CausalBlock& block = plan.blocks[bi];
      if (block.direct()) continue;
      double* real = scratch.x.data();
      row_plan(block.m).inverse(score_grads[bi].data(), real);
      for (int64_t q = 0; q < block.nk; ++q)
        through_values[block.k0 + q] += std::exp(plan.z[block.k0 + q] - block.shift) * real[q] /
                                        static_cast<double>(block.m);
    }
    // Through the normalisers: suffix[k] = sum_{i >= k} exp(lse[k] - lse[i]) <dout[i], out[i]>,
    // then the second sum is exp(z[k] - lse[k]) suffix[k]; every factor is at most 1.
    double suffix = 0;
    for (int64_t k = N - 1; k >= 0; --k) {
      if (k + 1 < N) suffix *= std::exp(plan.lse[k] - plan.lse[k + 1]);
      const T* g = dout.row(b, k, h);
      const T* o = out.row(b, k, h);
      double dot = 0;
      for (int64_t c = 0; c < Dv; ++c) dot += static_cast<double>(g[c]) * o[c];
      suffix += dot;
      dz(b, k, h) = static_cast<T>(through_values[k] - std::exp(plan.z[k] - plan.lse[k]) * suffix);
    }
  });
}

template <typename T>
CatCausalDecoder<T>::CatCausalDecoder(int64_t heads, int64_t value_dim)
    : heads_(heads), value_dim_(value_dim) {
  check(heads >= 1, "heads: expected at least 1, got ", heads);
  check(value_dim >= 1, "value_dim: expected at least 1, got ", value_dim);
  max_.assign(heads, -std::numeric_limits<double>::infinity());
  sum_.assign(heads, 0.0);
}

template <typename T>
void CatCausalDecoder<T>::append(View1<const T> z, View2<const T> v, View2<T> out) {
  check_view(z, "z");
  cat_detail::expect_shape(z, {heads_}, "z");
  check_view(v, "v");
  cat_detail::expect_shape(v, {heads_, value_dim_}, "v");
  check_view(out, "out");
  cat_detail::expect_shape(out, {heads_, value_dim_}, "out");
  for (int64_t h = 0; h < heads_; ++h)
    check(std::isfinite(z(h)), "z: scores must be finite, got ", z(h), " at head ", h);
  const int64_t i = length_, H = heads_, Dv = value_dim_;
  for (int64_t h = 0; h < H; ++h) z_.push_back(z(h));
  for (int64_t h = 0; h < H; ++h) v_.insert(v_.end(), v.row(h), v.row(h) + Dv);
  ++length_;
  std::vector<double> acc(Dv);
  for (int64_t h = 0; h < H; ++h) {
    // Running normaliser, rescaled when the max moves (as prefix_log_sum_exp).
    const double score = z_[i * H + h];
    if (score > max_[h]) {
      sum_[h] = sum_[h] * std::exp(max_[h] - score) + 1;
      max_[h] = score;
    } else {
      sum_[h] += std::exp(score - max_[h]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k <= i; ++k) {
      const double w = std::exp(z_[k * H + h] - max_[h]);
      const T* x = v_.data() + ((i - k) * H + h) * Dv;
#pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) acc[c] += w * x[c];
    }
    T* row = out.row(h);
    for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[c] / sum_[h]);
  }
}

#define SUBQUAD_CAT_CAUSAL_INSTANTIATE(T)                                                     \
  template void cat_causal_forward<T>(const Context&, View3<const T>, View4<const T>,        \
                                      const CatCausalOptions&, View4<T>);                    \
  template void cat_causal_backward<T>(const Context&, View3<const T>, View4<const T>,       \
                                       View4<const T>, View4<const T>,                       \
                                       const CatCausalOptions&, View3<T>, View4<T>);         \
  template class CatCausalDecoder<T>;
SUBQUAD_CAT_CAUSAL_INSTANTIATE(float)
SUBQUAD_CAT_CAUSAL_INSTANTIATE(double)
#undef SUBQUAD_CAT_CAUSAL_INSTANTIATE

}  // namespace subquad
