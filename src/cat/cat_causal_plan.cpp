// Block plan of causal CAT (see cat_causal_plan.h): a recursion over row ranges that stops as
// soon as one FFT block is accurate for every row of the range.
#include "cat/cat_causal_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace subquad::cat_detail {
namespace {

// Fills the (k0, nk, r0, nr, j0, nj) of a block with its FFT geometry: the linear
// convolution of nk weights with nj values has positions [0, nk + nj - 1); row r0 sits at
// p0 = r0 - k0 - j0. A circular length m leaves the wanted positions [p0, p0 + nr) free of
// wrap-around when every position >= m lands below p0: m >= nk + nj - 1 - p0.
CausalBlock fft_block(int64_t k0, int64_t nk, int64_t r0, int64_t nr, int64_t j0, int64_t nj,
                      double shift) {
  CausalBlock block{k0, nk, r0, nr};
  block.j0 = j0;
  block.nj = nj;
  block.p0 = r0 - k0 - j0;
  block.m = fast_fft_size(std::max(nk + nj - 1 - block.p0, block.p0 + nr));
  // Even fast sizes are twice a fast size. Split only where it costs no more points.
  const int64_t half_m = 2 * fast_fft_size((std::max({nk, nj, block.p0 + nr}) + 1) / 2);
  if (2 * half_m <= block.m) block.half_m = half_m;
  block.shift = shift;
  return block;
}

// The recursion of plan_causal_blocks over one head, with what every node needs.
class Planner {
 public:
  Planner(const double* z, const double* lse, const double* value_scale, int64_t N,
          int64_t leaf, double growth_limit)
      : z_(z), lse_(lse), value_scale_(value_scale), visible_(N), leaf_(leaf),
        log_growth_limit_(std::log(growth_limit)) {
    double seen = 0;
    for (int64_t j = 0; j < N; ++j) {
      if (std::isfinite(value_scale[j])) seen = std::max(seen, value_scale[j]);
      visible_[j] = seen;
    }
  }

  // Rows [o, o + n) with the weights [o, o + n).
  void node(int64_t o, int64_t n) {
    if (n <= leaf_) {
      blocks_.push_back(CausalBlock{o, n, o, n});
      return;
    }
    double high = -std::numeric_limits<double>::infinity();
    for (int64_t k = o; k < o + n; ++k) high = std::max(high, z_[k]);
    double total = 0;
    for (int64_t k = o; k < o + n; ++k) total += std::exp(z_[k] - high);
    // Round-off of the node's FFT is relative to its weights' total times its values'
    // largest magnitude (v[0, n)); row o, whose normaliser and visible values are the
    // smallest of the node, must not be outweighed by more than the limit.
    const double growth = high + std::log(total) - lse_[o] + log_value_growth(0, n, o);
    if (growth <= log_growth_limit_ || n == 1) {
      blocks_.push_back(fft_block(o, n, o, n, 0, n, high));
      return;
    }
    const int64_t half = n / 2;
    node(o, half);
    node(o + half, n - half);
    // Cross block: weights [o, o + half) to rows [o + half, o + n), lags 1 .. n - 1.
    cross(o, half, o + half, n - half);
  }

  std::vector<CausalBlock> take() { return std::move(blocks_); }

 private:
  // Weights [k0, k0 + nk) to rows [r0, r0 + nr), every weight preceding every row: their
  // sum is at most each row's normaliser, so only the values can outweigh a row. One FFT
  // block when they do not; else the quadrants, down to direct blocks (or, without direct
  // leaves, single pairs: a 1 x 1 block reads the one value its row sees).
  void cross(int64_t k0, int64_t nk, int64_t r0, int64_t nr) {
    const int64_t j0 = r0 - (k0 + nk - 1), nj = nk + nr - 1;
    if (log_value_growth(j0, nj, r0) <= log_growth_limit_ || (nk == 1 && nr == 1)) {
      double high = -std::numeric_limits<double>::infinity();
      for (int64_t k = k0; k < k0 + nk; ++k) high = std::max(high, z_[k]);
      blocks_.push_back(fft_block(k0, nk, r0, nr, j0, nj, high));
      return;
    }
    if (nk <= leaf_ && nr <= leaf_) {
      blocks_.push_back(CausalBlock{k0, nk, r0, nr});
      return;
    }
    const int64_t kh = nk > 1 ? nk / 2 : nk, rh = nr > 1 ? nr / 2 : nr;
    for (const auto& [ka, kn] : {std::pair{k0, kh}, std::pair{k0 + kh, nk - kh}})
      for (const auto& [ra, rn] : {std::pair{r0, rh}, std::pair{r0 + rh, nr - rh}})
        if (kn > 0 && rn > 0) cross(ka, kn, ra, rn);
  }

  // log(largest |v| of the values [j0, j0 + nj) / largest finite |v| that row r sees):
  // -inf when those values are all zero (their transforms are exact), +inf when one is not
  // finite or the row has seen only zeros.
  double log_value_growth(int64_t j0, int64_t nj, int64_t r) const {
    double high = 0;
    for (int64_t j = j0; j < j0 + nj; ++j) high = std::max(high, value_scale_[j]);
    if (!(high <= std::numeric_limits<double>::max())) return std::numeric_limits<double>::infinity();
    if (high == 0) return -std::numeric_limits<double>::infinity();
    return std::log(high) - std::log(visible_[r]);
  }

  const double *z_, *lse_, *value_scale_;
  std::vector<double> visible_;  // [N] largest finite |v| among v[0..j]
  int64_t leaf_;
  double log_growth_limit_;
  std::vector<CausalBlock> blocks_;
};

}  // namespace

void prefix_log_sum_exp(const double* z, int64_t N, double* lse) {
  double high = -std::numeric_limits<double>::infinity(), total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (z[i] > high) {
      total = total * std::exp(high - z[i]) + 1;
      high = z[i];
    } else if (z[i] != -std::numeric_limits<double>::infinity()) {
      // (-inf adds exp(-inf) = 0; computed it would be exp(-inf - -inf) = NaN while every
      // score so far is -inf.)
      total += std::exp(z[i] - high);
    }
    lse[i] = high + std::log(total);
  }
}

std::vector<CausalBlock> plan_causal_blocks(const double* z, const double* lse,
                                            const double* value_scale, int64_t N, int64_t leaf,
                                            double growth_limit) {
  if (N == 0) return {};
  Planner planner(z, lse, value_scale, N, leaf, growth_limit);
  planner.node(0, N);
  return planner.take();
}

int64_t fast_fft_size(int64_t count) {
  int64_t best = 1;
  while (best < count) best *= 2;
  for (int64_t p5 = 1; p5 < best; p5 *= 5)
    for (int64_t p35 = p5; p35 < best; p35 *= 3) {
      int64_t size = p35;
      while (size < count) size *= 2;
      best = std::min(best, size);
    }
  return best;
}

}  // namespace subquad::cat_detail
