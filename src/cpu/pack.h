// Packed copies of token-major inputs that the CPU tile kernels read: zero-padded
// contiguous rows, and per-block transposed panels (the B operand of S = Q K^T), in blocks
// of the call's WorkspaceFrame (no allocation with Context::workspace). O(L W) time and
// extra memory per head, never N x M. Shared by the exact and MLR kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/convert.h"
#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad::cpu {

inline constexpr double kLog2e = 1.4426950408889634074;
inline constexpr double kLn2 = 0.6931471805599453094;

inline int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}
inline int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// Copies x [B, L, Heads, W] into zero-padded contiguous rows [B, Heads, Lp, Wp] taken from
// the call's frame, so that the tile kernels read whole vectors (Lp >= L, Wp >= W).
// Converts In (bfloat16) to T. Every element is written (the block is uninitialised).
template <typename In, typename T = Compute<In>>
T* pack_rows(const Context& context, WorkspaceFrame& frame, View4<const In> x,
             int64_t padded_length, int64_t padded_width) {
  const int64_t B = x.dim(0), L = x.dim(1), heads = x.dim(2), W = x.dim(3);
  T* packed = frame.take<T>(B * heads * padded_length * padded_width);
  parallel_for(context, B * heads, [&](int64_t bh) {
    const int64_t b = bh / heads, h = bh % heads;
    T* rows = packed + bh * padded_length * padded_width;
    for (int64_t j = 0; j < L; ++j) {
      widen(x.row(b, j, h), rows + j * padded_width, W);
      std::fill(rows + j * padded_width + W, rows + (j + 1) * padded_width, T(0));
    }
    std::fill(rows + L * padded_width, rows + padded_length * padded_width, T(0));
  });
  return packed;
}

// Copies x [B, L, Heads, W] transposed per block of `block` rows into panels
// [B, Heads, ceil(L / block), W, block] (zero-padded) taken from the call's frame, the B
// operand of S = Q K^T. Converts In (bfloat16) to T. Every element is written.
template <typename In, typename T = Compute<In>>
T* pack_panels(const Context& context, WorkspaceFrame& frame, View4<const In> x, int64_t block) {
  const int64_t B = x.dim(0), L = x.dim(1), heads = x.dim(2), W = x.dim(3);
  const int64_t blocks = ceil_div(L, block);
  T* packed = frame.take<T>(B * heads * blocks * W * block);
  parallel_for(context, B * heads * blocks, [&](int64_t task) {
    const int64_t bh = task / blocks, j0 = task % blocks * block;
    const int64_t b = bh / heads, h = bh % heads;
    const int64_t width = std::min(j0 + block, L) - j0;  // rows of x in this panel
    T* panel = packed + task * W * block;
    for (int64_t j = j0; j < j0 + width; ++j) {
      const In* row = x.row(b, j, h);
      for (int64_t d = 0; d < W; ++d) panel[d * block + (j - j0)] = to_compute<T>(row[d]);
    }
    if (width < block)
      for (int64_t d = 0; d < W; ++d)
        std::fill(panel + d * block + width, panel + (d + 1) * block, T(0));
  });
  return packed;
}

}  // namespace subquad::cpu
