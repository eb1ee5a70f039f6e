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
#include "cat/cat_ops.h"
#include "subquad/cat.h"
#include "subquad/parallel.h"

namespace subquad {
namespace {

using cat_detail::CausalBlock;
using cat_detail::padded;
using Complex = std::complex<double>;

// Nodes of at most this many rows are evaluated directly (O(n^2 Dv / 2), exact): where the
// direct path stops being faster than the FFT (README.md, "Tuning constants").
constexpr int64_t kLeafRows = 64;
// An FFT block may carry weights totalling at most this many times the normaliser of its
// first row. Float64 round-off is then <~ 1.1e-16 * 3 log2(m) * 2^24 ~ 1e-7 relative to the
// row's scale (README: "Error analysis"), inside the 1e-4 row accuracy the variant promises
// even when a row's output is 256x below its scale; a smaller limit splits standard normal
// scores (first row's normaliser e^-3 against N = 65536 weights) for no accuracy need.
constexpr double kGrowthLimit = 1 << 24;
// Value columns moved to rows per gather/scatter; the transforms then run one column at a
// time (one real row per plan), as in the non-causal forward. Both choices and the chunk
// sizes are measured (README.md, "Tuning constants").
constexpr int64_t kForwardColumnChunk = 64;
constexpr int64_t kBackwardColumnChunk = 32;
// Largest exponent a direct block lets its factored weights exp(z - shift) * exp(shift - lse)
// reach before it switches to one exp per pair (exp overflows past ~709).
constexpr double kMaxFactoredExponent = 600;

// One head's scores and prefix log-normalisers (in the thread's scratch), and its block plan.
struct HeadPlan {
  const double* z;    // [N]
  const double* lse;  // [N]
  int64_t N;
  std::vector<CausalBlock> blocks;
};

// The plan of head (b, h); z_out, lse_out, value_scale [N]: the thread's scratch.
template <typename T>
HeadPlan plan_head(View3<const T> z, View4<const T> v, int64_t b, int64_t h, CatPath path,
                   double* z_out, double* lse_out, double* value_scale) {
  const int64_t N = z.shape[1], Dv = v.shape[3];
  // max_c |v[j, c]| per token (inf where v[j] is not finite): the plan keeps values that a
  // row does not see (future tokens, padding) out of its FFT blocks where their round-off
  // would outweigh the row's own values, and keeps non-finite values out of every block
  // but direct ones, which read only v[0..i] for row i.
  for (int64_t n = 0; n < N; ++n) {
    const T* row = v.row(b, n, h);
    double high = 0, poison = 0;
    for (int64_t c = 0; c < Dv; ++c) {
      high = std::max(high, std::abs(static_cast<double>(row[c])));
      poison += static_cast<double>(row[c]) * 0.0;  // NaN iff some entry is inf or NaN
    }
    value_scale[n] = poison == 0 ? high : std::numeric_limits<double>::infinity();
  }
  HeadPlan plan{z_out, lse_out, N, {}};
  // Scores relative to the first finite one: softmax is shift-invariant, and so must be the
  // result. Absolute scores of magnitude 1e17 made lse[i] = z + log(i + 1) round to z, so
  // every weight became 1 (an unnormalised prefix sum); z[k] - z[f] is exact for scores of
  // one magnitude (Sterbenz), so a common offset no longer reaches the output. z[f] is seen
  // by every row that sees a finite score (rows before it see only -inf, NaN or inf, and are
  // NaN as IEEE arithmetic makes them): a shift by the head's maximum would let a huge future
  // score (invisible to earlier rows) round their scores away.
  double first = 0;
  bool finite = true;
  for (int64_t n = N - 1; n >= 0; --n) {
    const double score = static_cast<double>(z(b, n, h));
    if (std::isfinite(score))
      first = score;
    else
      finite = false;
  }
  for (int64_t n = 0; n < N; ++n) z_out[n] = static_cast<double>(z(b, n, h)) - first;
  cat_detail::prefix_log_sum_exp(z_out, N, lse_out);
  // A non-finite score reaches the rows from its own on (IEEE arithmetic, as in the
  // reference): such a head is evaluated directly, so that earlier rows never read it.
  if (!finite) path = CatPath::direct;
  const int64_t leaf = path == CatPath::direct ? N : path == CatPath::fft ? 0 : kLeafRows;
  plan.blocks =
      cat_detail::plan_causal_blocks(z_out, lse_out, value_scale, N, leaf, kGrowthLimit);
  return plan;
}

// Weight of the pair (row i, score k) of a direct block, as a[k] * f[i] where both factors
// stay in range, else exp(z[k] - lse[i]) per pair.
struct DirectWeights {
  std::vector<double> a, f;
  bool factored;

