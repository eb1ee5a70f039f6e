// Exact attention backward (FlashAttention-2 style): one task per (batch, kv head, chunk of
// key blocks) recomputes P = exp(S - lse) tile by tile and accumulates dK, dV for its keys
// (summing the query heads of the group) and its share of dQ in a per-chunk buffer,
// reduced in a fixed order: deterministic, no atomics. O(N M (D + Dv)) time, O(N + M)
// extra memory per head, from the call's workspace frame. Reference: exact_ref.h
// (exact_attention_reference_backward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/workspace_frame.h"
#include "cpu/convert.h"
#include "cpu/thread_scratch.h"
#include "cpu/tile_gemm.h"
#include "exact/exact_internal.h"
#include "exact/exact_ops.h"

namespace subquad {
namespace exact_detail {
namespace {

// In: the storage type of the inputs and gradients (float, double or bfloat16); the task
// computes in T = Compute<In> from the packed copies (bfloat16 converted while packing) and
// rounds dK, dV once when it writes them.
template <typename In>
struct BackwardTask {
  using T = Compute<In>;
  static constexpr int64_t kQuery = Blocks<T>::kQuery, kKey = Blocks<T>::kBackwardKey;
  // Queries per strip of a partially masked tile (add_masked_tile): each query's ragged keys,
  // done one query at a time, are fewer than kStrip.
  static constexpr int64_t kStrip = 16;
  using S = Simd<T>;
  using Vec = typename S::Vec;

  const Sizes& s;
  int64_t d_padded, dv_padded, key_blocks;
  const T* key_panels;    // [B, Hkv, key_blocks, D, kKey]   K^T per key block
  const T* value_panels;  // [B, Hkv, key_blocks, Dv, kKey]  V^T per key block
  const T* key_rows;      // [B, Hkv, M, Dp]
  const T* query_rows;    // [B, H, N, Dp]
  const T* dout_rows;     // [B, H, N, Dvp]
  const T* lse2;          // [B, H, N]  lse in log2 units
  const T* row_dot;       // [B, H, N]  Di = rowsum(dO * O) - dlse
  View4<In> dk, dv;

  // One thread's tiles, from the call's workspace frame (ThreadScratch), reused by the
  // tasks that thread runs.
  struct Tiles {
    T* probs;   // P [rows, kKey]
    T* grads;   // dP, then dS [rows, kKey]
    T* dk_acc;  // [kKey, Dp]
    T* dv_acc;  // [kKey, Dvp]
  };
  struct Scratch {
    ThreadScratch<T> probs, grads, dk_acc, dv_acc;
    Scratch(WorkspaceFrame& frame, const Context& context, int64_t d_padded, int64_t dv_padded)
        : probs(frame, context, kQuery * kKey),
          grads(frame, context, kQuery * kKey),
          dk_acc(frame, context, kKey * d_padded),
          dv_acc(frame, context, kKey * dv_padded) {}
    Tiles get() const { return {probs.get(), grads.get(), dk_acc.get(), dv_acc.get()}; }
  };

