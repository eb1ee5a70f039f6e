// CAT: circular-convolutional attention (Yamada, NeurIPS 2025), 1D. One score per token and
// head, s = softmax(z) over the sequence, and the attention matrix is the circulant of s:
// O(N log N) per head and value column with FFTs (src/cat/README.md has the math).
//   z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv]
// Conventions: roll (default) A[i, j] = s[(j - i) mod N]; conv A[i, j] = s[(i - j) mod N].
// Causal variant (lag convention, prefix normaliser):
//   out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).
// Non-finite z or v propagates as IEEE arithmetic does (docs/conventions.md): through the
// softmax and the FFT it reaches every row of its head (non-causal), or the rows that see it
// (causal: such heads are planned so that earlier rows never read it).
#pragma once

#include <cstdint>
#include <optional>

#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

enum class CatConvention { roll, conv };

// automatic: the direct O(N^2 Dv) gather for small N (below a measured crossover), the FFT
// path above it. direct / fft force one path (tests use direct as a second oracle).
enum class CatPath { automatic, direct, fft };

struct CatOptions {
  CatConvention convention = CatConvention::roll;
  CatPath path = CatPath::automatic;
};

// Layouts (cat_forward, cat_backward): every view has its last axis contiguous (the
// [B, N, H, Dv] layout) or its sequence axis, dimension 1, contiguous (sequence-last memory:
// v a [B, N, H, Dv] view of a [B, H, Dv, N] array, strides {H Dv N, 1, Dv N, N}, and z a view
// of [B, H, N], strides {H N, 1, N}). Sequence-last is the faster layout for long sequences
// and for every backward: each value column is a contiguous row that the transforms run on
// in place (src/cat/README.md, "Sequence-last layout"; measured speed-ups in docs/perf/cat.md).
// Views may mix the layouts (a value view in the other one is read or written strided:
// correct, slow). The causal variant (cat_causal_forward, cat_causal_backward) takes the same
// layouts: on sequence-last memory its float64 transforms read v's (and dout's) columns and
// write out's (dv's) in place, with no gather or scatter.
template <typename T>
void cat_forward(const Context& context, View3<const T> z, View4<const T> v,
                 const CatOptions& options, View4<T> out);

// dz [B, N, H] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_backward(const Context& context, View3<const T> z, View4<const T> v,
                  View4<const T> dout, const CatOptions& options, View3<T> dz, View4<T> dv);

// Averaged-key variant: z[b, i, h] = scale * <q[b, i, h], mean_j k[b, j, h]>, then CAT.
// q, k [B, N, H, D], v [B, N, H, Dv]; scale defaults to 1/sqrt(D).
struct CatAvgKeyOptions {
  std::optional<double> scale;
  CatConvention convention = CatConvention::roll;
  CatPath path = CatPath::automatic;
};

template <typename T>
void cat_avgkey_forward(const Context& context, View4<const T> q, View4<const T> k,
                        View4<const T> v, const CatAvgKeyOptions& options, View4<T> out);

// dq, dk [B, N, H, D] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_avgkey_backward(const Context& context, View4<const T> q, View4<const T> k,
                         View4<const T> v, View4<const T> dout, const CatAvgKeyOptions& options,
                         View4<T> dq, View4<T> dk, View4<T> dv);

// Causal variant. automatic: exact direct blocks near the diagonal of the lag structure and
// float64 FFT blocks elsewhere, each with its own exponent shift, so that every row is
// accurate relative to its own normaliser and the values it sees (README: "Causal scheme":
// a value a row does not see changes it by at most that row's round-off, whatever its
// magnitude); direct: O(N^2 Dv);
// fft: FFT blocks down to single rows (no direct leaves; a test oracle for the FFT blocks).
// The result is shift-invariant: adding any constant to every z of a head (with z + c
// finite) leaves the output unchanged up to the rounding of z + c itself.
struct CatCausalOptions {
  CatPath path = CatPath::automatic;
};

template <typename T>
void cat_causal_forward(const Context& context, View3<const T> z, View4<const T> v,
                        const CatCausalOptions& options, View4<T> out);

// Needs the forward's `out`. dz [B, N, H] and dv [B, N, H, Dv] are overwritten.
template <typename T>
void cat_causal_backward(const Context& context, View3<const T> z, View4<const T> v,
                         View4<const T> out, View4<const T> dout,
                         const CatCausalOptions& options, View3<T> dz, View4<T> dv);

// Decoding causal CAT over caller-owned state: z [B, S, H] and v [B, S, H, Dv] hold every
// token of B sequences seen so far, the T new ones last; out [B, T, H, Dv] (T <= S)
// receives their rows S - T .. S - 1 of cat_causal_forward(z, v). Nothing is kept between
// calls: the caller appends each new token's score and value to its own z and v (slices of
// larger buffers are read in place) and can roll back or copy them freely. O(S Dv) per head
// and new token, accumulated in float64.
template <typename T>
void cat_causal_decode(const Context& context, View3<const T> z, View4<const T> v,
                       View4<T> out);

// ---- flop and byte models (conventions: subquad/cost.h) ----------------------------
// Per head: Dv forward and Dv inverse real transforms of v's columns, one of the scores,
// Dv spectral products of N / 2 + 1 bins.
Cost cat_forward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes);
// The backward: 3 Dv + 2 transforms per head (dout's columns, the products' inverses,
// v's columns for dz, the scores and dz's inverse).
Cost cat_backward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv, int64_t element_bytes);
// Causal CAT when one FFT block covers the head: the transforms of the padded length 2N.
Cost cat_causal_forward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                             int64_t element_bytes);
Cost cat_causal_backward_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                              int64_t element_bytes);
// The scores q . mean(k) (2 N D per head for the mean and the dot products) on top of CAT.
Cost cat_avgkey_forward_cost(int64_t B, int64_t N, int64_t H, int64_t D, int64_t Dv,
                             int64_t element_bytes);

}  // namespace subquad
