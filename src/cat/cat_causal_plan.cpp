// Block plan of causal CAT (see cat_causal_plan.h): a recursion over row ranges that stops as
// soon as one FFT block is accurate for every row of the range.
#include "cat/cat_causal_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

void plan_node(const double* z, const double* lse, int64_t o, int64_t n, int64_t leaf,
               double log_growth_limit, std::vector<CausalBlock>& blocks) {
  if (n <= leaf) {
    blocks.push_back(CausalBlock{o, n, o, n});
    return;
  }
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t k = o; k < o + n; ++k) high = std::max(high, z[k]);
  double total = 0;
  for (int64_t k = o; k < o + n; ++k) total += std::exp(z[k] - high);
  // Round-off of the node's FFT is relative to its weights' total; row o, whose
  // normaliser is the smallest of the node, must not be outweighed by more than the limit.
  if (high + std::log(total) - lse[o] <= log_growth_limit || n == 1) {
    blocks.push_back(fft_block(o, n, o, n, 0, n, high));
    return;
  }
  const int64_t half = n / 2;
  plan_node(z, lse, o, half, leaf, log_growth_limit, blocks);
  plan_node(z, lse, o + half, n - half, leaf, log_growth_limit, blocks);
  // Cross block: weights [o, o + half) to rows [o + half, o + n). Every weight precedes
  // every row, so it is at most that row's normaliser: always accurate. Lags 1 .. n - 1.
  double left_high = -std::numeric_limits<double>::infinity();
  for (int64_t k = o; k < o + half; ++k) left_high = std::max(left_high, z[k]);
  blocks.push_back(fft_block(o, half, o + half, n - half, 1, n - 1, left_high));
}

}  // namespace

void prefix_log_sum_exp(const double* z, int64_t N, double* lse) {
  double high = -std::numeric_limits<double>::infinity(), total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (z[i] > high) {
      total = total * std::exp(high - z[i]) + 1;
      high = z[i];
    } else {
      total += std::exp(z[i] - high);
    }
    lse[i] = high + std::log(total);
  }
}

std::vector<CausalBlock> plan_causal_blocks(const double* z, const double* lse, int64_t N,
                                            int64_t leaf, double growth_limit) {
  std::vector<CausalBlock> blocks;
  if (N > 0) plan_node(z, lse, 0, N, leaf, std::log(growth_limit), blocks);
  return blocks;
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