  // Key blocks [block_begin, block_end) of (b, hk); dq_partial [B, H, N, Dp] is this
  // chunk's own dQ accumulator (unscaled), of which the task zeroes and owns the rows of
  // its query heads.
  void run(int64_t b, int64_t hk, int64_t block_begin, int64_t block_end, T* dq_partial,
           const Tiles& tiles) const {
    std::fill(dq_partial + (b * s.H + hk * s.group) * s.N * d_padded,
              dq_partial + (b * s.H + (hk + 1) * s.group) * s.N * d_padded, T(0));
    T* const probs = tiles.probs;
    T* const grads = tiles.grads;
    T* const dk_acc = tiles.dk_acc;
    T* const dv_acc = tiles.dv_acc;
    const int64_t b_hk = b * s.Hkv + hk;
    const T log2_scale = static_cast<T>(s.scale * kLog2e);
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t j0 = block * kKey, width = std::min(kKey, s.M - j0);
      const int64_t padded = round_up(width, S::kLanes);
      std::fill(dk_acc, dk_acc + kKey * d_padded, T(0));
      std::fill(dv_acc, dv_acc + kKey * dv_padded, T(0));
      // Queries that may see a key of this block (ranges are monotone in i).
      const int64_t offset = s.M - s.N;
      const int64_t i_begin = s.causal ? std::clamp<int64_t>(j0 - offset, 0, s.N) : 0;
      const int64_t i_end =
          s.window > 0 ? std::clamp<int64_t>(j0 + width - 1 + s.window - offset, 0, s.N) : s.N;
      const T* kt = key_panels + (b_hk * key_blocks + block) * s.D * kKey;
      const T* vt = value_panels + (b_hk * key_blocks + block) * s.Dv * kKey;
      const T* k_rows = key_rows + (b_hk * s.M + j0) * d_padded;
      for (int64_t h = hk * s.group; h < (hk + 1) * s.group; ++h) {
        const int64_t bh = b * s.H + h;
        for (int64_t i0 = i_begin; i0 < i_end; i0 += kQuery) {
          const int64_t rows = std::min(kQuery, i_end - i0);
          const T* q = query_rows + (bh * s.N + i0) * d_padded;     // [rows, Dp]
          const T* dout = dout_rows + (bh * s.N + i0) * dv_padded;  // [rows, Dvp]
          // S = Q K^T, dP = dO V^T (in the forward: S = Q K^T, O = P V).
          tile_multiply<T>(rows, padded, s.D, q, d_padded, 1, kt, kKey, probs, kKey, false);
          tile_multiply<T>(rows, padded, s.Dv, dout, dv_padded, 1, vt, kKey, grads, kKey,
                           false);
          for (int64_t r = 0; r < rows; ++r)
            probabilities_row(probs + r * kKey, grads + r * kKey, i0 + r, j0,
                              width, padded, log2_scale, lse2[bh * s.N + i0 + r],
                              row_dot[bh * s.N + i0 + r]);
          // dV += P^T dO, dK += dS^T Q (scaled at the end), dQ += dS K.
          T* dq_tile = dq_partial + (bh * s.N + i0) * d_padded;
          if (s.keys(i0 + rows - 1).first <= j0 && s.keys(i0).last >= j0 + width) {
            tile_multiply<T>(width, dv_padded, rows, probs, 1, kKey, dout, dv_padded,
                             dv_acc, dv_padded, true);
            tile_multiply<T>(width, d_padded, rows, grads, 1, kKey, q, d_padded,
                             dk_acc, d_padded, true);
            tile_multiply<T>(rows, d_padded, width, grads, kKey, 1, k_rows, d_padded,
                             dq_tile, d_padded, true);
            continue;
          }
          add_masked_tile(i0, rows, j0, width, probs, grads, q, dout, k_rows, dv_acc, dk_acc,
                          dq_tile);
        }
      }
      const T scale = static_cast<T>(s.scale);
      for (int64_t j = 0; j < width; ++j) {
        narrow(dk_acc + j * d_padded, dk.row(b, j0 + j, hk), s.D, scale);
        narrow(dv_acc + j * dv_padded, dv.row(b, j0 + j, hk), s.Dv);
      }
    }
  }

