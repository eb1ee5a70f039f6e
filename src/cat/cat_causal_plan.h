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

// lse[i] = log sum_{k <= i} exp(z[k]), by a running max (exact to a few ulps).
void prefix_log_sum_exp(const double* z, int64_t N, double* lse);

// Builds the plan for scores z [N] with prefix lse [N]. Nodes of at most `leaf` rows are
// direct; a larger node is one FFT block when its weights' total is at most `growth_limit`
// times the normaliser of its first row, else it splits in halves plus one cross block.
std::vector<CausalBlock> plan_causal_blocks(const double* z, const double* lse, int64_t N,
                                            int64_t leaf, double growth_limit);

// Smallest n >= count whose only prime factors are 2, 3 and 5 (FFTW's fastest sizes).
int64_t fast_fft_size(int64_t count);

}  // namespace subquad::cat_detail