  DirectWeights(const HeadPlan& plan, const CausalBlock& block) {
    // The shift is the block's largest finite score: an inf would make every factor of the
    // rows before it exp(inf - lse) = inf, and 0 * inf = NaN rows that cannot see it.
    double shift = -std::numeric_limits<double>::infinity();
    for (int64_t k = block.k0; k < block.k0 + block.nk; ++k)
      if (std::isfinite(plan.z[k])) shift = std::max(shift, plan.z[k]);
    factored = std::isfinite(shift) && shift - plan.lse[block.r0] <= kMaxFactoredExponent;
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
// Every array is sized by the shape alone (the largest transform any plan over N rows can
// choose), so each is one block per thread taken from the call's workspace frame before the
// parallel loop. acc is touched only by plans of several blocks.
template <typename T>
struct HeadScratch {
  int64_t column_distance;
  T *cols, *grads;          // [chunk, column_distance]; grads: backward only
  double *x, *u;            // [max_m]; u: backward only
  Complex *X, *U;           // [max_m / 2 + 1]; U: backward only
  Complex* folded;          // [max_m / 4 + 1] (a split block's half_m <= max_m / 2)
  double *z, *lse;          // [N] the head's plan
  double* value_scale;      // [N]
  double* through_values;   // [N], backward only
  double* acc;              // [N, Dv] rows over the blocks
};

// The largest FFT length a plan over N rows can choose: a block's linear convolution has
// nk + nj - 1 < 2N positions (cat_causal_plan.cpp, fft_block), and fast_fft_size grows.
int64_t largest_fft_bound(int64_t N) { return cat_detail::fast_fft_size(2 * N); }

// The per-thread blocks of HeadScratch, taken on the calling thread.
template <typename T>
class CausalScratch {
 public:
  CausalScratch(WorkspaceFrame& frame, int threads, int64_t N, int64_t Dv, int64_t chunk,
                bool backward)
      : N_(N),
        column_distance_(cat_detail::row_distance<T>(N)),
        max_m_(largest_fft_bound(N)),
        cols_(frame, threads, column_distance_ * chunk),
        grads_(frame, threads, backward ? column_distance_ * chunk : 0),
        x_(frame, threads, max_m_),
        u_(frame, threads, backward ? max_m_ : 0),
        X_(frame, threads, max_m_ / 2 + 1),
        U_(frame, threads, backward ? max_m_ / 2 + 1 : 0),
        folded_(frame, threads, max_m_ / 4 + 1),
        plan_(frame, threads, 4 * N),
        acc_(frame, threads, N * Dv) {}

  // This thread's arrays.
  HeadScratch<T> local() {
    double* plan = plan_.get();
    return {column_distance_, cols_.get(), grads_.get(), x_.get(),     u_.get(),
            X_.get(),         U_.get(),    folded_.get(), plan,         plan + N_,
            plan + 2 * N_,    plan + 3 * N_, acc_.get()};
  }

 private:
  int64_t N_, column_distance_, max_m_;
  cat_detail::ThreadScratch<T> cols_, grads_;
  cat_detail::ThreadScratch<double> x_, u_;
  cat_detail::ThreadScratch<Complex> X_, U_, folded_;
  cat_detail::ThreadScratch<double> plan_;  // z, lse, value_scale, through_values [N] each
  cat_detail::ThreadScratch<double> acc_;
};

// The single-row plan of length m (the one weight_spectrum uses too).
RealFftPlan<double> row_plan(int64_t m) {
  return RealFftPlan<double>::get(cat_detail::row_layout<double>(m, 1));
}

template <typename T>
void check_causal(View3<const T> z, View4<const T> v) {
  cat_detail::check_scores_and_values(z, v);
}

// Whether the plan is one FFT block over the whole head (scores within the growth limit,
// the common case): its rows then go straight to the output, with no float64 accumulator.
bool single_fft_block(const HeadPlan& plan) {
  return plan.blocks.size() == 1 && !plan.blocks[0].direct();
}

// What the blocks of one head need for every column, computed once per head (indexed as
// plan.blocks; direct_weights in the order of the direct blocks).
struct ForwardBlocks {
  std::vector<std::vector<Complex>> spectra;        // weight spectra of the FFT blocks
  std::vector<std::optional<SplitWeights>> splits;  // split own blocks
  std::vector<std::vector<double>> factors;         // row factors of the FFT blocks
  std::vector<DirectWeights> direct_weights;
};

ForwardBlocks prepare_forward_blocks(const HeadPlan& plan, double* x) {
  const size_t count = plan.blocks.size();
  ForwardBlocks blocks{std::vector<std::vector<Complex>>(count),
                       std::vector<std::optional<SplitWeights>>(count),
                       std::vector<std::vector<double>>(count),
                       {}};
  for (size_t i = 0; i < count; ++i) {
    const CausalBlock& block = plan.blocks[i];
    if (block.half_m)
      blocks.splits[i].emplace(plan, block, x);
    else if (!block.direct())
      blocks.spectra[i] = weight_spectrum(plan, block, x);
  }
  for (size_t i = 0; i < count; ++i)
    if (!plan.blocks[i].direct()) blocks.factors[i] = row_factors(plan, plan.blocks[i]);
  for (const CausalBlock& block : plan.blocks)
    if (block.direct()) blocks.direct_weights.emplace_back(plan, block);
  return blocks;
}

// acc [N, Dv] += the rows of the direct blocks of head (b, h).
template <typename T>
void add_direct_rows(const HeadPlan& plan, const std::vector<DirectWeights>& direct_weights,
                     View4<const T> v, int64_t b, int64_t h, double* acc) {
  const int64_t Dv = v.shape[3];
  size_t direct_index = 0;
  for (const CausalBlock& block : plan.blocks) {
    if (!block.direct()) continue;
    const DirectWeights& weights = direct_weights[direct_index++];
    for (int64_t i = block.r0; i < block.r0 + block.nr; ++i) {
      double* row = acc + i * Dv;
      const int64_t k_end = std::min(block.k0 + block.nk, i + 1);
      for (int64_t k = block.k0; k < k_end; ++k) {
        const double w = weights(plan, block, i, k);
        const T* x = v.row(b, i - k, h);
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) row[c] += w * x[c];
      }
    }
  }
}

// The FFT blocks applied to `count` value columns c0.. gathered as rows in `cols` (distance
// cd): adds their rows to acc [N, Dv], or, for a single FFT block, overwrites the columns
// with the output rows (the values are no longer needed).
template <typename T>
void add_fft_columns(const HeadPlan& plan, const ForwardBlocks& blocks, HeadScratch<T>& scratch,
                     int64_t Dv, int64_t c0, int64_t count, T* cols, double* acc) {
  const int64_t N = plan.N, cd = scratch.column_distance;
  const bool single = single_fft_block(plan);
  for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
    const CausalBlock& block = plan.blocks[bi];
    if (block.direct()) continue;
    // (Split blocks transform through their own plans; fetching theirs avoids planning m.)
    const RealFftPlan<double> fft = row_plan(block.half_m ? block.half_m : block.m);
    double* x = scratch.x;
    Complex* X = scratch.X;
    const double* factor = blocks.factors[bi].data();
    for (int64_t c = 0; c < count; ++c) {
      T* column = cols + c * cd;
      if (blocks.splits[bi]) {
        pad_row(column + block.j0, block.nj, 0, block.half_m, nullptr, x);
        blocks.splits[bi]->convolve(x, X, scratch.folded);
      } else {
        pad_row(column + block.j0, block.nj, 0, block.m, nullptr, x);
        fft.forward(x, X);
        cat_detail::multiply_spectrum(X, blocks.spectra[bi].data(), block.m / 2 + 1, false);
        fft.inverse(X, x);
      }
      const double* y = x + block.p0;
      if (single) {  // rows [0, N)
#pragma omp simd
        for (int64_t t = 0; t < N; ++t) column[t] = static_cast<T>(factor[t] * y[t]);
        continue;
      }
      for (int64_t t = 0; t < block.nr; ++t) acc[(block.r0 + t) * Dv + c0 + c] += factor[t] * y[t];
    }
  }
}

// out[b, :, h] = acc [N, Dv].
template <typename T>
void write_rows(const double* acc, int64_t b, int64_t h, View4<T> out) {
  const int64_t N = out.shape[1], Dv = out.shape[3];
  for (int64_t i = 0; i < N; ++i) {
    T* row = out.row(b, i, h);
    for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[i * Dv + c]);
  }
}

// One head of the forward: direct blocks into acc, then the FFT blocks column chunk by chunk.
template <typename T>
void forward_head(View3<const T> z, View4<const T> v, CatPath path, int64_t chunk, int64_t b,
                  int64_t h, HeadScratch<T> scratch, View4<T> out) {
  const int64_t N = v.shape[1], Dv = v.shape[3];
  const HeadPlan plan = plan_head(z, v, b, h, path, scratch.z, scratch.lse, scratch.value_scale);
  const ForwardBlocks blocks = prepare_forward_blocks(plan, scratch.x);
  const bool single = single_fft_block(plan);
  double* acc = scratch.acc;  // rows [N, Dv] over the blocks
  if (!single) std::fill(acc, acc + N * Dv, 0.0);
  add_direct_rows(plan, blocks.direct_weights, v, b, h, acc);
  for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
    const int64_t count = std::min(chunk, Dv - c0);
    T* cols = scratch.cols;
    cat_detail::gather_columns(v, b, h, 0, N, c0, count, scratch.column_distance, cols);
    add_fft_columns(plan, blocks, scratch, Dv, c0, count, cols, acc);
    if (single) cat_detail::scatter_columns(cols, scratch.column_distance, T(1), b, h, c0, count, out);
  }
  if (!single) write_rows(acc, b, h, out);
}

