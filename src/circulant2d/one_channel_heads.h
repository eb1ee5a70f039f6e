// 2D circulant attention with one-channel heads (D = Dv = 1: the released CA-DeiT
// configuration, 192 heads of one channel). Heads are transformed together, a group of W
// per job, as W / 2 contiguous complex planes of head pairs x_h + i x_{h+1} ([W / 2, N]) with
// one batched FFTW plan. Forward: 6 batched transforms per group (the real-transform count
// of 2D + 2Dv + 2 per head); backward 11. Math: README.md ("One-channel heads"); reference:
// circulant2d_ref.h.
#pragma once

#include <cstdint>

#include "circulant2d/planes.h"
#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad::circulant2d_detail {

// Heads per job for a grid of N tokens and H heads: even, a whole cache line of each token
// (16 floats) unless H is smaller, and the job's arrays near L2 (the last group is padded
// with zero heads).
// How a group's arrays are laid out: token-major [N, W] (heads in the vector lanes) or
// contiguous planes [W / 2, N]; automatic picks by the grid's size (one_channel_heads.cpp).
enum class OneChannelLayout { automatic, token_major, plane_major };

template <typename T>
int64_t one_channel_group_width(int64_t N, int64_t H,
                                OneChannelLayout layout = OneChannelLayout::automatic);

// q, k, v [B, Hg, Wg, H, 1] -> out [B, Hg, Wg, H, 1], weights [B, H, Hg, Wg] (may be empty).
// statuses [B * H] receives each head's status (index b * H + h).
template <typename T>
void one_channel_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, T scale, View5<T> out, View4<T> weights,
                         HeadStatus* statuses,
                         OneChannelLayout layout = OneChannelLayout::automatic);

// dq, dk, dv [B, Hg, Wg, H, 1] from dout [B, Hg, Wg, H, 1]; the weights are recomputed.
template <typename T>
void one_channel_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                          View5<T> dv, HeadStatus* statuses,
                          OneChannelLayout layout = OneChannelLayout::automatic);

}  // namespace subquad::circulant2d_detail
