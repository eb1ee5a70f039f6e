// Exact softmax attention, the baseline every method is measured against.
// Contract as FlashAttention's (docs/conventions.md draws layouts and masks):
//   q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv], lse [B, H, N]
//   scale defaults to 1/sqrt(D); query head h reads kv head h / (H / Hkv).
//   causal is bottom-right aligned: query i sees key j iff j <= i + (M - N).
//   window w > 0: query i sees keys j with i + (M - N) - w < j <= i + (M - N) (causal implied).
//   A row that sees no key outputs zeros and lse = -inf (so M = 0 gives zeros, -inf);
//   B, N, H or Dv = 0 is a no-op. Errors (subquad::Error, naming the argument): D < 1,
//   Hkv < 1, H % Hkv != 0, mismatched shapes, scale not finite or <= 0 (or, times log2(e),
//   outside the normal range of T), window < 0, a non-contiguous last dimension; the
//   backward also requires lse. A window >= M equals plain causal attention.
// Non-finite inputs propagate as IEEE arithmetic does (a NaN in q row i makes row i NaN;
// a NaN or Inf in k or v may reach other rows of its tile, as 0 * Inf = NaN); they are not
// checked, since checking would cost a pass over the inputs. A row whose visible scores
// are all -inf counts as fully masked.
// Cost: 4 N M D flops per head forward (Dv = D), about 2.5x that backward; extra memory
// O(M Dv) forward and O((N + M) (D + Dv)) backward, never N x M. Threads: parallel over
// (B, H, query blocks) forward and (B, Hkv, key blocks) backward; the same inputs and
// thread count give bit-identical results (the forward is independent of thread count).
#pragma once

#include <cstdint>
#include <optional>

#include "subquad/bfloat16.h"
#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

struct ExactOptions {
  std::optional<double> scale;  // default 1/sqrt(D)
  bool causal = false;
  int64_t window = 0;  // 0: no window; > 0: sliding window of that many keys (implies causal)
};

// Forward. `lse` may be an empty view (null data) when not needed. T is float, double or
// bfloat16 (subquad/bfloat16.h): bfloat16 q, k, v, out with float32 accumulation and a
// float32 lse (Accumulate<T>); out is rounded to nearest even once.
template <typename T>
void exact_attention_forward(const Context& context, View4<const T> q, View4<const T> k,
                             View4<const T> v, const ExactOptions& options, View4<T> out,
                             View3<Accumulate<T>> lse);

// Backward from the forward's `out` and `lse`, given the gradients of both outputs:
// dout [B, N, H, Dv] and dlse [B, H, N] (an empty view: no gradient reaches lse).
// dq [B, N, H, D], dk [B, M, Hkv, D], dv [B, M, Hkv, Dv] are overwritten (GQA sums over the
// query heads of a group). bfloat16: lse and dlse float32, the gradients accumulated in
// float32 and rounded once.
template <typename T>
void exact_attention_backward(const Context& context, View4<const T> q, View4<const T> k,
                              View4<const T> v, View4<const T> out,
                              View3<const Accumulate<T>> lse, View4<const T> dout,
                              View3<const Accumulate<T>> dlse,
                              const ExactOptions& options, View4<T> dq, View4<T> dk,
                              View4<T> dv);

// The bfloat16 kernel chosen at run time for this CPU: "portable" (converts to float32
// while packing tiles; the only one built). The AVX-512 BF16 and AMX kernels would be
// chosen here where the CPU has them (exact_bf16.cpp).
const char* exact_bf16_kernel_name();
// The native bfloat16 products this CPU offers: "amx_bf16", "avx512_bf16" or "none".
const char* exact_bf16_native_support();

// Merges attention results over disjoint key sets: given per-part outputs out_p
// [B, N, H, Dv] and lse_p [B, H, N], writes out = sum_p exp(lse_p - lse) out_p with
// lse = log sum_p exp(lse_p). Parts whose lse is -inf contribute nothing.
template <typename T>
void merge_attention(const Context& context, View4<const T> out_a, View3<const T> lse_a,
                     View4<const T> out_b, View3<const T> lse_b, View4<T> out, View3<T> lse);

// Backward of merge_attention from its inputs and outputs, given dout [B, N, H, Dv] and
// dlse [B, H, N] (either may be an empty view: no gradient there). With w_p =
// exp(lse_p - lse): dout_p = w_p dout and dlse_p = w_p (<dout, out_p - out> + dlse); all
// four gradients are overwritten (a row where both parts are -inf gets zeros).
template <typename T>
void merge_attention_backward(const Context& context, View4<const T> out_a,
                              View3<const T> lse_a, View4<const T> out_b, View3<const T> lse_b,
                              View4<const T> out, View3<const T> lse, View4<const T> dout,
                              View3<const T> dlse, View4<T> dout_a, View3<T> dlse_a,
                              View4<T> dout_b, View3<T> dlse_b);

// ---- flop and byte models (conventions: subquad/cost.h) ----------------------------
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

}  // namespace subquad