// What the FFT blocks of one head need in the backward (indexed as plan.blocks): the
// forward's weight spectra and row factors, and the accumulated score-gradient spectra.
struct BackwardBlocks {
  std::vector<std::vector<Complex>> spectra, score_grads;
  std::vector<std::vector<double>> factors;
  std::vector<DirectWeights> direct_weights;
};

BackwardBlocks prepare_backward_blocks(const HeadPlan& plan, double* x) {
  const size_t count = plan.blocks.size();
  BackwardBlocks blocks{std::vector<std::vector<Complex>>(count),
                        std::vector<std::vector<Complex>>(count),
                        std::vector<std::vector<double>>(count),
                        {}};
  for (size_t i = 0; i < count; ++i)
    if (!plan.blocks[i].direct()) {
      blocks.spectra[i] = weight_spectrum(plan, plan.blocks[i], x);
      blocks.score_grads[i].assign(plan.blocks[i].m / 2 + 1, Complex(0));
      blocks.factors[i] = row_factors(plan, plan.blocks[i]);
    }
  for (const CausalBlock& block : plan.blocks)
    if (block.direct()) blocks.direct_weights.emplace_back(plan, block);
  return blocks;
}

// The direct blocks' share: acc [N, Dv] (dv rows) += P[i, k] dout[i] at row i - k and
// through_values[k] += P[i, k] <dout[i], v[i - k]>. In the forward: out[i] += P[i, k] v[i - k].
template <typename T>
void add_direct_gradients(const HeadPlan& plan, const std::vector<DirectWeights>& direct_weights,
                          View4<const T> v, View4<const T> dout, int64_t b, int64_t h,
                          double* acc, double* through_values) {
  const int64_t Dv = v.shape[3];
  size_t direct_index = 0;
  for (const CausalBlock& block : plan.blocks) {
    if (!block.direct()) continue;
    const DirectWeights& weights = direct_weights[direct_index++];
    for (int64_t i = block.r0; i < block.r0 + block.nr; ++i) {
      const T* g = dout.row(b, i, h);
      const int64_t k_end = std::min(block.k0 + block.nk, i + 1);
      for (int64_t k = block.k0; k < k_end; ++k) {
        const double w = weights(plan, block, i, k);
        const T* x = v.row(b, i - k, h);
        double* dx = acc + (i - k) * Dv;
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
}

// The FFT blocks on `count` columns c0..: values in `cols`, dout in `grads` (distance cd).
// Accumulates the score-gradient spectra and adds the dv rows to acc, or, for a single FFT
// block, overwrites `grads` with them.
// In the forward: y = a (*) b (circular, length m), out[r0 + t] += f[t] y[p0 + t] with
// f[t] = exp(shift - lse[r0 + t]). So with u[p0 + t] = f[t] dout[r0 + t]:
// db = corr(a, u) = irfft(conj(A) U), da = corr(b, u) = irfft(conj(B) U).
template <typename T>
void add_fft_gradients(const HeadPlan& plan, BackwardBlocks& blocks, HeadScratch<T>& scratch,
                       int64_t Dv, int64_t c0, int64_t count, const T* cols, T* grads,
                       double* acc) {
  const int64_t N = plan.N, cd = scratch.column_distance;
  const bool single = single_fft_block(plan);
  for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
    const CausalBlock& block = plan.blocks[bi];
    if (block.direct()) continue;
    const RealFftPlan<double> fft = row_plan(block.m);
    double* x = scratch.x;
    double* u = scratch.u;
    Complex* X = scratch.X;
    Complex* U = scratch.U;
    for (int64_t c = 0; c < count; ++c) {
      T* grad = grads + c * cd;
      pad_row(cols + c * cd + block.j0, block.nj, 0, block.m, nullptr, x);
      pad_row(grad + block.r0, block.nr, block.p0, block.m, blocks.factors[bi].data(), u);
      fft.forward(x, X);
      fft.forward(u, U);
      cat_detail::accumulate_conj_product(blocks.score_grads[bi].data(), X, U, block.m / 2 + 1);
      cat_detail::multiply_spectrum(U, blocks.spectra[bi].data(), block.m / 2 + 1,
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
}

// Score gradients of the FFT blocks: da[q] = irfft(Q)[q] / m, dz[k0 + q] += a[q] da[q].
void add_fft_score_gradients(const HeadPlan& plan, BackwardBlocks& blocks, double* real,
                             double* through_values) {
  for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
    const CausalBlock& block = plan.blocks[bi];
    if (block.direct()) continue;
    row_plan(block.m).inverse(blocks.score_grads[bi].data(), real);
    for (int64_t q = 0; q < block.nk; ++q)
      through_values[block.k0 + q] += std::exp(plan.z[block.k0 + q] - block.shift) * real[q] /
                                      static_cast<double>(block.m);
  }
}

// dz = through_values - the share through the normalisers: suffix[k] = sum_{i >= k}
// exp(lse[k] - lse[i]) <dout[i], out[i]>, times exp(z[k] - lse[k]); every factor <= 1.
template <typename T>
void write_score_gradients(const HeadPlan& plan, const double* through_values,
                           View4<const T> out, View4<const T> dout, int64_t b, int64_t h,
                           View3<T> dz) {
  const int64_t N = out.shape[1], Dv = out.shape[3];
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
}

// One head of the backward.
// dz[k] = sum_{i >= k} P[i, k] <dout[i], v[i - k]>  -  sum_{i >= k} P[i, k] <dout[i], out[i]>
// with P[i, k] = exp(z[k] - lse[i]); `through_values` gathers the first sum.
template <typename T>
void backward_head(View3<const T> z, View4<const T> v, View4<const T> out, View4<const T> dout,
                   CatPath path, int64_t chunk, int64_t b, int64_t h,
                   HeadScratch<T> scratch, View3<T> dz, View4<T> dv) {
  const int64_t N = v.shape[1], Dv = v.shape[3];
  const HeadPlan plan = plan_head(z, v, b, h, path, scratch.z, scratch.lse, scratch.value_scale);
  BackwardBlocks blocks = prepare_backward_blocks(plan, scratch.x);
  double* through_values = scratch.through_values;
  std::fill(through_values, through_values + N, 0.0);
  const bool single = single_fft_block(plan);
  double* acc = scratch.acc;  // dv rows [N, Dv]
  if (!single) std::fill(acc, acc + N * Dv, 0.0);
  add_direct_gradients(plan, blocks.direct_weights, v, dout, b, h, acc, through_values);
  for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
    const int64_t count = std::min(chunk, Dv - c0), cd = scratch.column_distance;
    T* cols = scratch.cols;
    T* grads = scratch.grads;
    cat_detail::gather_columns(v, b, h, 0, N, c0, count, cd, cols);
    cat_detail::gather_columns(dout, b, h, 0, N, c0, count, cd, grads);
    add_fft_gradients(plan, blocks, scratch, Dv, c0, count, cols, grads, acc);
    if (single) cat_detail::scatter_columns(grads, cd, T(1), b, h, c0, count, dv);
  }
  if (!single) write_rows(acc, b, h, dv);
  add_fft_score_gradients(plan, blocks, scratch.x, through_values);
  write_score_gradients(plan, through_values, out, dout, b, h, dz);
}

}  // namespace

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatCausalForwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v;
  const CatCausalOptions& options = params.options;
  const View4<T> out = params.out;
  const int64_t B = v.shape[0], H = v.shape[2], Dv = v.shape[3];
  const int64_t chunk = std::min(kForwardColumnChunk, Dv);
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  CausalScratch<T> scratch(frame, thread_count(context), v.shape[1], Dv, chunk,
                           /*backward=*/false);
  parallel_for(context, B * H, [&](int64_t task) {
    forward_head(z, v, options.path, chunk, task / H, task % H, scratch.local(), out);
  });
}

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatCausalBackwardParams<T>& params) {
  const View3<const T> z = params.z;
  const View4<const T> v = params.v, out = params.out, dout = params.dout;
  const CatCausalOptions& options = params.options;
  const View3<T> dz = params.dz;
  const View4<T> dv = params.dv;
  const int64_t B = v.shape[0], H = v.shape[2], Dv = v.shape[3];
  const int64_t chunk = std::max<int64_t>(1, std::min(kBackwardColumnChunk, Dv));
  WorkspaceFrame frame(context);  // the scratch: none allocated with a workspace
  CausalScratch<T> scratch(frame, thread_count(context), v.shape[1], Dv, chunk,
                           /*backward=*/true);
  parallel_for(context, B * H, [&](int64_t task) {
    backward_head(z, v, out, dout, options.path, chunk, task / H, task % H, scratch.local(), dz,
                  dv);
  });
}

