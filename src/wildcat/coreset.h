// Compression of one bin of keys and values to a weighted coreset: randomly pivoted
// Cholesky (or uniform pivots) on the unit-diagonal Gaussian kernel with the incremental
// inverse of G_SS, then Nyström weights converted to the exponential kernel.
// O(n r^2 + n r D + n r Dv) per bin; checked against dense float64 algebra in
// wildcat_ref.h by wildcat_test.cpp.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "subquad/wildcat.h"

namespace subquad::wildcat {

// The residual diagonal d of G lies in [0, 1]. A key whose residual is below this is
// represented by the pivots to within the float32 noise of the update d <- d - y^2, and
// pivoting on it would scale the inverse of G_SS by 1 / d: truncating at sqrt(eps) balances
// the truncation error (entries of G - G_{:S} G_SS^-1 G_{S:} are at most
// sqrt(d_i d_j) < tol) against the round-off amplification (about eps / tol).
inline const float kResidualTolerance = std::sqrt(FLT_EPSILON);

// The pivoted factors of one bin: pivots S (pick order), M = G_SS^-1 [r', r'] (float64,
// row-major), R = G[S, :] clamped to <= 1 [r', n], and the scaled squared norms sq [n].
struct NystromFactors {
  std::vector<int64_t> pivots;
  std::vector<double> inverse;
  std::vector<float> rows;
  std::vector<float> sq;
};

// Pivoted Cholesky on scaled keys kt [n, D] (row stride ld): at most `rank` pivots,
// stopping early when every residual is below kResidualTolerance. `method` is wildcat
// (Gumbel-max pivots, probability proportional to d_i exp(sq_i)) or uniform_nystrom
// (uniformly random order, skipping keys already represented). `stream` seeds the
// counter-based random numbers of this bin. scratch [pivoted_factors_scratch_floats(n)] is
// uninitialised memory of the caller's (a thread's block of the call's workspace frame).
// `interrupt` (the call's Context::interrupt, may be null) is polled before each pivot: one
// bin of a long sequence is one task of minutes, so the pivots are where it can stop
// (throwing Interrupted).
NystromFactors pivoted_factors(const float* kt, int64_t ld, int64_t n, int64_t D, int64_t rank,
                               CoresetMethod method, uint64_t stream, float* scratch,
                               Interrupt* interrupt = nullptr);
int64_t pivoted_factors_scratch_floats(int64_t n);

// A compressed bin: the converted Nyström values Vt = W V [r', Dv] and weights w = W 1 [r'],
// point s stored as e^{log_scales[s]} [values[s], weights[s]] (Nyström points normalised to
// max(|values[s]|, |weights[s]|) = 1; uniform subsampling keeps v and 1 with log(n / r)). The
// scales of the rows of W span far more than float's exponent range when the scaled keys do (sq
// spreads beyond ~170), so they are kept as logarithms (double, true scale, no common shift); an
// all-zero row has log scale -inf and never contributes. Pivots index the bin's keys.
struct CoresetBin {
  std::vector<int64_t> pivots;
  std::vector<float> values;
  std::vector<float> weights;
  std::vector<double> log_scales;
};

// Vt and w from the factors, the scaled keys kt [n, D] (row stride ld) the factors were built
// on, and values [n, Dv] (row stride ldv): W = diag(e^{-sq_S/2}) M G[S, :] diag(e^{sq/2}),
// formed as M diag(e^{a}) E with E[j, l] = e^{kt_j.kt_l - a_j - sq_j/2} <= 1 row-shifted
// exponential-kernel rows, and the row scales combined in double. scratch
// [nystrom_coreset_scratch_floats(n, r', D, Dv)] (r' pivots) as in pivoted_factors.
CoresetBin nystrom_coreset(const NystromFactors& factors, const float* kt, int64_t ld, int64_t D,
                           const float* values, int64_t ldv, int64_t n, int64_t Dv,
                           float* scratch);
int64_t nystrom_coreset_scratch_floats(int64_t n, int64_t r, int64_t D, int64_t Dv);

// One bin end to end: recentered keys [n, D] (row stride ldk), values [n, Dv] (row stride
// ldv), scale beta, query radius (0: use the key radius), at most `rank` points. scratch
// [compress_bin_scratch_floats(n, D, Dv, rank)] and `interrupt` as in pivoted_factors. The
// factors and the coreset, whose sizes depend on the pivots found, are vectors of their own.
CoresetBin compress_bin(const float* keys, int64_t ldk, const float* values, int64_t ldv, int64_t n,
                        int64_t D, int64_t Dv, double beta, double query_radius, int64_t rank,
                        CoresetMethod method, uint64_t stream, float* scratch,
                        Interrupt* interrupt = nullptr);
int64_t compress_bin_scratch_floats(int64_t n, int64_t D, int64_t Dv, int64_t rank);

// A well-mixed 64-bit stream id for unit `index` under `seed` (splitmix64 finaliser).
uint64_t mix_seed(uint64_t seed, uint64_t index);

}  // namespace subquad::wildcat
