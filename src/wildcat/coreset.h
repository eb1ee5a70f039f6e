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
// counter-based random numbers of this bin.
NystromFactors pivoted_factors(const float* kt, int64_t ld, int64_t n, int64_t D, int64_t rank,
                               CoresetMethod method, uint64_t stream);

// A compressed bin: values Vt = W V [r', Dv] and weights w = W 1 [r'] stored divided by
// exp(log_scale), so that large exponents do not overflow; pivots index the bin's keys.
struct CoresetBin {
  std::vector<int64_t> pivots;
  std::vector<float> values;
  std::vector<float> weights;
  double log_scale = 0.0;
};

// Vt and w from the factors and values [n, Dv] (row stride ldv): W = diag(exp(-sq_S/2)) M R
// diag(exp(sq/2)), with the largest exponent moved into log_scale.
CoresetBin nystrom_coreset(const NystromFactors& factors, const float* values, int64_t ldv,
                           int64_t n, int64_t Dv);

// One bin end to end: recentered keys [n, D] (row stride ldk), values [n, Dv] (row stride
// ldv), scale beta, query radius (0: use the key radius), at most `rank` points.
CoresetBin compress_bin(const float* keys, int64_t ldk, const float* values, int64_t ldv, int64_t n,
                        int64_t D, int64_t Dv, double beta, double query_radius, int64_t rank,
                        CoresetMethod method, uint64_t stream);

// A well-mixed 64-bit stream id for unit `index` under `seed` (splitmix64 finaliser).
uint64_t mix_seed(uint64_t seed, uint64_t index);

}  // namespace subquad::wildcat
