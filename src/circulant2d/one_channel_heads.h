// 2D circulant attention with one-channel heads (D = Dv = 1: the released CA-DeiT
// configuration, 192 heads of one channel). Heads are transformed together, a group of W
// per job, as the complex planes of adjacent head pairs x_h + i x_{h+1}: [N, W / 2] complex
// with the pair index contiguous, so one batched FFTW plan vectorises across heads. Forward:
// 6 batched transforms per group (the real-transform count of 2D + 2Dv + 2 per head);
// backward 11. Math: README.md ("One-channel heads"); reference: circulant2d_ref.h.
#pragma once

#include <cstdint>
#include <vector>

#include "circulant2d/planes.h"
#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad::circulant2d_detail {

// Heads per job for a grid of N tokens and H heads: the job's [N, W] arrays stay in L2
// while W is a whole number of vectors (the last group is padded with zero heads).
template <typename T>
int64_t one_channel_group_width(int64_t N, int64_t H);

// q, k, v [B, Hg, Wg, H, 1] -> out [B, Hg, Wg, H, 1], weights [B, H, Hg, Wg] (may be empty).
// statuses [B * H] receives each head's status (index b * H + h).
template <typename T>
void one_channel_forward(const Context& context, View5<const T> q, View5<const T> k,
                         View5<const T> v, T scale, View5<T> out, View4<T> weights,
                         std::vector<HeadStatus>& statuses);

// dq, dk, dv [B, Hg, Wg, H, 1] from dout [B, Hg, Wg, H, 1]; the weights are recomputed.
template <typename T>
void one_channel_backward(const Context& context, View5<const T> q, View5<const T> k,
                          View5<const T> v, View5<const T> dout, T scale, View5<T> dq, View5<T> dk,
                          View5<T> dv, std::vector<HeadStatus>& statuses);

}  // namespace subquad::circulant2d_detail
