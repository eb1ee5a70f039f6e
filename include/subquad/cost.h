// Flop and byte models of the operators: what `subquad bench` and the Google benchmarks
// divide by the measured time (GFLOP/s, GB/s). One model per operator, defined in its
// family's folder (src/<family>/<family>_cost.cpp), so that every front end counts alike.
//
// Conventions, the same for every family:
//   - A multiply-add is 2 flops; exp, log and divisions are not counted.
//   - FFTs: a complex transform of n points counts 5 n log2 n flops, a real transform half
//     of that, 2.5 n log2 n (the usual FFTW benchmark convention). A 2D transform of
//     n = Hg * Wg points counts as one transform of n points. A complex product is 6 flops.
//   - bytes: the compulsory memory traffic, every input read once and every output written
//     once (a lower bound: the kernels' packing copies and re-reads are not counted).
// Sizes follow the operators' contracts (B, N, M, H, Hkv, D, Dv as in docs/conventions.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace subquad {

struct Cost {
  double flops = 0;
  double bytes = 0;
};

inline double complex_fft_flops(double n) { return 5.0 * n * std::log2(std::max(n, 2.0)); }
inline double real_fft_flops(double n) { return 0.5 * complex_fft_flops(n); }

// ---- exact attention (subquad/exact.h) ----------------------------------------------------
// 2 (D + Dv) flops per visible (query, key) pair; the pairs follow the causal and window
// masks exactly. The backward counts 2 (2 D + 3 Dv) flops per pair: S and dP recomputed,
// then dV, dK, dQ (FlashAttention-2's count), bytes add out, lse, dout in and the gradients out.
Cost exact_attention_forward_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv,
                                  int64_t D, int64_t Dv, bool causal, int64_t window,
                                  int64_t element_bytes);
Cost exact_attention_backward_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv,
                                   int64_t D, int64_t Dv, bool causal, int64_t window,
                                   int64_t element_bytes);
// Visible (query, key) pairs of one head under the masks of exact.h.
double exact_visible_pairs(int64_t N, int64_t M, bool causal, int64_t window);

// ---- CAT (subquad/cat.h) ------------------------------------------------------------------
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
// CatFftLowerBound: the forward and inverse real transforms of v's Dv columns alone.
Cost cat_fft_lower_bound_cost(int64_t B, int64_t N, int64_t H, int64_t Dv,
                              int64_t element_bytes);

// ---- 2D Circulant Attention (subquad/circulant2d.h) ---------------------------------------
// Per head on an N = Hg * Wg grid: 2 D + 2 Dv + 2 real 2D transforms (q and k forward, the
// logits' inverse, the weights forward, v forward and the output inverse) and 2 N (D + Dv)
// for the spectral products.
Cost circulant2d_forward_cost(int64_t B, int64_t tokens, int64_t H, int64_t D, int64_t Dv,
                              int64_t element_bytes);
// The backward: 4 D + 3 Dv + 4 real 2D transforms and 2 N (3 D + 2 Dv) for the products
// per head (the spec's N log2 N (7 D + 4) + 10 N D when Dv = D).
Cost circulant2d_backward_cost(int64_t B, int64_t tokens, int64_t H, int64_t D, int64_t Dv,
                               int64_t element_bytes);
// The forward and inverse real 2D transforms of v's Dv planes alone.
Cost circulant2d_fft_bound_cost(int64_t B, int64_t tokens, int64_t H, int64_t Dv,
                                int64_t element_bytes);

// ---- structured attention (subquad/structured.h) ------------------------------------------
// MLR: 2 mlr_score_macs for the scores plus 2 T^2 Dv for P V, halved when causal.
Cost mlr_attention_forward_cost(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                int64_t Dv, const std::vector<int64_t>& ranks, bool causal,
                                int64_t element_bytes);

// ---- WildCat (subquad/wildcat.h) ----------------------------------------------------------
// Per (batch, kv head), r' = min(r, M), C bins of M / C keys and r' / C points: RPC
// residual updates M (r' / C)^2 and kernel rows 2 M (r' / C) D per bin, Nystrom values
// 2 M r' (Dv + 1); per (batch, query head) attention 2 N r' (D + Dv + 1).
Cost wildcat_attention_cost(int64_t B, int64_t N, int64_t M, int64_t H, int64_t Hkv, int64_t D,
                            int64_t Dv, int64_t rank, int64_t bins);

}  // namespace subquad