template void run<float>(Backend, const Context&, const cat_detail::CatCausalForwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const cat_detail::CatCausalForwardParams<double>&);
template void run<float>(Backend, const Context&,
                         const cat_detail::CatCausalBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const cat_detail::CatCausalBackwardParams<double>&);

}  // namespace cpu

// The public operators: checks, then the one dispatch on Context::device.
template <typename T>
void cat_causal_forward(const Context& context, View3<const T> z, View4<const T> v,
                        const CatCausalOptions& options, View4<T> out) {
  check_causal(z, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
  if (checked_product({v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, "v") == 0) return;
  dispatch(context, cat_detail::CatCausalForwardParams<T>{z, v, options, out});
}

template <typename T>
void cat_causal_backward(const Context& context, View3<const T> z, View4<const T> v,
                         View4<const T> out, View4<const T> dout,
                         const CatCausalOptions& options, View3<T> dz, View4<T> dv) {
  check_causal(z, v);
  check_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
  cat_detail::check_gradient_views(z, v, dout, dz, dv);
  if (checked_product({v.shape[0], v.shape[1], v.shape[2]}, "z") == 0) return;
  dispatch(context, cat_detail::CatCausalBackwardParams<T>{z, v, out, dout, options, dz, dv});
}

#define SUBQUAD_CAT_CAUSAL_INSTANTIATE(T)                                                     \
  template void cat_causal_forward<T>(const Context&, View3<const T>, View4<const T>,        \
                                      const CatCausalOptions&, View4<T>);                    \
  template void cat_causal_backward<T>(const Context&, View3<const T>, View4<const T>,       \
                                       View4<const T>, View4<const T>,                       \
                                       const CatCausalOptions&, View3<T>, View4<T>);
SUBQUAD_CAT_CAUSAL_INSTANTIATE(float)
SUBQUAD_CAT_CAUSAL_INSTANTIATE(double)
#undef SUBQUAD_CAT_CAUSAL_INSTANTIATE

}  // namespace subquad
