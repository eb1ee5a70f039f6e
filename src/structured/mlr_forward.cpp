// Fast MLR attention forward: the exact kernel's online softmax on transposed score tiles
// S^T [keys, queries] (src/exact/README.md), each tile formed from only the levels whose
// blocks hold its whole query and key block, so score work is T^2 sum_l r_l / 2^(l-1) (half
// when causal) besides the T^2 Dv of P V; no T x T matrix is stored. Reference: mlr_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/buffer.h"
#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/online_softmax.h"
#include "cpu/pack.h"
#include "cpu/thread_scratch.h"
#include "cpu/tile_gemm.h"
#include "structured/mlr_levels.h"
#include "structured/mlr_tiles.h"
#include "structured/structured_ops.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using cpu::online_softmax_step;
using cpu::Simd;
using cpu::tile_multiply;
using mlr::Levels;
using mlr::TilePair;

// Queries per task and keys per score tile: powers of two, so that when T is a power-of-two
// multiple of them the level blocks (T / 2^(l-1) tokens) hold whole tiles and only the
// diagonal tiles meet a level in part. 128 x 64 measured best among 64..192 x 48..96.
constexpr int64_t kQuery = 128;
constexpr int64_t kKey = 64;

template <typename T>
struct ForwardTask {
  const Levels& levels;
  const MlrOptions& options;
  int64_t N, Hkv, D, Dv, group, dv_padded;
  View4<const T> q, k;
  const T* values;  // [B, Hkv, N, Dvp]  V rows padded to whole vectors
  View4<T> out;
  View3<T> lse;  // empty when not requested

  using S = Simd<T>;
  using Vec = typename S::Vec;
  static constexpr int64_t kGroups = kQuery / S::kLanes;  // query vectors per block
  static_assert(kQuery % S::kLanes == 0, "the query block is a whole number of vectors");

  // Q^T copies per divisor m (1 .. L, only m = 1 without block_divide): rows c of copy m
  // hold log2(e) / (r_l m) q[:, c] for the covering prefix c < offsets[m] (copy 1: all D
  // rows, which the partial levels also read). Folding 1/r_l, 1/m and log2(e) into the
  // queries makes a tile's scores one product, in log2 units rounded once, so that the
  // exponents s - max are exactly 0 at the maximum (see the exact kernel's README).
  int64_t copies() const { return options.block_divide ? levels.count : 1; }
  int64_t copy_offset(int64_t m) const {  // first element of copy m; m = copies() + 1: size
    int64_t offset = 0;
    for (int64_t c = 1; c < m; ++c) offset += kQuery * (c == 1 ? D : levels.offsets[c]);
    return offset;
  }

  // One thread's tiles, from the call's workspace frame (cpu::ThreadScratch), reused by the
  // tasks that thread runs.
  struct Tiles {
    T* queries;  // Q^T copies [rows of copy m, kQuery]
    T* scores;   // S^T, then P^T [kKey, kQuery]
    T* counts;   // block_divide: level counts [kKey, kQuery]
    T* acc;      // unnormalised O [kQuery, Dvp]
  };
  struct Scratch {
    cpu::ThreadScratch<T> queries, scores, counts, acc;
    Scratch(WorkspaceFrame& frame, const Context& context, const ForwardTask& task)
        : queries(frame, context, task.copy_offset(task.copies() + 1)),
          scores(frame, context, kKey * kQuery),
          counts(frame, context, task.options.block_divide ? kKey * kQuery : 0),
          acc(frame, context, kQuery * task.dv_padded) {}
    Tiles get() const { return {queries.get(), scores.get(), counts.get(), acc.get()}; }
  };

  void run(int64_t b, int64_t h, int64_t i0, const Tiles& tiles) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const int64_t rows = std::min(kQuery, N - i0), hk = h / group;
    const int64_t columns = cpu::round_up(rows, S::kLanes), groups = columns / S::kLanes;
    T* const queries = tiles.queries;
    T* const scores = tiles.scores;
    T* const counts = tiles.counts;
    T* const acc = tiles.acc;
    pack_queries(b, h, i0, rows, columns, queries);
    std::fill(acc, acc + rows * dv_padded, T(0));  // the tile products write only these rows
    Vec running_max[kGroups], running_sum[kGroups];          // log2 units; per query
    for (int64_t g = 0; g < kGroups; ++g) {
      running_max[g] = S::splat(minus_inf);
      running_sum[g] = S::splat(T(0));
    }

