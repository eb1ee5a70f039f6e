// Structured-matrix attention (Kuang et al., ICML 2025; docs/specs/structured.md):
//   - MLR attention: a multi-level low-rank T x T score matrix, forward, backward and
//     stateless decoding over a caller-owned per-level key cache;
//   - bilinear MLR and BTT score projections (the structured bilinear form x^T M x'), whose
//     outputs feed the exact attention kernel;
//   - MLBTC, the general sum of permuted block-diagonal products these are special cases of.
// Layouts follow exact.h: q [B, N, H, D], k [B, N, Hkv, D], v [B, N, Hkv, Dv].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

// ---------------------------------------------------------------------------------------
// MLR attention. The head dim D is split into level chunks r_1 | ... | r_L (sum = D). Level l
// (1-based) splits the sequence into 2^(l-1) equal blocks of T / 2^(l-1) tokens and adds
// <q_l[i], k_l[j]> / r_l only when i and j lie in the same level-l block:
//   S[i, j] = sum_{l : block_l(i) == block_l(j)} <q_l[i], k_l[j]> / r_l
// (divided by the number of such levels under block_divide); then the causal mask (query i
// sees keys j <= i), softmax and S V. T must be divisible by 2^(L-1); queries and keys
// share one sequence (N = M = T).
struct MlrOptions {
  std::vector<int64_t> ranks;  // r_1 .. r_L, each >= 1, sum = D
  bool causal = false;
  bool block_divide = false;
};

// out [B, T, H, Dv], lse [B, H, T] (lse may be empty). H % Hkv == 0 (grouped queries).
template <typename T>
void mlr_attention_forward(const Context& context, View4<const T> q, View4<const T> k,
                           View4<const T> v, const MlrOptions& options, View4<T> out,
                           View3<T> lse);

// Backward from the forward's out and lse (required). dq [B, T, H, D], dk [B, T, Hkv, D],
// dv [B, T, Hkv, Dv] are overwritten (GQA sums over the query heads of a group).
template <typename T>
void mlr_attention_backward(const Context& context, View4<const T> q, View4<const T> k,
                            View4<const T> v, View4<const T> out, View3<const T> lse,
                            View4<const T> dout, const MlrOptions& options, View4<T> dq,
                            View4<T> dk, View4<T> dv);

// Multiply-adds of forming the scores of one head, non-causal: T^2 sum_l r_l / 2^(l-1).
double mlr_score_macs(int64_t tokens, const std::vector<int64_t>& ranks);

// The ranks of the MLR paper's language model, 32|8|6|4|4|4|4|2 at head dim 64, for
// `head_dim` and `tokens`: other head dims scale levels 2.. (at least 1 each, level 1 takes
// the rest), with 8 levels only when head_dim >= 16 (else one level of rank head_dim); levels
// that `tokens` cannot split (tokens % 2^(L-1) != 0) are folded into level 1. The ranks sum
// to head_dim. The default of `subquad bench` and the benchmarks.
std::vector<int64_t> mlr_language_model_ranks(int64_t head_dim, int64_t tokens);

// Causal decoding of MLR attention over caller-owned state, with blocks on the absolute
// positions 0 .. context - 1 (context divisible by 2^(L-1)):
//   - level_keys[l] [B, Hkv, s_l, r_l], s_l = mlr_level_block_sizes(ranks, context)[l]: level
//     l keeps only the keys of its current block, the level-l columns of position p's key in
//     slot p mod s_l (a new block overwrites from slot 0);
//   - v [B, S, Hkv, Dv]: the values of every position seen, the newest last.
// q [B, T, H, D] are the queries of positions S - T .. S - 1, which must lie in one block of
// the finest level (the caller splits longer updates at its boundaries, storing each part's
// keys before decoding it); out [B, T, H, Dv] receives their rows of the causal
// mlr_attention_forward over `context` tokens. Nothing is kept between calls: rolling back
// within the current finest block is the caller's (the level caches still hold every key
// its rows read). O(sum_l r_l (p mod s_l) + p Dv) per head for position p.
template <typename T>
void mlr_decode(const Context& context, View4<const T> q, std::span<const View4<const T>> level_keys,
                View4<const T> v, const MlrOptions& options, int64_t context_length,
                View4<T> out);

