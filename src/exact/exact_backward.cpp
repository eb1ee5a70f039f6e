// Exact attention backward (FlashAttention-2 style): one task per (batch, kv head, chunk of
// key blocks) recomputes P = exp(S - lse) tile by tile and accumulates dK, dV for its keys
// (summing the query heads of the group) and its share of dQ in a per-chunk buffer,
// reduced in a fixed order: deterministic, no atomics. Each task packs what it reads (its
// heads' Q and dO rows, each key block's K^T, V^T panels) into its thread's scratch, reused
// by the next task. O(N M (D + Dv)) time, O(N (D + Dv)) extra memory per thread, from the
// call's workspace frame. Reference: exact_ref.h (exact_attention_reference_backward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/workspace_frame.h"
#include "cpu/convert.h"
#include "cpu/thread_scratch.h"
#include "cpu/tile_gemm.h"
#include "cpu/transpose.h"
#include "exact/exact_internal.h"
#include "exact/exact_ops.h"

namespace subquad {
namespace exact_detail {
namespace {

// n elements rounded up to an odd number of cache lines: the row stride of the buffers the
// tile products stream. The products walk 128 rows of a buffer at a time; rows 2^k lines
// apart fall into 64 / 2^k of the 64 sets of Zen 3's (and most) 8-way L1, so that at a
// stride of 8 lines (128 floats: D = 128, the key tile) only 64 of the 128 rows fit and
// every pass reloaded them from L2. An odd stride spreads the rows over all sets.
template <typename T>
constexpr int64_t odd_lines(int64_t n) {
  constexpr int64_t per_line = 64 / static_cast<int64_t>(sizeof(T));
  const int64_t lines = (n + per_line - 1) / per_line;
  return (lines % 2 == 1 ? lines : lines + 1) * per_line;
}

// C [rows, cols] += A B with row r summed over depth [begin[r], end[r]) only, where begin
// and end are non-decreasing in r (the visible ranges of a causal or window mask); A, B, C
// as in tile_multiply. Per group of kTileRows rows the depth is cut where a row's range
// starts or ends; each piece is summed by the rows that cover it, a contiguous run (a
// prefix of the group begins at or before the piece, a suffix ends at or after it), through
// the tile kernels. No product reads A(r, k) or B[k] outside row r's range. The rows of a
// causal diagonal see 0 to 5 ragged keys more than their group's common range; worked
// query by query (rank-one updates of dK, dV) they took most of the causal time at N = 64.
template <typename T>
void ragged_multiply(int64_t rows, int64_t cols, const int64_t* begin, const int64_t* end,
                     const T* a, int64_t a_row, int64_t a_depth, const T* b, int64_t ldb, T* c,
                     int64_t ldc) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int64_t n = std::min<int64_t>(kTileRows, rows - r0);
    int64_t cuts[2 * kTileRows];
    for (int64_t r = 0; r < n; ++r) {
      cuts[2 * r] = begin[r0 + r];
      cuts[2 * r + 1] = end[r0 + r];
    }
    for (int64_t t = 1; t < 2 * n; ++t)  // insertion sort of at most 12 cuts
      for (int64_t u = t; u > 0 && cuts[u - 1] > cuts[u]; --u) std::swap(cuts[u - 1], cuts[u]);
    for (int64_t t = 0; t + 1 < 2 * n; ++t) {
      const int64_t x = cuts[t], y = cuts[t + 1];
      if (x >= y) continue;
      int64_t first = r0, last = r0 + n;  // the rows with begin <= x and end >= y
      while (first < last && end[first] < y) ++first;
      while (last > first && begin[last - 1] > x) --last;
      if (first < last)
        tile_multiply<T>(last - first, cols, y - x, a + first * a_row + x * a_depth, a_row,
                         a_depth, b + x * ldb, ldb, c + first * ldc, ldc, true);
    }
  }
}

// Rows of a [B, L, H, W] tensor are H W elements apart, each in its own 4 KiB page from
// H W = 1024 floats on; the hardware prefetchers stay within a page, so the packing loops
// fetch the rows kPrefetchRows ahead themselves (at B x H = 32 x 8, N = 64 the copies in and
// out waited on memory for a quarter of the time).
constexpr int64_t kPrefetchRows = 4;
template <typename X>
inline void prefetch_row(const X* row, int64_t n, bool write = false) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t offset = 0; offset < n * static_cast<int64_t>(sizeof(X)); offset += 64) {
    if (write)
      __builtin_prefetch(bytes + offset, 1);
    else
      __builtin_prefetch(bytes + offset, 0);
  }
}

