// Packed copies of token-major inputs that the CPU tile kernels read: zero-padded
// contiguous rows, and per-block transposed panels (the B operand of S = Q K^T). O(L W)
// time and extra memory per head, never N x M. Shared by exact, MLR and WildCat kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/convert.h"
#include "subquad/buffer.h"
#include "subquad/context.h"
#include "subquad/parallel.h"
#include "subquad/view.h"

namespace subquad::cpu {

inline constexpr double kLog2e = 1.4426950408889634074;
inline constexpr double kLn2 = 0.6931471805599453094;

inline int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}
inline int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// Copies x [B, L, Heads, W] into zero-padded contiguous rows [B, Heads, Lp, Wp], so that
// the tile kernels read whole vectors (Lp >= L, Wp >= W). Converts In (bfloat16) to T.
template <typename In, typename T = Compute<In>>
Buffer<T> pack_rows(const Context& context, View4<const In> x, int64_t padded_length,
                    int64_t padded_width) {
  const int64_t B = x.dim(0), L = x.dim(1), heads = x.dim(2), W = x.dim(3);
  Buffer<T> packed(B * heads * padded_length * padded_width);
  parallel_for(context, B * heads, [&](int64_t bh) {
    const int64_t b = bh / heads, h = bh % heads;
    T* rows = packed.data() + bh * padded_length * padded_width;
    for (int64_t j = 0; j < L; ++j)
      widen(x.row(b, j, h), rows + j * padded_width, W);
  });
  return packed;
}

// Copies x [B, L, Heads, W] transposed per block of `block` rows into panels
// [B, Heads, ceil(L / block), W, block] (zero-padded), the B operand of S = Q K^T. Converts
// In (bfloat16) to T.
template <typename In, typename T = Compute<In>>
Buffer<T> pack_panels(const Context& context, View4<const In> x, int64_t block) {
  const int64_t B = x.dim(0), L = x.dim(1), heads = x.dim(2), W = x.dim(3);
  const int64_t blocks = ceil_div(L, block);
  Buffer<T> packed(B * heads * blocks * W * block);
  parallel_for(context, B * heads * blocks, [&](int64_t task) {
    const int64_t bh = task / blocks, j0 = task % blocks * block;
    const int64_t b = bh / heads, h = bh % heads;
    T* panel = packed.data() + task * W * block;
    for (int64_t j = j0; j < std::min(j0 + block, L); ++j) {
      const In* row = x.row(b, j, h);
      for (int64_t d = 0; d < W; ++d) panel[d * block + (j - j0)] = to_compute<T>(row[d]);
    }
  });
  return packed;
}

}  // namespace subquad::cpu
