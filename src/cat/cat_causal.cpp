// Causal CAT forward and backward: out[i] = sum_{k <= i} exp(z[k] - lse[i]) v[i - k], by the
// block plan of cat_causal_plan.h (direct blocks plus float64 FFT blocks with their own
// shifts), O(N log N Dv) per head when scores span a bounded range. Views in either layout
// (cat_sequence_last.h): sequence-last columns are transformed in place. Reference: cat_ref.h.
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
#include "cat/cat_sequence_last.h"
#include "common/parallel.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

using cat_detail::CausalBlock;
using cat_detail::last_axis_contiguous;
using cat_detail::padded;
using cat_detail::sequence_contiguous;
using Complex = std::complex<double>;

// Nodes of at most this many rows are evaluated directly (O(n^2 Dv / 2), exact): where the
// direct path stops being faster than the FFT (docs/perf/cat.md, "Tuning constants").
constexpr int64_t kLeafRows = 64;
// An FFT block may carry weights totalling at most this many times the normaliser of its
// first row. Float64 round-off is then <~ 1.1e-16 * 3 log2(m) * 2^24 ~ 1e-7 relative to the
// row's scale (README: "Error analysis"), inside the 1e-4 row accuracy the variant promises
// even when a row's output is 256x below its scale; a smaller limit splits standard normal
// scores (first row's normaliser e^-3 against N = 65536 weights) for no accuracy need.
constexpr double kGrowthLimit = 1 << 24;
// Value columns moved to rows per gather/scatter; the transforms then run one column at a
// time (one real row per plan), as in the non-causal forward. Both choices and the chunk
// sizes are measured (docs/perf/cat.md, "Tuning constants").
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

// max_c |v[b, n, h, c]| per token n (inf where v[b, n, h] is not finite) into value_scale [N];
// poison [N]: scratch. On sequence-last memory column by column: token by token, the Dv
// columns N floats apart (a power of two) all mapped to one cache set.
template <typename T>
void value_scales(View4<const T> v, int64_t b, int64_t h, double* value_scale, double* poison) {
  const int64_t N = v.shape[1], Dv = v.shape[3];
  if (last_axis_contiguous(v)) {
    for (int64_t n = 0; n < N; ++n) {
      const T* row = v.row(b, n, h);
      double high = 0, sum = 0;
      for (int64_t c = 0; c < Dv; ++c) {
        high = std::max(high, std::abs(static_cast<double>(row[c])));
        sum += static_cast<double>(row[c]) * 0.0;  // NaN iff some entry is inf or NaN
      }
      poison[n] = sum;
      value_scale[n] = high;
    }
  } else {
    std::fill(value_scale, value_scale + N, 0.0);
    std::fill(poison, poison + N, 0.0);
    for (int64_t c = 0; c < Dv; ++c) {
      const T* column = &v(b, 0, h, c);  // sequence-contiguous
      for (int64_t n = 0; n < N; ++n) {
        value_scale[n] = std::max(value_scale[n], std::abs(static_cast<double>(column[n])));
        poison[n] += static_cast<double>(column[n]) * 0.0;
      }
    }
  }
  for (int64_t n = 0; n < N; ++n)
    if (poison[n] != 0) value_scale[n] = std::numeric_limits<double>::infinity();
}