  // A tile some query sees only in part (the causal diagonal, a window's edge), in strips of
  // kStrip queries: the keys every query of the strip sees by tile products, the few ragged
  // keys beside them query by query. Masked P and dS are 0, but 0 times a NaN or inf that a
  // query does not see (a future key or value, padding; or its own row against keys it does
  // not see) would still be NaN (docs/conventions.md, "Masked entries"), so no product
  // reads a masked pair. probs, grads [rows, kKey]; q [rows, Dp]; dout [rows, Dvp];
  // k_rows [width, Dp]; dv_acc [kKey, Dvp]; dk_acc [kKey, Dp]; dq_tile [rows, Dp].
  void add_masked_tile(int64_t i0, int64_t rows, int64_t j0, int64_t width, const T* probs,
                       const T* grads, const T* q, const T* dout, const T* k_rows, T* dv_acc,
                       T* dk_acc, T* dq_tile) const {
    // One query r over keys [begin, end) of the block: dV, dK by rank-one updates, dQ by a
    // row product.
    auto add_row = [&](int64_t r, int64_t begin, int64_t end) {
      if (begin >= end) return;
      tile_multiply<T>(end - begin, dv_padded, 1, probs + r * kKey + begin, 1, kKey,
                       dout + r * dv_padded, dv_padded, dv_acc + begin * dv_padded, dv_padded,
                       true);
      tile_multiply<T>(end - begin, d_padded, 1, grads + r * kKey + begin, 1, kKey,
                       q + r * d_padded, d_padded, dk_acc + begin * d_padded, d_padded, true);
      tile_multiply<T>(1, d_padded, end - begin, grads + r * kKey + begin, kKey, 1,
                       k_rows + begin * d_padded, d_padded, dq_tile + r * d_padded, d_padded,
                       true);
    };
    for (int64_t r0 = 0; r0 < rows; r0 += kStrip) {
      const int64_t strip = std::min(kStrip, rows - r0);
      // Key ranges are monotone in the query: the strip's common keys run from its last
      // query's first key to its first query's last.
      const int64_t c0 = std::clamp<int64_t>(s.keys(i0 + r0 + strip - 1).first - j0, 0, width);
      const int64_t c1 = std::clamp<int64_t>(s.keys(i0 + r0).last - j0, c0, width);
      if (c0 < c1) {
        tile_multiply<T>(c1 - c0, dv_padded, strip, probs + r0 * kKey + c0, 1, kKey,
                         dout + r0 * dv_padded, dv_padded, dv_acc + c0 * dv_padded, dv_padded,
                         true);
        tile_multiply<T>(c1 - c0, d_padded, strip, grads + r0 * kKey + c0, 1, kKey,
                         q + r0 * d_padded, d_padded, dk_acc + c0 * d_padded, d_padded, true);
        tile_multiply<T>(strip, d_padded, c1 - c0, grads + r0 * kKey + c0, kKey, 1,
                         k_rows + c0 * d_padded, d_padded, dq_tile + r0 * d_padded, d_padded,
                         true);
      }
      for (int64_t r = r0; r < r0 + strip; ++r) {
        const KeyRange keys = s.keys(i0 + r);
        const int64_t k0 = std::clamp<int64_t>(keys.first - j0, 0, width);
        const int64_t k1 = std::clamp<int64_t>(keys.last - j0, k0, width);
        if (c0 < c1) {
          add_row(r, k0, std::min(k1, c0));
          add_row(r, std::max(k0, c1), k1);
        } else {
          add_row(r, k0, k1);
        }
      }
    }
  }

  // One row: P = 2^(S log2_scale - lse2) on the visible keys, 0 elsewhere (in `p`);
  // dS = P (dP - Di) (in `g`, which holds dP on entry).
  void probabilities_row(T* p, T* g, int64_t i, int64_t j0, int64_t width, int64_t padded,
                         T log2_scale, T row_lse2, T di) const {
    const KeyRange keys = s.keys(i);
    const int64_t k0 = std::clamp<int64_t>(keys.first - j0, 0, width);
    const int64_t k1 = std::clamp<int64_t>(keys.last - j0, 0, width);
    if (k0 >= k1) {
      std::fill(p, p + padded, T(0));
      std::fill(g, g + padded, T(0));
      return;
    }
    const Vec scale = S::splat(log2_scale), shift = S::splat(row_lse2), dot = S::splat(di);
    for (int64_t k = 0; k < padded; k += S::kLanes) {
      const Vec prob = S::exp2(S::load(p + k) * scale - shift);
      S::store(p + k, prob);
      S::store(g + k, prob * (S::load(g + k) - dot));
    }
    std::fill(p, p + k0, T(0));
    std::fill(g, g + k0, T(0));
    std::fill(p + k1, p + padded, T(0));
    std::fill(g + k1, g + padded, T(0));
  }
};

// dq = scale * sum of the chunks' partials, in chunk order (rounded once to In).
template <typename T, typename In>
void reduce_dq(const Context& context, const Sizes& s, const T* partials, int64_t chunks,
               int64_t d_padded, View4<In> dq) {
  const T scale = static_cast<T>(s.scale);
  const int64_t chunk_size = s.B * s.H * s.N * d_padded;
  parallel_for(context, s.B * s.H, [&](int64_t bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t i = 0; i < s.N; ++i) {
      In* row = dq.row(b, i, h);
      const T* partial = partials + (bh * s.N + i) * d_padded;
      for (int64_t d = 0; d < s.D; ++d) {
        T sum = partial[d];
        for (int64_t c = 1; c < chunks; ++c) sum += partial[c * chunk_size + d];
        row[d] = from_compute<In>(scale * sum);
      }
    }
  });
}

}  // namespace
}  // namespace exact_detail