// In: the storage type of the inputs and gradients (float, double or bfloat16); the task
// computes in T = Compute<In> from the packed copies (bfloat16 converted while packing) and
// rounds dK, dV once when it writes them.
template <typename In>
struct BackwardTask {
  using T = Compute<In>;
  static constexpr int64_t kQuery = Blocks<T>::kQuery, kKey = Blocks<T>::kBackwardKey;
  // Row stride of the P and dS tiles (odd_lines).
  static constexpr int64_t kTile = odd_lines<T>(kKey);
  using S = Simd<T>;
  using Vec = typename S::Vec;

  const Sizes& s;
  int64_t d_padded, dv_padded;  // columns computed: D, Dv rounded up to whole vectors
  int64_t d_ld, dv_ld;          // row strides of the packed rows (odd_lines)
  View4<const In> q, k, v, out, dout;
  View3<const T> lse, dlse;  // dlse may be empty
  View4<In> dq, dk, dv;

  // One thread's buffers, from the call's workspace frame (ThreadScratch), reused by the
  // tasks that thread runs: packed once per task (rows) or per key block (panels), they
  // stay in cache where a whole-tensor copy per call was faulted in and read from memory.
  struct Tiles {
    T* probs;        // P [kQuery, kKey], rows kTile apart
    T* grads;        // dP, then dS [kQuery, kKey], rows kTile apart
    T* dk_acc;       // [kKey, Dp], rows d_ld apart (as every [., Dp] buffer)
    T* dv_acc;       // [kKey, Dvp], rows dv_ld apart (as every [., Dvp] buffer)
    T* key_panel;    // K^T [D, kKey] of one key block, rows odd_lines(kKey) apart at most
    T* value_panel;  // V^T [Dv, kKey]
    T* key_rows;     // [kKey, Dp]
    T* query_rows;   // [group, N, Dp]  the task's query heads
    T* dout_rows;    // [group, N, Dvp]
    T* lse2;         // [group, N]  lse in log2 units
    T* row_dot;      // [group, N]  Di = rowsum(dO * O) - dlse
    T* dq_acc;       // [group, N, Dp]  dQ / scale; null when the chunks' partials are used
  };
  struct Scratch {
    ThreadScratch<T> probs, grads, dk_acc, dv_acc, key_panel, value_panel, key_rows,
        query_rows, dout_rows, lse2, row_dot, dq_acc;
    Scratch(WorkspaceFrame& frame, const Context& context, const Sizes& s, int64_t d_ld,
            int64_t dv_ld, bool own_dq)
        : probs(frame, context, kQuery * kTile),
          grads(frame, context, kQuery * kTile),
          dk_acc(frame, context, kKey * d_ld),
          dv_acc(frame, context, kKey * dv_ld),
          key_panel(frame, context, s.D * odd_lines<T>(kKey)),
          value_panel(frame, context, s.Dv * odd_lines<T>(kKey)),
          key_rows(frame, context, kKey * d_ld),
          query_rows(frame, context, s.group * s.N * d_ld),
          dout_rows(frame, context, s.group * s.N * dv_ld),
          lse2(frame, context, s.group * s.N),
          row_dot(frame, context, s.group * s.N),
          dq_acc(frame, context, own_dq ? s.group * s.N * d_ld : 0) {}
    Tiles get() const {
      return {probs.get(),     grads.get(),    dk_acc.get(),     dv_acc.get(),
              key_panel.get(), value_panel.get(), key_rows.get(), query_rows.get(),
              dout_rows.get(), lse2.get(),     row_dot.get(),    dq_acc.get()};
    }
  };