// The plan of head (b, h); z_out, lse_out, value_scale [N]: the thread's scratch.
template <typename T>
HeadPlan plan_head(View3<const T> z, View4<const T> v, int64_t b, int64_t h, CatPath path,
                   double* z_out, double* lse_out, double* value_scale) {
  const int64_t N = z.shape[1];
  // The value scales keep values that a row does not see (future tokens, padding) out of its
  // FFT blocks where their round-off would outweigh the row's own values, and non-finite
  // values out of every block but direct ones, which read only v[0..i] for row i. (lse_out
  // is their scratch until the prefix normalisers are computed.)
  value_scales(v, b, h, value_scale, lse_out);
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

// Per-head scratch. On [B, N, H, Dv] memory a chunk of columns is moved to compact rows of
// the input type (cols, grads: [chunk, column_distance]); on sequence-last memory the columns
// are read and written in place. Each column is then padded into one float64 row (x, u)
// and transformed on its own, so the padded row and its spectrum (X, U) stay in L2. Padding
// the whole chunk at once (16 rows of 2N doubles, 16 MB at N = 65536) ran the causal forward
// at 4.1x the non-causal one, memory bound; compact chunks are the non-causal path's traffic.
// Direct blocks read token rows: on sequence-last memory the head's values (and dout) are
// first moved to token-major rows (value_rows, grad_rows), only when the plan has a direct
// block. Every array is sized by the shape alone (the largest transform any plan over N rows
// can choose), so each is one block per thread taken from the call's workspace frame before
// the parallel loop (empty where the layouts do not need it). acc is touched only by plans of
// several blocks.
template <typename T>
struct HeadScratch {
  int64_t column_distance;
  T *cols, *grads;             // [chunk, column_distance]; grads: backward only
  T *value_rows, *grad_rows;   // [N, Dv]; grad_rows: backward only
  double *x, *u;               // [max_m]; u: backward only
  Complex *X, *U;              // [max_m / 2 + 1]; U: backward only
  Complex* folded;             // [max_m / 4 + 1] (a split block's half_m <= max_m / 2)
  double *z, *lse;             // [N] the head's plan
  double* value_scale;         // [N]; after planning, the rows' <dout, out> (backward)
  double* through_values;      // [N], backward only
  double* acc;                 // [N, Dv] rows over the blocks
};

// Which per-thread arrays the views' layouts need: compact columns for a value view (v, out)
// or gradient view (dout, dv) without a contiguous sequence axis, token rows for a value
// (v) or gradient (dout) view without a contiguous last axis.
struct ScratchNeeds {
  bool cols, grads, value_rows, grad_rows;
};

// The largest FFT length a plan over N rows can choose: a block's linear convolution has
// nk + nj - 1 < 2N positions (cat_causal_plan.cpp, fft_block), and fast_fft_size grows.
int64_t largest_fft_bound(int64_t N) { return cat_detail::fast_fft_size(2 * N); }

// The per-thread blocks of HeadScratch, taken on the calling thread.
template <typename T>
class CausalScratch {
 public:
  CausalScratch(WorkspaceFrame& frame, int threads, int64_t N, int64_t Dv, int64_t chunk,
                bool backward, ScratchNeeds needs)
      : N_(N),
        column_distance_(cat_detail::row_distance<T>(N)),
        max_m_(largest_fft_bound(N)),
        cols_(frame, threads, needs.cols ? column_distance_ * chunk : 0),
        grads_(frame, threads, needs.grads ? column_distance_ * chunk : 0),
        value_rows_(frame, threads, needs.value_rows ? N * Dv : 0),
        grad_rows_(frame, threads, needs.grad_rows ? N * Dv : 0),
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
    return {column_distance_, cols_.get(), grads_.get(),   value_rows_.get(), grad_rows_.get(),
            x_.get(),         u_.get(),    X_.get(),       U_.get(),          folded_.get(),
            plan,             plan + N_,   plan + 2 * N_,  plan + 3 * N_,     acc_.get()};
  }

 private:
  int64_t N_, column_distance_, max_m_;
  cat_detail::ThreadScratch<T> cols_, grads_, value_rows_, grad_rows_;
  cat_detail::ThreadScratch<double> x_, u_;
  cat_detail::ThreadScratch<Complex> X_, U_, folded_;
  cat_detail::ThreadScratch<double> plan_;  // z, lse, value_scale, through_values [N] each
  cat_detail::ThreadScratch<double> acc_;
};