    const int64_t last = options.causal ? i0 + rows : N;  // keys [0, last) are visible
    for (int64_t j0 = 0; j0 < last; j0 += kKey) {
      const int64_t keys = std::min(kKey, last - j0);
      const TilePair tile{i0, i0 + rows, j0, j0 + keys};
      const int64_t covering = mlr::covering_levels(levels, tile);
      const bool partial = has_partial_level(covering, tile);
      // With levels met in part, entries differ in their level count: copy 1, divided after.
      const int64_t copy = options.block_divide && !partial ? covering : 1;
      // S^T = K Q^T over the covering levels' columns; K rows read in place.
      tile_multiply<T>(keys, columns, levels.offsets[covering], k.row(b, j0, hk), k.strides[1],
                       1, queries + copy_offset(copy), kQuery, scores, kQuery, false);
      if (partial) add_partial_levels(b, hk, covering, tile, queries, scores, counts);
      const bool masked = options.causal && j0 + keys - 1 > i0;
      if (masked) mask(scores, keys, i0, j0);

      online_softmax_step<T, kGroups>(scores, kQuery, keys, groups, rows, running_max,
                                      running_sum, acc, dv_padded);
      // O += P V, with P read transposed from the tile.
      const T* value_tile = values + ((b * Hkv + hk) * N + j0) * dv_padded;
      if (masked) {
        add_visible_products(scores, keys, rows, i0, j0, value_tile, acc);
      } else {
        tile_multiply<T>(rows, dv_padded, keys, scores, 1, kQuery, value_tile, dv_padded,
                         acc, dv_padded, true);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T max = running_max[r / S::kLanes][r % S::kLanes];
      const T sum = running_sum[r / S::kLanes][r % S::kLanes];
      T* o = out.row(b, i0 + r, h);  // [Dv]
      if (sum == T(0)) {             // the row sees no key
        std::fill(o, o + Dv, T(0));
        if (!lse.empty()) lse(b, h, i0 + r) = minus_inf;
        continue;
      }
      const T inverse = T(1) / sum;
      const T* a = acc + r * dv_padded;
      for (int64_t d = 0; d < Dv; ++d) o[d] = a[d] * inverse;
      if (!lse.empty())
        lse(b, h, i0 + r) = static_cast<T>(static_cast<double>(max) * cpu::kLn2 +
                                           std::log(static_cast<double>(sum)));
    }
  }