  // The task's query heads: Q, dO into zero-padded rows, lse2 and Di per row.
  void pack_queries(int64_t b, int64_t hk, const Tiles& tiles) const {
    const T log2e = static_cast<T>(kLog2e);
    for (int64_t g = 0; g < s.group; ++g) {
      const int64_t h = hk * s.group + g;
      for (int64_t i = 0; i < s.N; ++i) {
        T* q_row = tiles.query_rows + (g * s.N + i) * d_ld;
        T* g_row = tiles.dout_rows + (g * s.N + i) * dv_ld;
        widen(q.row(b, i, h), q_row, s.D);
        std::fill(q_row + s.D, q_row + d_padded, T(0));
        widen(dout.row(b, i, h), g_row, s.Dv);
        std::fill(g_row + s.Dv, g_row + dv_padded, T(0));
        const In* o = out.row(b, i, h);
        if (i + kPrefetchRows < s.N) {
          prefetch_row(q.row(b, i + kPrefetchRows, h), s.D);
          prefetch_row(dout.row(b, i + kPrefetchRows, h), s.Dv);
          prefetch_row(out.row(b, i + kPrefetchRows, h), s.Dv);
        }
        // In vectors: summed element by element, the chain of dependent adds took a tenth
        // of the time at N = 64.
        T dot = 0;
        int64_t d = 0;
        if constexpr (std::is_same_v<In, T>) {
          Vec sum = S::splat(T(0));
          for (; d + S::kLanes <= s.Dv; d += S::kLanes) sum += S::load(g_row + d) * S::load(o + d);
          dot = S::reduce_sum(sum);
        }
        for (; d < s.Dv; ++d) dot += g_row[d] * to_compute<T>(o[d]);
        // d lse_i / d S_ij = P_ij, so dlse adds P dlse to dS = P (dP - Di): it shifts Di.
        tiles.row_dot[g * s.N + i] = dlse.empty() ? dot : dot - dlse(b, h, i);
        tiles.lse2[g * s.N + i] = lse(b, h, i) * log2e;
      }
    }
  }

  // x [B, M, Hkv, W] rows j0 .. j0 + width of kv head hk, transposed into panel [W, ld]
  // (8 x 8 register tiles); columns width .. ld zeroed.
  static void pack_panel(View4<const In> x, int64_t b, int64_t hk, int64_t j0, int64_t width,
                         int64_t ld, T* panel) {
    const int64_t W = x.dim(3);
    for (int64_t r0 = 0; r0 < width; r0 += kTransposeTile) {
      const int64_t tile_rows = std::min(kTransposeTile, width - r0);
      const In* src[kTransposeTile];
      for (int64_t r = 0; r < tile_rows; ++r) src[r] = x.row(b, j0 + r0 + r, hk);
      for (int64_t r = r0 + kTransposeTile; r < std::min(width, r0 + 2 * kTransposeTile); ++r)
        prefetch_row(x.row(b, j0 + r, hk), W);
      for (int64_t d0 = 0; d0 < W; d0 += kTransposeTile) {
        const In* tile_src[kTransposeTile];
        T* dst[kTransposeTile];
        for (int64_t r = 0; r < tile_rows; ++r) tile_src[r] = src[r] + d0;
        const int64_t tile_columns = std::min(kTransposeTile, W - d0);
        for (int64_t d = 0; d < tile_columns; ++d) dst[d] = panel + (d0 + d) * ld + r0;
        transpose_tile<In, T>(tile_src, dst, tile_rows, tile_columns, T(1));
      }
    }
    for (int64_t d = 0; d < W; ++d) std::fill(panel + d * ld + width, panel + (d + 1) * ld, T(0));
  }

