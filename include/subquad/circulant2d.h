// 2D Circulant Attention (Han et al., AAAI 2026): per (batch, head) the attention matrix over
// a token grid is block-circulant with circulant blocks (BCCB), applied with batched 2D real
// FFTs in O(N log N (D + Dv)) per head, N = Hg * Wg. Math: src/circulant2d/README.md.
//   q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv], weights [B, H, Hg, Wg]
//   a[m] = c * sum_n <q[n], k[n (+) m]>      (+): index addition modulo (Hg, Wg)
//   s = softmax(a) over all N entries (max-subtracted)
//   out[i] = sum_n s[n] v[i (+) n]           (A[i, j] = s[j (-) i]; every row sums to 1)
// Non-finite inputs propagate (docs/conventions.md): a non-finite q, k, v or dout, or logits
// that overflow (finite but huge q, k), make every output of their (batch, head) NaN.
#pragma once

#include <cstdint>
#include <optional>

#include "subquad/context.h"
#include "subquad/cost.h"
#include "subquad/view.h"

namespace subquad {

// `paper`: c = 1 / (N sqrt(D)), the average of the ordinary logits along each diagonal.
// `code`: c = 1 / sqrt(N), what the released checkpoints (D = 1, orthonormal FFTs) expect.
enum class Circulant2dScaleMode { paper, code };

struct Circulant2dOptions {
  Circulant2dScaleMode scale_mode = Circulant2dScaleMode::paper;
  std::optional<double> scale;  // an explicit c; overrides scale_mode; finite, > 0
};

// The scale c for a grid of `tokens` = Hg * Wg and head dim `head_dim`.
double circulant2d_scale(const Circulant2dOptions& options, int64_t tokens, int64_t head_dim);

// Forward. `weights` [B, H, Hg, Wg] receives s (the first row of each BCCB matrix); it may
// be an empty view.
template <typename T>
void circulant2d_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, const Circulant2dOptions& options, View5<T> out,
                         View4<T> weights);

// Backward: dq, dk [B, Hg, Wg, H, D] and dv [B, Hg, Wg, H, Dv] are overwritten from
// dout [B, Hg, Wg, H, Dv]. The weights are recomputed from q and k (the spectra of q and k
// are needed for dq and dk anyway, so this costs one inverse transform per head).
template <typename T>
void circulant2d_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout,
                          const Circulant2dOptions& options, View5<T> dq, View5<T> dk,
                          View5<T> dv);

// A grid for `tokens`: Hg is the largest divisor of `tokens` with Hg <= sqrt(tokens), and
// Wg = tokens / Hg (4096 -> 64 x 64, 9216 -> 96 x 96, a prime p -> 1 x p).
struct Grid {
  int64_t rows = 1;  // Hg
  int64_t cols = 1;  // Wg
};
Grid circulant2d_grid_for_tokens(int64_t tokens);

// Reads a token-sequence view x [B, N, H, D] as a grid view [B, Hg, Wg, H, D] (row-major
// token order n = i * Wg + j); throws when Hg * Wg != N. `name` names x in the error.
template <typename T>
View5<T> as_grid(View4<T> x, Grid grid, const char* name) {
  check(grid.rows >= 1 && grid.cols >= 1, name, ": grid sides must be positive, got ",
        grid.rows, " x ", grid.cols);
  check(grid.rows * grid.cols == x.shape[1], name, ": grid ", grid.rows, " x ", grid.cols,
        " has ", grid.rows * grid.cols, " tokens, the view has N = ", x.shape[1]);
  return View5<T>(x.data, {x.shape[0], grid.rows, grid.cols, x.shape[2], x.shape[3]},
                  {x.strides[0], grid.cols * x.strides[1], x.strides[1], x.strides[2],
                   x.strides[3]});
}

// ---- flop and byte models (conventions: subquad/cost.h) ----------------------------
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

}  // namespace subquad