  // O[r] += sum_j P^T[j, r] V[j] over the keys j <= i0 + r of a diagonal tile only: the
  // masked weights are exactly 0, but 0 times a NaN or inf future value is NaN, and masked
  // entries must never influence an output (as in the exact kernel).
  void add_visible_products(const T* p, int64_t keys, int64_t rows, int64_t i0, int64_t j0,
                            const T* value_tile, T* acc) const {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t end = std::clamp<int64_t>(i0 + r + 1 - j0, 0, keys);
      T* a = acc + r * dv_padded;  // [Dvp]
      for (int64_t j = 0; j < end; ++j) {
        const T weight = p[j * kQuery + r];
        const T* value = value_tile + j * dv_padded;  // [Dvp]
#pragma omp simd
        for (int64_t d = 0; d < dv_padded; ++d) a[d] += weight * value[d];
      }
    }
  }

  // queries [copies] of Q^T rows [offsets[m], kQuery], zero from `rows` to `columns` (what
  // the tile products read; see copies()). Written row by row of Q^T: stores scattered
  // kQuery apart would stall the loads of q.
  void pack_queries(int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t columns,
                    T* queries) const {
    const T* q_rows[kQuery];
    for (int64_t r = 0; r < rows; ++r) q_rows[r] = q.row(b, i0 + r, h);
    for (int64_t m = 1; m <= copies(); ++m) {
      T* copy = queries + copy_offset(m);
      for (int64_t l = 0; l < (m == 1 ? levels.count : m); ++l) {
        const T scale = static_cast<T>(cpu::kLog2e / static_cast<double>(levels.ranks[l] * m));
        for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d) {
          for (int64_t r = 0; r < rows; ++r) copy[d * kQuery + r] = scale * q_rows[r][d];
          std::fill(copy + d * kQuery + rows, copy + d * kQuery + columns, T(0));
        }
      }
    }
  }

  // Whether a level deeper than the covering ones shares a block with the pair.
  bool has_partial_level(int64_t covering, const TilePair& tile) const {
    bool found = false;
    mlr::for_each_partial_block(levels, covering, tile,
                                [&](int64_t, int64_t, int64_t, int64_t, int64_t) { found = true; });
    return found;
  }

  // Adds to scores^T [keys, kQuery] the levels met in part (rectangles of the pair), from
  // copy 1 of Q^T; under block_divide divides every entry by its level count (counts
  // [keys, kQuery] is workspace).
  void add_partial_levels(int64_t b, int64_t hk, int64_t covering, const TilePair& tile,
                          const T* queries, T* scores, T* counts) const {
    const int64_t keys = tile.cols();
    if (options.block_divide) std::fill(counts, counts + keys * kQuery, T(covering));
    mlr::for_each_partial_block(
        levels, covering, tile, [&](int64_t l, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
          const int64_t begin = r0 - tile.i0, end = r1 - tile.i0;
          for (int64_t j = c0; j < c1; ++j) {
            const T* key = k.row(b, j, hk);
            T* row = scores + (j - tile.j0) * kQuery;
            for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d) {
              const T kd = key[d];
              const T* qd = queries + d * kQuery;
#pragma omp simd
              for (int64_t r = begin; r < end; ++r) row[r] += kd * qd[r];
            }
            if (options.block_divide) {
              T* count = counts + (j - tile.j0) * kQuery;
              for (int64_t r = begin; r < end; ++r) count[r] += T(1);
            }
          }
        });
    if (options.block_divide)
      for (int64_t e = 0; e < keys * kQuery; ++e) scores[e] /= counts[e];
  }

  // Sets the scores of key j0 + j invisible to query i0 + r (j0 + j > i0 + r) to -inf.
  void mask(T* scores, int64_t keys, int64_t i0, int64_t j0) const {
    for (int64_t j = 0; j < keys; ++j) {
      T* row = scores + j * kQuery;  // [kQuery]
      std::fill(row, row + std::clamp<int64_t>(j0 + j - i0, 0, kQuery),
                -std::numeric_limits<T>::infinity());
    }
  }
};

}  // namespace

template <typename T>
void mlr_attention_forward(const Context& context, View4<const T> q, View4<const T> k,
                           View4<const T> v, const MlrOptions& options, View4<T> out,
                           View3<T> lse) {
  mlr::check_attention_arguments(q, k, v, options);
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), Dv = v.dim(3);
  mlr::check_output(out, {B, N, H, Dv}, "out");
  if (!lse.empty()) mlr::check_output(lse, {B, H, N}, "lse");
  if (checked_product({B, N, H}, "q") == 0) return;
  dispatch(context, mlr::MlrForwardParams<T>{q, k, v, options, out, lse});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const mlr::MlrForwardParams<T>& params) {
  const View4<const T> q = params.q, k = params.k, v = params.v;
  const MlrOptions& options = params.options;
  const View4<T> out = params.out;
  const View3<T> lse = params.lse;
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3);
  const Levels levels = mlr::make_levels(options.ranks, D, N);
  const int64_t Hkv = k.dim(2), dv_padded = cpu::round_up(Dv, Simd<T>::kLanes);
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const T* values = cpu::pack_rows(context, frame, v, N, dv_padded);
  const ForwardTask<T> task{levels,    options, N, Hkv,    D,   Dv, H / Hkv,
                            dv_padded, q,       k, values, out, lse};
  const typename ForwardTask<T>::Scratch scratch(frame, context, task);
  const int64_t query_blocks = cpu::ceil_div(N, kQuery);
  parallel_for(context, B * H * query_blocks, [&](int64_t index) {
    const int64_t block = index % query_blocks, bh = index / query_blocks;
    task.run(bh / H, bh % H, block * kQuery, scratch.get());
  });
}

template void run<float>(Backend, const Context&, const mlr::MlrForwardParams<float>&);
template void run<double>(Backend, const Context&, const mlr::MlrForwardParams<double>&);

}  // namespace cpu

#define SUBQUAD_INSTANTIATE(T)                                                                   \
  template void mlr_attention_forward<T>(const Context&, View4<const T>, View4<const T>,         \
                                         View4<const T>, const MlrOptions&, View4<T>, View3<T>);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