namespace cpu {

// In: float, double or bfloat16 storage (BackwardTask).
template <typename In>
void run(Backend, const Context& context, const exact_detail::ExactBackwardParams<In>& params) {
  using namespace exact_detail;
  using T = Compute<In>;
  const Sizes& s = params.sizes;
  const View4<const In> q = params.q, k = params.k, v = params.v, out = params.out;
  const View4<const In> dout = params.dout;
  const View3<const T> lse = params.lse, dlse = params.dlse;
  const View4<In> dq = params.dq, dk = params.dk, dv = params.dv;
  const bool has_dlse = !dlse.empty();

  constexpr int64_t key_block = Blocks<T>::kBackwardKey;
  const int64_t d_padded = round_up(s.D, Simd<T>::kLanes);
  const int64_t dv_padded = round_up(s.Dv, Simd<T>::kLanes);
  const int64_t key_blocks = ceil_div(s.M, key_block);
  // Chunks of key blocks per (b, kv head): one unless there are fewer (b, kv head) pairs
  // than threads; each chunk adds one dQ-sized accumulator.
  const int threads = thread_count(context);
  const int64_t pairs = s.B * s.Hkv;
  const int64_t chunks =
      std::clamp<int64_t>(ceil_div(2 * threads, std::max<int64_t>(pairs, 1)), 1,
                          std::max<int64_t>(key_blocks, 1));
  const int64_t blocks_per_chunk = ceil_div(key_blocks, chunks);

  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const T* key_panels = pack_panels(context, frame, k, key_block);
  const T* value_panels = pack_panels(context, frame, v, key_block);
  const T* key_rows = pack_rows(context, frame, k, s.M, d_padded);
  const T* query_rows = pack_rows(context, frame, q, s.N, d_padded);
  const T* dout_rows = pack_rows(context, frame, dout, s.N, dv_padded);
  T* lse2 = frame.take<T>(s.B * s.H * s.N);
  T* row_dot = frame.take<T>(s.B * s.H * s.N);
  parallel_for(context, s.B * s.H, [&](int64_t bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t i = 0; i < s.N; ++i) {
      const In* o = out.row(b, i, h);
      const In* g = dout.row(b, i, h);
      T dot = 0;
      for (int64_t d = 0; d < s.Dv; ++d) dot += to_compute<T>(g[d]) * to_compute<T>(o[d]);
      // d lse_i / d S_ij = P_ij, so dlse adds P dlse to dS = P (dP - Di): it shifts Di.
      row_dot[bh * s.N + i] = has_dlse ? dot - dlse(b, h, i) : dot;
      lse2[bh * s.N + i] = static_cast<T>(lse(b, h, i) * kLog2e);
    }
  });
  T* dq_partials = frame.take<T>(chunks * s.B * s.H * s.N * d_padded);  // zeroed by the tasks
  const typename BackwardTask<In>::Scratch scratch(frame, context, d_padded, dv_padded);

  const BackwardTask<In> task{s,
                             d_padded,
                             dv_padded,
                             key_blocks,
                             key_panels,
                             value_panels,
                             key_rows,
                             query_rows,
                             dout_rows,
                             lse2,
                             row_dot,
                             dk,
                             dv};
  parallel_for(context, pairs * chunks, [&](int64_t index) {
    const int64_t chunk = index % chunks, pair = index / chunks;
    task.run(pair / s.Hkv, pair % s.Hkv, chunk * blocks_per_chunk,
             std::min(key_blocks, (chunk + 1) * blocks_per_chunk),
             dq_partials + chunk * s.B * s.H * s.N * d_padded, scratch.get());
  });
  reduce_dq(context, s, dq_partials, chunks, d_padded, dq);
}

template void run<float>(Backend, const Context&,
                         const exact_detail::ExactBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const exact_detail::ExactBackwardParams<double>&);
template void run<bfloat16>(Backend, const Context&,
                            const exact_detail::ExactBackwardParams<bfloat16>&);

}  // namespace cpu
}  // namespace subquad