// The block sizes s_l = context / 2^(l-1) of the levels of `ranks` (throws Error unless
// 2^(L-1) divides context).
std::vector<int64_t> mlr_level_block_sizes(const std::vector<int64_t>& ranks, int64_t context);

// Level-cache floats of one kv head after a full context: context sum_l r_l / 2^(l-1), the
// sum of s_l r_l (the dense key cache holds context * D).
int64_t mlr_key_cache_prediction(int64_t context, const std::vector<int64_t>& ranks);

// ---------------------------------------------------------------------------------------
// Weight RMS capping, applied inside the forward of the projections below:
//   W' = W / max(1, rms(W) / c),  rms = sqrt(mean(W^2) + 1e-8),  c = sqrt(min(d_in, d_out)) / d_in
// with d_in, d_out the fan-in and fan-out of one block of the weight.
double rms_cap_limit(int64_t fan_in, int64_t fan_out);

// ---------------------------------------------------------------------------------------
// Bilinear MLR projection. Model dim Dm, ranks r_1..r_L. Level l splits the features into
// p_l = 2^(l-1) blocks of m_l = Dm / p_l; weight_l [p_l, m_l, H r_l]. For head h the level-l
// features are u_{l,h}[k r_l + r] = sum_i x[k m_l + i] W_l[k, i, h r_l + r] (length r_l p_l),
// then LayerNorm over those r_l p_l features (no affine), times level_scale[l]:
//   y [B, N, H, E], E = sum_l r_l p_l, level l at offset sum_{l' < l} r_l' p_l'.
// Queries and keys are two such projections; S_h = q_h k_h^T is then sum_l c_l q_l k_l^T
// with c_l folded into the query side's level_scale (bilinear_mlr_level_scales), so
// attention runs on the exact kernel with head dim E and scale 1.
struct BilinearMlrOptions {
  std::vector<int64_t> ranks;
  int64_t heads = 1;
  std::vector<double> level_scale;  // empty: all 1
  bool layer_norm = true;
  bool rms_cap = true;  // per level, fan_in m_l, fan_out H r_l
};

// c_l = 1 / sqrt(r_l p_l), or 8 / (r_l p_l) under muP.
std::vector<double> bilinear_mlr_level_scales(const std::vector<int64_t>& ranks, bool mup);
// E = sum_l r_l 2^(l-1).
int64_t bilinear_mlr_output_dim(const std::vector<int64_t>& ranks);

// x [B, N, Dm], weights[l] [p_l, m_l, H r_l] -> y [B, N, H, E].
template <typename T>
void bilinear_mlr_project_forward(const Context& context, View3<const T> x,
                                  const std::vector<View3<const T>>& weights,
                                  const BilinearMlrOptions& options, View4<T> y);
// dy [B, N, H, E] -> dx [B, N, Dm], dweights[l] (shapes of weights[l]); all overwritten.
template <typename T>
void bilinear_mlr_project_backward(const Context& context, View3<const T> x,
                                   const std::vector<View3<const T>>& weights,
                                   View4<const T> dy, const BilinearMlrOptions& options,
                                   View3<T> dx, const std::vector<View3<T>>& dweights);