// The single-row plan of length m (the one weight_spectrum uses too).
RealFftPlan<double> row_plan(int64_t m) {
  return RealFftPlan<double>::get(cat_detail::row_layout<double>(m, 1));
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

// Columns c0 .. c0 + count of a head, each a contiguous row of tokens: `first` is column c0,
// column c0 + c starts at first + c * distance.
template <typename T>
struct Columns {
  T* first;
  int64_t distance;
  T* operator[](int64_t c) const { return first + c * distance; }
};

// Columns c0.. of head (b, h) in place: the view's sequence axis is contiguous.
template <typename T>
Columns<T> columns_in_place(View4<T> x, int64_t b, int64_t h, int64_t c0) {
  return {&x(b, 0, h, c0), x.strides[3]};
}

// The columns a chunk reads: in place on sequence-last memory, else gathered into `rows`.
template <typename T>
Columns<const T> input_columns(View4<const T> x, int64_t b, int64_t h, int64_t c0, int64_t count,
                               int64_t distance, T* rows) {
  if (sequence_contiguous(x)) return columns_in_place(x, b, h, c0);
  cat_detail::gather_columns(x, b, h, 0, x.shape[1], c0, count, distance, rows);
  return {rows, distance};
}

// The columns a single-block chunk writes: in place on sequence-last memory, else `rows`
// (scattered by finish_output_columns).
template <typename T>
Columns<T> output_columns(View4<T> x, int64_t b, int64_t h, int64_t c0, int64_t distance,
                          T* rows) {
  if (sequence_contiguous(x)) return columns_in_place(x, b, h, c0);
  return {rows, distance};
}

template <typename T>
void finish_output_columns(Columns<T> columns, int64_t b, int64_t h, int64_t c0, int64_t count,
                           View4<T> x) {
  if (!sequence_contiguous(x))
    cat_detail::scatter_columns(columns.first, columns.distance, T(1), b, h, c0, count, x);
}

// The FFT blocks applied to `count` value columns c0..: adds their rows to acc [N, Dv], or,
// for a single FFT block, writes the output columns to `target` (which may be `values`: a
// column is read into the padded row before its output is written).
template <typename T>
void add_fft_columns(const HeadPlan& plan, const ForwardBlocks& blocks, HeadScratch<T>& scratch,
                     int64_t Dv, int64_t c0, int64_t count, Columns<const T> values,
                     Columns<T> target, double* acc) {
  const int64_t N = plan.N;
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
      const T* column = values[c];
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
        T* output = target[c];
#pragma omp simd
        for (int64_t t = 0; t < N; ++t) output[t] = static_cast<T>(factor[t] * y[t]);
        continue;
      }
      for (int64_t t = 0; t < block.nr; ++t) acc[(block.r0 + t) * Dv + c0 + c] += factor[t] * y[t];
    }
  }
}

// Tokens per tile of write_rows on sequence-last memory: a tile of acc ([64, Dv] doubles)
// stays in L1 / L2 while its columns are written out.
constexpr int64_t kRowTile = 64;

// out[b, :, h] = acc [N, Dv].
template <typename T>
void write_rows(const double* acc, int64_t b, int64_t h, View4<T> out) {
  const int64_t N = out.shape[1], Dv = out.shape[3];
  if (last_axis_contiguous(out)) {
    for (int64_t i = 0; i < N; ++i) {
      T* row = out.row(b, i, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[i * Dv + c]);
    }
    return;
  }
  for (int64_t i0 = 0; i0 < N; i0 += kRowTile) {
    const int64_t rows = std::min(kRowTile, N - i0);
    for (int64_t c = 0; c < Dv; ++c) {
      T* column = &out(b, i0, h, c);  // sequence-contiguous
      for (int64_t i = 0; i < rows; ++i) column[i] = static_cast<T>(acc[(i0 + i) * Dv + c]);
    }
  }
}

// Head (b, h) of x as token rows for the direct blocks: x itself (at b, h) when its last axis
// is contiguous, else moved to rows [N, Dv] (a [1, N, 1, Dv] view, at 0, 0).
template <typename T>
struct TokenRows {
  View4<const T> view;
  int64_t b, h;
};

template <typename T>
TokenRows<T> token_rows(View4<const T> x, int64_t b, int64_t h, T* rows) {
  if (last_axis_contiguous(x)) return {x, b, h};
  const int64_t N = x.shape[1], Dv = x.shape[3];
  for (int64_t c = 0; c < Dv; ++c) {
    const T* column = &x(b, 0, h, c);  // sequence-contiguous
    for (int64_t n = 0; n < N; ++n) rows[n * Dv + c] = column[n];
  }
  return {View4<const T>(rows, {1, N, 1, Dv}), 0, 0};
}