  // Key blocks [block_begin, block_end) of (b, hk). dq_acc [group, N, Dp] accumulates this
  // task's share of dQ / scale for the group's query heads (zeroed here); with own_dq the
  // task holds all of it (one chunk) and writes dq itself.
  void run(int64_t b, int64_t hk, int64_t block_begin, int64_t block_end, T* dq_acc,
           bool own_dq, const Tiles& tiles) const {
    pack_queries(b, hk, tiles);
    std::fill(dq_acc, dq_acc + s.group * s.N * d_ld, T(0));
    T* const probs = tiles.probs;
    T* const grads = tiles.grads;
    T* const dk_acc = tiles.dk_acc;
    T* const dv_acc = tiles.dv_acc;
    T* const k_rows = tiles.key_rows;  // [width, Dp]
    const T log2_scale = static_cast<T>(s.scale * kLog2e);
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t j0 = block * kKey, width = std::min(kKey, s.M - j0);
      const int64_t padded = round_up(width, S::kLanes), panel_ld = odd_lines<T>(padded);
      std::fill(dk_acc, dk_acc + width * d_ld, T(0));  // only the rows in use
      std::fill(dv_acc, dv_acc + width * dv_ld, T(0));
      // Queries that may see a key of this block (ranges are monotone in i).
      const int64_t offset = s.M - s.N;
      const int64_t i_begin = s.causal ? std::clamp<int64_t>(j0 - offset, 0, s.N) : 0;
      const int64_t i_end =
          s.window > 0 ? std::clamp<int64_t>(j0 + width - 1 + s.window - offset, 0, s.N) : s.N;
      // K^T [D, padded], V^T [Dv, padded] (the B operands of S and dP), K rows [width, Dp].
      T* const kt = tiles.key_panel;
      T* const vt = tiles.value_panel;
      pack_panel(k, b, hk, j0, width, panel_ld, kt);
      pack_panel(v, b, hk, j0, width, panel_ld, vt);
      for (int64_t j = 0; j < width; ++j) {
        widen(k.row(b, j0 + j, hk), k_rows + j * d_ld, s.D);
        std::fill(k_rows + j * d_ld + s.D, k_rows + j * d_ld + d_padded, T(0));
      }
      for (int64_t g = 0; g < s.group; ++g) {
        const T* lse2 = tiles.lse2 + g * s.N;
        const T* row_dot = tiles.row_dot + g * s.N;
        for (int64_t i0 = i_begin; i0 < i_end; i0 += kQuery) {
          const int64_t rows = std::min(kQuery, i_end - i0);
          const T* q = tiles.query_rows + (g * s.N + i0) * d_ld;    // [rows, Dp]
          const T* dout = tiles.dout_rows + (g * s.N + i0) * dv_ld;  // [rows, Dvp]
          // S = Q K^T, dP = dO V^T (in the forward: S = Q K^T, O = P V).
          tile_multiply<T>(rows, padded, s.D, q, d_ld, 1, kt, panel_ld, probs, kTile, false);
          tile_multiply<T>(rows, padded, s.Dv, dout, dv_ld, 1, vt, panel_ld, grads, kTile,
                           false);
          for (int64_t r = 0; r < rows; ++r)
            probabilities_row(probs + r * kTile, grads + r * kTile, i0 + r, j0, width, padded,
                              log2_scale, lse2[i0 + r], row_dot[i0 + r]);
          // dV += P^T dO, dK += dS^T Q (scaled at the end), dQ += dS K.
          T* dq_tile = dq_acc + (g * s.N + i0) * d_ld;
          if (s.keys(i0 + rows - 1).first <= j0 && s.keys(i0).last >= j0 + width) {
            tile_multiply<T>(width, dv_padded, rows, probs, 1, kTile, dout, dv_ld,
                             dv_acc, dv_ld, true);
            tile_multiply<T>(width, d_padded, rows, grads, 1, kTile, q, d_ld,
                             dk_acc, d_ld, true);
            tile_multiply<T>(rows, d_padded, width, grads, kTile, 1, k_rows, d_ld,
                             dq_tile, d_ld, true);
            continue;
          }
          add_masked_tile(i0, rows, j0, width, probs, grads, q, dout, k_rows, dv_acc, dk_acc,
                          dq_tile);
        }
      }
      const T scale = static_cast<T>(s.scale);
      for (int64_t j = 0; j < width; ++j) {
        if (j + kPrefetchRows < width) {
          prefetch_row(dk.row(b, j0 + j + kPrefetchRows, hk), s.D, true);
          prefetch_row(dv.row(b, j0 + j + kPrefetchRows, hk), s.Dv, true);
        }
        narrow(dk_acc + j * d_ld, dk.row(b, j0 + j, hk), s.D, scale);
        narrow(dv_acc + j * dv_ld, dv.row(b, j0 + j, hk), s.Dv);
      }
    }
    if (own_dq) {
      const T scale = static_cast<T>(s.scale);
      for (int64_t g = 0; g < s.group; ++g)
        for (int64_t i = 0; i < s.N; ++i) {
          if (i + kPrefetchRows < s.N)
            prefetch_row(dq.row(b, i + kPrefetchRows, hk * s.group + g), s.D, true);
          narrow(dq_acc + (g * s.N + i) * d_ld, dq.row(b, i, hk * s.group + g), s.D, scale);
        }
    }
  }

  // A tile some query sees only in part (the causal diagonal, a window's edge). Masked P and
  // dS are 0, but 0 times a NaN or inf that a query does not see (a future key or value,
  // padding; or its own row against keys it does not see) would still be NaN
  // (docs/conventions.md, "Masked entries"), so no product reads a masked pair: each row of
  // a product runs over its visible range only (ragged_multiply). probs, grads [rows, kKey];
  // q [rows, Dp]; dout [rows, Dvp]; k_rows [width, Dp]; dv_acc [kKey, Dvp];
  // dk_acc [kKey, Dp]; dq_tile [rows, Dp].
  void add_masked_tile(int64_t i0, int64_t rows, int64_t j0, int64_t width, const T* probs,
                       const T* grads, const T* q, const T* dout, const T* k_rows, T* dv_acc,
                       T* dk_acc, T* dq_tile) const {
    // Keys [key_begin[r], key_end[r]) of the block seen by query r of the tile, and queries
    // [query_begin[j], query_end[j]) of the tile that see key j: all non-decreasing (the
    // masks' ranges are monotone), as ragged_multiply needs.
    int64_t key_begin[kQuery] = {}, key_end[kQuery] = {};
    int64_t query_begin[kKey] = {}, query_end[kKey] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange keys = s.keys(i0 + r);
      key_begin[r] = std::clamp<int64_t>(keys.first - j0, 0, width);
      key_end[r] = std::clamp<int64_t>(keys.last - j0, key_begin[r], width);
    }
    // Query r sees key j when key_begin[r] <= j < key_end[r]: a suffix of the queries ends
    // after j, a prefix begins at or before it.
    int64_t first = 0, past = 0;
    for (int64_t j = 0; j < width; ++j) {
      while (first < rows && key_end[first] <= j) ++first;
      while (past < rows && key_begin[past] <= j) ++past;
      query_begin[j] = first;
      query_end[j] = std::max(first, past);
    }
    // dV += P^T dO, dK += dS^T Q, dQ += dS K (as the whole-tile products).
    ragged_multiply<T>(width, dv_padded, query_begin, query_end, probs, 1, kTile, dout, dv_ld,
                       dv_acc, dv_ld);
    ragged_multiply<T>(width, d_padded, query_begin, query_end, grads, 1, kTile, q, d_ld, dk_acc,
                       d_ld);
    ragged_multiply<T>(rows, d_padded, key_begin, key_end, grads, kTile, 1, k_rows, d_ld, dq_tile,
                       d_ld);
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
               int64_t d_ld, View4<In> dq) {
  const T scale = static_cast<T>(s.scale);
  const int64_t chunk_size = s.B * s.H * s.N * d_ld;
  parallel_for(context, s.B * s.H, [&](int64_t bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t i = 0; i < s.N; ++i) {
      In* row = dq.row(b, i, h);
      const T* partial = partials + (bh * s.N + i) * d_ld;
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

  constexpr int64_t key_block = Blocks<T>::kBackwardKey;
  const int64_t d_padded = round_up(s.D, Simd<T>::kLanes);
  const int64_t dv_padded = round_up(s.Dv, Simd<T>::kLanes);
  const int64_t d_ld = odd_lines<T>(d_padded), dv_ld = odd_lines<T>(dv_padded);
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
  // One chunk per (b, kv head): the task accumulates dQ in its thread's scratch and writes
  // dq itself. More chunks: one dQ-sized accumulator per chunk, summed in chunk order.
  const bool own_dq = chunks == 1;
  T* dq_partials = own_dq ? nullptr : frame.take<T>(chunks * s.B * s.H * s.N * d_ld);
  const typename BackwardTask<In>::Scratch scratch(frame, context, s, d_ld, dv_ld, own_dq);
  const BackwardTask<In> task{s,   d_padded, dv_padded, d_ld, dv_ld, q,  k,  v,
                              out, dout,     lse,       dlse, dq,    dk, dv};
  parallel_for(context, pairs * chunks, [&](int64_t index) {
    const int64_t chunk = index % chunks, pair = index / chunks;
    const int64_t b = pair / s.Hkv, hk = pair % s.Hkv;
    const typename BackwardTask<In>::Tiles tiles = scratch.get();
    T* dq_acc = own_dq ? tiles.dq_acc
                       : dq_partials + (chunk * s.B * s.H + b * s.H + hk * s.group) * s.N * d_ld;
    task.run(b, hk, chunk * blocks_per_chunk,
             std::min(key_blocks, (chunk + 1) * blocks_per_chunk), dq_acc, own_dq, tiles);
  });
  if (!own_dq) reduce_dq(context, s, dq_partials, chunks, d_ld, dq);
}

template void run<float>(Backend, const Context&,
                         const exact_detail::ExactBackwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const exact_detail::ExactBackwardParams<double>&);
template void run<bfloat16>(Backend, const Context&,
                            const exact_detail::ExactBackwardParams<bfloat16>&);

}  // namespace cpu
}  // namespace subquad