// ---------------------------------------------------------------------------------------
// BTT projection (key side of the BTT score). D = a b with b the smallest divisor of D
// greater than sqrt(D); rank s. A token x [D] is read as X [a, b] (X[i, j] = x[i b + j]):
//   stage 1 (block-diagonal over i): Z[i, (h, beta, sigma)] = sum_j X[i, j] W1[i, j, (h, beta, sigma)]
//   stage 2 (block-diagonal over (h, beta)):
//     Y[h, beta, alpha] = sum_{i, sigma} W2[(h, beta), alpha, (i, sigma)] Z[i, (h, beta, sigma)]
//   y_h[alpha b + beta] = Y[h, beta, alpha], then LayerNorm over D (no affine).
// W1 [a, b, H b s], W2 [H b, a, a s]. The score is S_h[t, t'] = <x_t, y_h(x_t')> * scale
// (1/sqrt(D), or 1/D under muP): exact attention with q = x repeated over heads, k = y.
struct BttOptions {
  int64_t heads = 1;
  int64_t rank = 1;
  bool layer_norm = true;
  bool rms_cap = true;  // W1 blocks: fan_in b, fan_out H b s; W2 blocks: fan_in a s, fan_out a
};

struct BttFactors {
  int64_t a = 0, b = 0;
};
BttFactors btt_factors(int64_t dim);

// x [B, N, D], w1 [a, b, H b s], w2 [H b, a, a s] -> y [B, N, H, D].
template <typename T>
void btt_project_forward(const Context& context, View3<const T> x, View3<const T> w1,
                         View3<const T> w2, const BttOptions& options, View4<T> y);
// dy [B, N, H, D] -> dx [B, N, D], dw1, dw2; all overwritten.
template <typename T>
void btt_project_backward(const Context& context, View3<const T> x, View3<const T> w1,
                          View3<const T> w2, View4<const T> dy, const BttOptions& options,
                          View3<T> dx, View3<T> dw1, View3<T> dw2);

// ---------------------------------------------------------------------------------------
// MLBTC linear map R^n -> R^m: y = sum_l alpha_l P_L,l blockdiag_k'(L_l,k') P_R,l
// blockdiag_k(R_l,k^T) x. Per level: R [pR, n / pR, c] maps x to u [pR c]
// (u[k c + t] = sum_i R[k, i, t] x[k n/pR + i]); the gather permutation right_perm (length
// pR c) gives w[t] = u[right_perm[t]]; L [pL, m / pL, pR c / pL] maps w to z [m]
// (z[k' m/pL + o] = sum_t L[k', o, t] w[k' pR c / pL + t]); y[t] += alpha z[left_perm[t]].
// Empty permutations mean the identity. Low rank, MLR, BTT, Monarch and Kronecker products
// are configurations of it (see mlbtc_test.cpp).
struct MlbtcLevel {
  double alpha = 1.0;
  std::vector<double> right;  // R [pR, n / pR, c], row-major
  int64_t right_blocks = 1;   // pR
  int64_t right_cols = 1;     // c
  std::vector<int64_t> right_perm;
  std::vector<double> left;   // L [pL, m / pL, pR c / pL]
  int64_t left_blocks = 1;    // pL
  std::vector<int64_t> left_perm;
};

class MlbtcMap {
 public:
  // Validates every level against input dim n and output dim m.
  MlbtcMap(int64_t in_dim, int64_t out_dim, std::vector<MlbtcLevel> levels);
  int64_t in_dim() const { return in_dim_; }
  int64_t out_dim() const { return out_dim_; }
  // x [n] -> y [m], through the one dispatch on context.device.
  void apply(const Context& context, const double* x, double* y) const;
  // apply(Context{}, x, y).
  void apply(const double* x, double* y) const;
  // The dense [m, n] matrix, row-major.
  std::vector<double> dense() const;

 private:
  int64_t in_dim_, out_dim_;
  std::vector<MlbtcLevel> levels_;
};

// ---- flop and byte models (conventions: subquad/cost.h) ----------------------------
// MLR: 2 mlr_score_macs for the scores plus 2 T^2 Dv for P V, halved when causal.
Cost mlr_attention_forward_cost(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                int64_t Dv, const std::vector<int64_t>& ranks, bool causal,
                                int64_t element_bytes);

}  // namespace subquad