// Whether the plan has a block that is direct (direct = true) or an FFT block (false).
bool has_block(const HeadPlan& plan, bool direct) {
  return std::any_of(plan.blocks.begin(), plan.blocks.end(),
                     [&](const CausalBlock& block) { return block.direct() == direct; });
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
  if (has_block(plan, /*direct=*/true)) {
    const TokenRows<T> rows = token_rows(v, b, h, scratch.value_rows);
    add_direct_rows(plan, blocks.direct_weights, rows.view, rows.b, rows.h, acc);
  }
  if (has_block(plan, /*direct=*/false))
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0), cd = scratch.column_distance;
      const Columns<const T> values = input_columns(v, b, h, c0, count, cd, scratch.cols);
      const Columns<T> target = output_columns(out, b, h, c0, cd, scratch.cols);
      add_fft_columns(plan, blocks, scratch, Dv, c0, count, values, target, acc);
      if (single) finish_output_columns(target, b, h, c0, count, out);
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
                          TokenRows<T> values, TokenRows<T> grads, double* acc,
                          double* through_values) {
  const View4<const T> v = values.view, dout = grads.view;
  const int64_t Dv = v.shape[3];
  size_t direct_index = 0;
  for (const CausalBlock& block : plan.blocks) {
    if (!block.direct()) continue;
    const DirectWeights& weights = direct_weights[direct_index++];
    for (int64_t i = block.r0; i < block.r0 + block.nr; ++i) {
      const T* g = dout.row(grads.b, i, grads.h);
      const int64_t k_end = std::min(block.k0 + block.nk, i + 1);
      for (int64_t k = block.k0; k < k_end; ++k) {
        const double w = weights(plan, block, i, k);
        const T* x = v.row(values.b, i - k, values.h);
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

// The FFT blocks on `count` columns c0..: values and dout columns. Accumulates the
// score-gradient spectra and adds the dv rows to acc, or, for a single FFT block, writes the
// dv columns to `target` (which may be `grads`: a column is read before it is written).
// In the forward: y = a (*) b (circular, length m), out[r0 + t] += f[t] y[p0 + t] with
// f[t] = exp(shift - lse[r0 + t]). So with u[p0 + t] = f[t] dout[r0 + t]:
// db = corr(a, u) = irfft(conj(A) U), da = corr(b, u) = irfft(conj(B) U).
template <typename T>
void add_fft_gradients(const HeadPlan& plan, BackwardBlocks& blocks, HeadScratch<T>& scratch,
                       int64_t Dv, int64_t c0, int64_t count, Columns<const T> values,
                       Columns<const T> grads, Columns<T> target, double* acc) {
  const int64_t N = plan.N;
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
      pad_row(values[c] + block.j0, block.nj, 0, block.m, nullptr, x);
      pad_row(grads[c] + block.r0, block.nr, block.p0, block.m, blocks.factors[bi].data(), u);
      fft.forward(x, X);
      fft.forward(u, U);
      cat_detail::accumulate_conj_product(blocks.score_grads[bi].data(), X, U, block.m / 2 + 1);
      cat_detail::multiply_spectrum(U, blocks.spectra[bi].data(), block.m / 2 + 1,
                                    /*conjugate_y=*/true);
      fft.inverse(U, u);
      if (single) {  // values [0, N)
        T* output = target[c];
#pragma omp simd
        for (int64_t p = 0; p < N; ++p) output[p] = static_cast<T>(u[p]);
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

// dots[i] = <dout[b, i, h], out[b, i, h]> for i < N, summed over the channels in order (the
// same sums in both layouts). Column by column unless both views have their last axis
// contiguous: token by token, sequence-last columns N floats apart map to one cache set.
template <typename T>
void row_dots(View4<const T> out, View4<const T> dout, int64_t b, int64_t h, double* dots) {
  const int64_t N = out.shape[1], Dv = out.shape[3];
  if (last_axis_contiguous(out) && last_axis_contiguous(dout)) {
    for (int64_t i = 0; i < N; ++i) {
      const T* g = dout.row(b, i, h);
      const T* o = out.row(b, i, h);
      double dot = 0;
      for (int64_t c = 0; c < Dv; ++c) dot += static_cast<double>(g[c]) * o[c];
      dots[i] = dot;
    }
    return;
  }
  std::fill(dots, dots + N, 0.0);
  const int64_t gs = dout.strides[1], os = out.strides[1];
  for (int64_t c = 0; c < Dv; ++c) {
    const T* g = &dout(b, 0, h, c);
    const T* o = &out(b, 0, h, c);
    for (int64_t i = 0; i < N; ++i) dots[i] += static_cast<double>(g[i * gs]) * o[i * os];
  }
}

// dz = through_values - the share through the normalisers: suffix[k] = sum_{i >= k}
// exp(lse[k] - lse[i]) dots[i], dots[i] = <dout[i], out[i]>, times exp(z[k] - lse[k]); every
// factor <= 1.
template <typename T>
void write_score_gradients(const HeadPlan& plan, const double* through_values, const double* dots,
                           int64_t b, int64_t h, View3<T> dz) {
  const int64_t N = plan.N;
  double suffix = 0;
  for (int64_t k = N - 1; k >= 0; --k) {
    if (k + 1 < N) suffix *= std::exp(plan.lse[k] - plan.lse[k + 1]);
    suffix += dots[k];
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
  if (has_block(plan, /*direct=*/true)) {
    const TokenRows<T> values = token_rows(v, b, h, scratch.value_rows);
    const TokenRows<T> grads = token_rows(dout, b, h, scratch.grad_rows);
    add_direct_gradients(plan, blocks.direct_weights, values, grads, acc, through_values);
  }
  if (has_block(plan, /*direct=*/false))
    for (int64_t c0 = 0; c0 < Dv; c0 += chunk) {
      const int64_t count = std::min(chunk, Dv - c0), cd = scratch.column_distance;
      const Columns<const T> values = input_columns(v, b, h, c0, count, cd, scratch.cols);
      const Columns<const T> grads = input_columns(dout, b, h, c0, count, cd, scratch.grads);
      const Columns<T> target = output_columns(dv, b, h, c0, cd, scratch.grads);
      add_fft_gradients(plan, blocks, scratch, Dv, c0, count, values, grads, target, acc);
      if (single) finish_output_columns(target, b, h, c0, count, dv);
    }
  if (!single) write_rows(acc, b, h, dv);
  add_fft_score_gradients(plan, blocks, scratch.x, through_values);
  double* dots = scratch.value_scale;  // free once the plan is built
  row_dots(out, dout, b, h, dots);
  write_score_gradients(plan, through_values, dots, b, h, dz);
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
  const ScratchNeeds needs{.cols = !sequence_contiguous(v) || !sequence_contiguous(out),
                           .grads = false,
                           .value_rows = !last_axis_contiguous(v),
                           .grad_rows = false};
  CausalScratch<T> scratch(frame, thread_count(context), v.shape[1], Dv, chunk,
                           /*backward=*/false, needs);
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
  const ScratchNeeds needs{.cols = !sequence_contiguous(v),
                           .grads = !sequence_contiguous(dout) || !sequence_contiguous(dv),
                           .value_rows = !last_axis_contiguous(v),
                           .grad_rows = !last_axis_contiguous(dout)};
  CausalScratch<T> scratch(frame, thread_count(context), v.shape[1], Dv, chunk,
                           /*backward=*/true, needs);
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

// The public operators: checks (every view with its last or its sequence axis contiguous,
// cat_sequence_last.h), then the one dispatch on Context::device.
template <typename T>
void cat_causal_forward(const Context& context, View3<const T> z, View4<const T> v,
                        const CatCausalOptions& options, View4<T> out) {
  cat_detail::check_cat_forward_views(z, v, out);
  if (checked_product({v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, "v") == 0) return;
  dispatch(context, cat_detail::CatCausalForwardParams<T>{z, v, options, out});
}

template <typename T>
void cat_causal_backward(const Context& context, View3<const T> z, View4<const T> v,
                         View4<const T> out, View4<const T> dout,
                         const CatCausalOptions& options, View3<T> dz, View4<T> dv) {
  cat_detail::check_cat_backward_views(z, v, dout, dz, dv);
  cat_detail::check_cat_view(out, "out");
  cat_detail::expect_shape(out, v.shape, "out");
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
