// The block plan of causal CAT for one head: which (score range, row range) pairs are
// evaluated directly and which by one float64 FFT each, with which exponent shift. O(N log N)
// to build in the worst case, O(N) when one FFT block suffices. README: "Causal scheme".
#pragma once

#include <cstdint>
#include <vector>

namespace subquad::cat_detail {

// Rows [r0, r0 + nr) receive sum_{k in [k0, k0 + nk), k <= i} exp(z[k] - lse[i]) v[i - k].
// FFT blocks (m > 0) compute it as a circular convolution of length m of the shifted
// weights a[q] = exp(z[k0 + q] - shift) with the values v[j0 .. j0 + nj); row r0 + t is
// position p0 + t of the result, then scaled by exp(shift - lse[i]).
// When the wanted positions lie below an even length `half_m` that also holds both inputs
// (the own blocks: p0 = 0), the forward takes them from a cyclic and a negacyclic convolution
// of length half_m instead (linear = (cyclic + negacyclic) / 2 there): two transforms of half
// the length, whose working sets stay in L2 where one of length m = 2 half_m did not. 0: none.
struct CausalBlock {
  int64_t k0, nk, r0, nr;
  int64_t j0 = 0, nj = 0, p0 = 0, m = 0, half_m = 0;
  double shift = 0;
  bool direct() const { return m == 0; }
};

// lse[i] = log sum_{k <= i} exp(z[k]), by a running max (exact to a few ulps). A score of
// -inf adds nothing; a row that has seen only -inf gets lse = -inf.
void prefix_log_sum_exp(const double* z, int64_t N, double* lse);

// Builds the plan for scores z [N] with prefix lse [N] and value magnitudes value_scale [N]
// (max_c |v[j, c]|, inf where v[j] is not finite). Nodes of at most `leaf` rows are direct;
// a larger node is one FFT block when its weights' total times its values' largest
// magnitude is at most `growth_limit` times the normaliser of its first row times the
// largest value that row sees, else it splits in halves plus cross blocks. The value factor
// keeps the round-off that a block's FFT spreads from values a row does not see (future
// tokens, padding) below that row's own accuracy: a block fails it when it holds a value
// far larger than its first row sees, or a non-finite one, and is split around it, down to
// direct blocks that read only what each row sees.
std::vector<CausalBlock> plan_causal_blocks(const double* z, const double* lse,
                                            const double* value_scale, int64_t N, int64_t leaf,
                                            double growth_limit);

// Smallest n >= count whose only prime factors are 2, 3 and 5 (FFTW's fastest sizes).
int64_t fast_fft_size(int64_t count);

}  // namespace subquad::cat_detail
