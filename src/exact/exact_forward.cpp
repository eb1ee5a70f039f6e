// Exact attention forward, tiled online softmax (FlashAttention style): one task per
// (batch, head, block of queries) streams key blocks, never holding more than a
// keys x queries tile. O(N M (D + Dv)) time; O(B Hkv M (D + Dv)) extra memory for
// contiguous copies of K and V when several query blocks read head-interleaved rows (else
// none, or O(M Dv) for padded V rows) and O(threads kQuery (D + Dv)) for the tiles, all
// from the call's workspace frame.
// Reference: exact_ref.h (exact_attention_reference_forward).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/workspace_frame.h"
#include "cpu/convert.h"
#include "cpu/online_softmax.h"
#include "cpu/thread_scratch.h"
#include "cpu/tile_gemm.h"
#include "cpu/transpose.h"
#include "exact/exact_internal.h"
#include "exact/exact_ops.h"

namespace subquad {
namespace exact_detail {
namespace {

// In: the storage type of q, k, v, out (float, double or bfloat16); the task computes in
// T = Compute<In> (float for bfloat16: float32 accumulation throughout) and keeps lse in T.
template <typename In>
struct ForwardTask {
  using T = Compute<In>;
  // bfloat16 tiles are converted to float while they are packed: K and V a key block at a
  // time into the task's tiles (O(kKey (D + Dv)) per block, against kQuery kKey (D + Dv)
  // flops), Q while it is transposed; nothing of size M is converted or stored.
  static constexpr bool kConverts = !std::is_same_v<In, T>;

  const Sizes& s;
  View4<const In> q, k, v;
  // T storage: K rows, k itself (rows key_ld apart, heads key_head apart) or a contiguous
  // copy [B, Hkv, M, D]. Unused when kConverts.
  const T* keys;
  int64_t key_ld, key_head, key_batch;
  // T storage: V rows of whole vectors, v itself when Dv is a multiple of the lane count
  // (rows value_ld apart, heads Dv apart), else a padded copy [B, Hkv, M, Dvp]. Unused
  // when kConverts.
  const T* values;
  int64_t value_ld, value_head, value_batch;
  int64_t dv_padded;
  View4<In> out;
  View3<T> lse;  // empty when not requested

  static constexpr int64_t kQuery = Blocks<T>::kQuery, kKey = Blocks<T>::kKey;
  using S = Simd<T>;
  using Vec = typename S::Vec;
  static constexpr int64_t kGroups = kQuery / S::kLanes;  // query vectors per block
  static_assert(kQuery % S::kLanes == 0, "the query block is a whole number of vectors");

  // One thread's tiles, from the call's workspace frame (ThreadScratch), reused by the
  // tasks that thread runs.
  struct Tiles {
    T* queries;     // (scale log2(e)) Q^T [D, kQuery]
    T* scores;      // S^T, then P^T [kKey, kQuery]
    T* acc;         // unnormalised O [kQuery, Dvp]
    T* key_tile;    // kConverts: K [kKey, D]
    T* value_tile;  // kConverts: V [kKey, Dvp]
  };
  struct Scratch {
    ThreadScratch<T> queries, scores, acc, key_tile, value_tile;
    Scratch(WorkspaceFrame& frame, const Context& context, const Sizes& s, int64_t dv_padded)
        : queries(frame, context, s.D * kQuery),
          scores(frame, context, kKey * kQuery),
          acc(frame, context, kQuery * dv_padded),
          key_tile(frame, context, kConverts ? kKey * s.D : 0),
          value_tile(frame, context, kConverts ? kKey * dv_padded : 0) {}
    Tiles get() const {
      return {queries.get(), scores.get(), acc.get(), key_tile.get(), value_tile.get()};
    }
  };

  // The tile is held transposed, scores^T [keys, queries]: the queries of the block lie
  // along the vectors, so the softmax statistics of 16 queries are one vector and need no
  // horizontal reduction, and K is read in place as the broadcast operand (no transpose).
  void run(int64_t b, int64_t h, int64_t i0, const Tiles& tiles) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const int64_t rows = std::min(kQuery, s.N - i0);
    const int64_t hk = h / s.group;
    const int64_t columns = round_up(rows, S::kLanes), groups = columns / S::kLanes;
    // (scale log2(e)) Q^T [D, kQuery], zero-padded from `rows` to `columns`. Scaling the queries
    // gives scores in log2 units rounded once, so the exponents s - max are differences of
    // rounded values, exactly 0 at the maximum; scaling in the exponent instead (s c - max,
    // one multiply-add) leaves the rounding error of max there, hundreds of units for
    // scores near 1e10, which underflows the maximum's weight to 0.
    T* const queries = tiles.queries;
    const In* q_rows[kQuery];
    for (int64_t r = 0; r < rows; ++r) q_rows[r] = q.row(b, i0 + r, h);
    const T log2_scale = static_cast<T>(s.scale * kLog2e);
    // 8 x 8 tiles through registers (cpu/transpose.h): the scalar loop, column by column,
    // re-read every q row D times from beyond L1 (a fifth of the causal time at N = 256).
    for (int64_t r0 = 0; r0 < rows; r0 += kTransposeTile) {
      const int64_t tile_rows = std::min(kTransposeTile, rows - r0);
      for (int64_t d0 = 0; d0 < s.D; d0 += kTransposeTile) {
        const In* src[kTransposeTile];
        T* dst[kTransposeTile];
        for (int64_t r = 0; r < tile_rows; ++r) src[r] = q_rows[r0 + r] + d0;
        const int64_t tile_columns = std::min(kTransposeTile, s.D - d0);
        for (int64_t d = 0; d < tile_columns; ++d) dst[d] = queries + (d0 + d) * kQuery + r0;
        transpose_tile<In, T>(src, dst, tile_rows, tile_columns, log2_scale);
      }
    }
    // The tile products read `columns` queries: zero the padding (only it, not all kQuery).
    for (int64_t d = 0; d < s.D; ++d)
      std::fill(queries + d * kQuery + rows, queries + d * kQuery + columns, T(0));
    // Unnormalised O [rows, Dvp]: only the rows in use are zeroed (at small N most of the
    // kQuery rows are not).
    std::fill(tiles.acc, tiles.acc + rows * dv_padded, T(0));
    // kConverts: V rows are widened Dv wide into the value tile; its padding stays zero.
    if constexpr (kConverts)
      for (int64_t j = 0; j < kKey; ++j)
        std::fill(tiles.value_tile + j * dv_padded + s.Dv, tiles.value_tile + (j + 1) * dv_padded,
                  T(0));
    Vec running_max[kGroups], running_sum[kGroups];         // log2 units; per query
    for (int64_t g = 0; g < kGroups; ++g) {
      running_max[g] = S::splat(minus_inf);
      running_sum[g] = S::splat(T(0));
    }

    // Ranges are monotone in i, so the block's union of visible keys is [first, last), and
    // the keys every query of the block sees are [all_first, all_last): tiles there are
    // computed whole; only the tiles of the two ragged segments beside it are masked.
    const int64_t first = s.keys(i0).first, last = s.keys(i0 + rows - 1).last;
    const int64_t all_first = s.keys(i0 + rows - 1).first, all_last = s.keys(i0).last;
    const Step step{*this,       b,           hk,           i0,
                    rows,        columns,     groups,       queries,
                    tiles.scores, tiles.acc,  running_max,  running_sum,
                    tiles.key_tile, tiles.value_tile};
    if (all_first < all_last) {
      for (int64_t j0 = first; j0 < all_first; j0 += kKey)
        step.masked(j0, std::min(kKey, all_first - j0));
      for (int64_t j0 = all_first; j0 < all_last; j0 += kKey)
        step.whole(j0, std::min(kKey, all_last - j0));
      for (int64_t j0 = all_last; j0 < last; j0 += kKey) step.masked(j0, std::min(kKey, last - j0));
    } else {
      for (int64_t j0 = first; j0 < last; j0 += kKey) step.masked(j0, std::min(kKey, last - j0));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T max = running_max[r / S::kLanes][r % S::kLanes];
      const T sum = running_sum[r / S::kLanes][r % S::kLanes];
      In* o = out.row(b, i0 + r, h);  // [Dv]
      if (sum == T(0)) {              // the row sees no key
        std::fill(o, o + s.Dv, In{});
        if (!lse.empty()) lse(b, h, i0 + r) = minus_inf;
        continue;
      }
      narrow(tiles.acc + r * dv_padded, o, s.Dv, T(1) / sum);
      if (!lse.empty())
        lse(b, h, i0 + r) =
            static_cast<T>(static_cast<double>(max) * kLn2 + std::log(static_cast<double>(sum)));
    }
  }

  // One key tile of one query block: the running statistics and acc of the block.
  struct Step {
    const ForwardTask& t;
    int64_t b, hk, i0, rows, columns, groups;
    const T* queries;  // (scale log2(e)) Q^T [D, kQuery]
    T* scores;         // S^T, then P^T [kKey, kQuery]
    T* acc;            // unnormalised O [kQuery, Dvp]
    Vec* running_max;  // [kGroups]
    Vec* running_sum;  // [kGroups]
    T* key_tile;       // kConverts: K [kKey, D]
    T* value_tile;     // kConverts: V [kKey, Dvp]

    // K rows [j0, j0 + keys) in T and their stride: in place, or converted into key_tile.
    std::pair<const T*, int64_t> key_rows(int64_t j0, int64_t keys) const {
      if constexpr (kConverts) {
        for (int64_t j = 0; j < keys; ++j)
          widen(t.k.row(b, j0 + j, hk), key_tile + j * t.s.D, t.s.D);
        return {key_tile, t.s.D};
      } else {
        return {t.keys + b * t.key_batch + hk * t.key_head + j0 * t.key_ld, t.key_ld};
      }
    }
    // V rows [j0, j0 + keys) in T, Dvp wide (padding zero), and their stride.
    std::pair<const T*, int64_t> value_rows(int64_t j0, int64_t keys) const {
      if constexpr (kConverts) {
        for (int64_t j = 0; j < keys; ++j)
          widen(t.v.row(b, j0 + j, hk), value_tile + j * t.dv_padded, t.s.Dv);
        return {value_tile, t.dv_padded};
      } else {
        return {t.values + b * t.value_batch + hk * t.value_head + j0 * t.value_ld, t.value_ld};
      }
    }

    // Keys [j0, j0 + keys) seen by every query of the block.
    void whole(int64_t j0, int64_t keys) const {
      const auto [key_data, key_ld] = key_rows(j0, keys);
      // S^T = K Q^T in log2 units.
      tile_multiply<T>(keys, columns, t.s.D, key_data, key_ld, 1, queries, kQuery, scores, kQuery,
                       false);
      online_softmax_step<T, kGroups>(scores, kQuery, keys, groups, rows, running_max, running_sum,
                                      acc, t.dv_padded);
      // O += P V, with P read transposed from the tile.
      const auto [value_data, value_ld] = value_rows(j0, keys);
      tile_multiply<T>(rows, t.dv_padded, keys, scores, 1, kQuery, value_data, value_ld, acc,
                       t.dv_padded, true);
    }

    // Keys [j0, j0 + keys) crossing a mask boundary (the causal diagonal, the window's
    // edge). Work is limited to the visible part: scores strip by strip of kTileRows keys
    // over the query vectors that see a key of the strip, the softmax over the query
    // vectors that see a key of the tile, and P V strip by strip of kTileRows queries over
    // the keys all of them see, plus each query's few ragged keys. Masked entries never
    // influence an output: their scores are -inf, and their values are never read (a NaN
    // or inf in padding or a future token would give 0 * NaN = NaN).
    void masked(int64_t j0, int64_t keys) const {
      const auto [lo, hi] = t.queries_seeing(j0, j0 + keys, i0, rows);
      if (lo >= hi) return;
      const auto [key_data, key_ld] = key_rows(j0, keys);
      for (int64_t j = 0; j < keys; j += kTileRows) {
        const int64_t strip = std::min<int64_t>(kTileRows, keys - j);
        const auto [strip_lo, strip_hi] = t.queries_seeing(j0 + j, j0 + j + strip, i0, rows);
        if (strip_lo >= strip_hi) continue;  // mask() fills the strip
        const int64_t c0 = strip_lo / S::kLanes * S::kLanes, c1 = round_up(strip_hi, S::kLanes);
        tile_multiply<T>(strip, c1 - c0, t.s.D, key_data + j * key_ld, key_ld, 1, queries + c0,
                         kQuery, scores + j * kQuery + c0, kQuery, false);
      }
      const int64_t g0 = lo / S::kLanes, g1 = ceil_div(hi, S::kLanes);
      // Over the columns the softmax reads; also fills what the strips skipped.
      t.mask(scores, keys, i0, j0, g0 * S::kLanes, g1 * S::kLanes);
      // Query vectors outside [g0, g1) see no key of the tile: the step would leave their
      // statistics and acc unchanged (p = 0, correction 1), so they are skipped.
      online_softmax_step<T, kGroups>(scores + g0 * S::kLanes, kQuery, keys, g1 - g0,
                                      rows - g0 * S::kLanes, running_max + g0, running_sum + g0,
                                      acc + g0 * S::kLanes * t.dv_padded, t.dv_padded);
      const auto [values, value_ld] = value_rows(j0, keys);  // [keys, Dvp]
      for (int64_t r = lo; r < hi; r += kTileRows) {
        const int64_t strip = std::min<int64_t>(kTileRows, hi - r);
        // Keys seen by every query of the strip (ranges are monotone in the query).
        const int64_t common_first =
            std::clamp<int64_t>(t.s.keys(i0 + r + strip - 1).first - j0, 0, keys);
        const int64_t common_last =
            std::clamp<int64_t>(t.s.keys(i0 + r).last - j0, common_first, keys);
        if (common_first < common_last)
          tile_multiply<T>(strip, t.dv_padded, common_last - common_first,
                           scores + common_first * kQuery + r, 1, kQuery,
                           values + common_first * value_ld, value_ld, acc + r * t.dv_padded,
                           t.dv_padded, true);
        for (int64_t i = r; i < r + strip; ++i) {
          const KeyRange range = t.s.keys(i0 + i);
          const int64_t begin = std::clamp<int64_t>(range.first - j0, 0, keys);
          const int64_t end = std::clamp<int64_t>(range.last - j0, begin, keys);
          if (common_first < common_last) {
            add_products(i, begin, std::min(end, common_first), values, value_ld);
            add_products(i, std::max(begin, common_last), end, values, value_ld);
          } else {
            add_products(i, begin, end, values, value_ld);
          }
        }
      }
    }

    // acc[r] += sum_{j in [begin, end)} P^T[j, r] V[j].
    void add_products(int64_t r, int64_t begin, int64_t end, const T* values,
                      int64_t value_ld) const {
      T* a = acc + r * t.dv_padded;  // [Dvp]
      for (int64_t j = begin; j < end; ++j) {
        const T weight = scores[j * kQuery + r];
        const T* value = values + j * value_ld;  // [Dvp]
#pragma omp simd
        for (int64_t d = 0; d < t.dv_padded; ++d) a[d] += weight * value[d];
      }
    }
  };

  // The queries of the block [i0, i0 + rows) that see at least one key of [j0, j1), as a
  // range relative to i0: key j is seen by the queries i with j - (M - N) <= i (causal)
  // and i < j - (M - N) + window (window).
  std::pair<int64_t, int64_t> queries_seeing(int64_t j0, int64_t j1, int64_t i0,
                                             int64_t rows) const {
    const int64_t offset = s.M - s.N;
    const int64_t lo = std::clamp<int64_t>(j0 - offset - i0, 0, rows);
    const int64_t hi =
        s.window > 0 ? std::clamp<int64_t>(j1 - 1 - offset + s.window - i0, lo, rows) : rows;
    return {lo, hi};
  }

  // Sets the scores of key j0 + j invisible to query i0 + r to -inf. Key j is seen by the
  // queries i with j - (M - N) <= i (causal) and i < j - (M - N) + window (window).
  // Only columns [column_begin, column_end) of the tile are written.
  void mask(T* scores, int64_t keys, int64_t i0, int64_t j0, int64_t column_begin,
            int64_t column_end) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const int64_t offset = s.M - s.N;
    for (int64_t j = 0; j < keys; ++j) {
      T* row = scores + j * kQuery;  // [kQuery]
      const int64_t key = j0 + j;
      const int64_t begin = std::clamp<int64_t>(key - offset - i0, column_begin, column_end);
      const int64_t end = s.window > 0
                              ? std::clamp<int64_t>(key - offset + s.window - i0, begin, column_end)
                              : column_end;
      std::fill(row + column_begin, row + begin, minus_inf);
      std::fill(row + end, row + column_end, minus_inf);
    }
  }
};

}  // namespace
}  // namespace exact_detail

namespace cpu {

// In: float, double or bfloat16 storage (ForwardTask).
template <typename In>
void run(Backend, const Context& context, const exact_detail::ExactForwardParams<In>& params) {
  using namespace exact_detail;
  using T = Compute<In>;
  const Sizes& s = params.sizes;
  const View4<const In> q = params.q, k = params.k, v = params.v;
  const View4<In> out = params.out;
  const View3<T> lse = params.lse;
  if (s.M == 0) {  // no keys: every row is fully masked
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h) {
          std::fill(out.row(b, i, h), out.row(b, i, h) + s.Dv, In{});
          if (!lse.empty()) lse(b, h, i) = -std::numeric_limits<T>::infinity();
        }
    return;
  }
  const int64_t dv_padded = round_up(s.Dv, Simd<T>::kLanes);
  constexpr bool converts = ForwardTask<In>::kConverts;
  // Every query block streams all of its head's K and V. With several heads their rows
  // interleave (Hkv (D + Dv) apart), and once they outgrow the cache each block re-reads
  // them from memory with that stride: 10-19% of the time at N = M = 16,384-32,768, 4
  // heads of 64 (docs/perf/exact.md). Past kInPlaceBytes, several blocks per head read
  // contiguous copies instead (one O(M (D + Dv)) pass per head); below it the copy costs
  // more than it saves (5% at N = M = 256, 4 heads). bfloat16 keys are converted a key
  // block at a time by the tasks instead.
  const double interleaved_bytes =
      static_cast<double>(s.M) * s.Hkv * (s.D + s.Dv) * static_cast<double>(sizeof(T));
  const bool copies = !converts && s.Hkv > 1 && s.N > Blocks<T>::kQuery &&
                      interleaved_bytes > Blocks<T>::kInPlaceBytes;
  // Whole vectors already and no copy asked for: read v in place (no copy of M Dv).
  const bool in_place = !converts && dv_padded == s.Dv && !copies;
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const T* keys = nullptr;
  const T* values = nullptr;
  if constexpr (!converts) {
    keys = copies ? pack_rows(context, frame, k, s.M, s.D) : k.data;
    values = in_place ? v.data : pack_rows(context, frame, v, s.M, dv_padded);
  }
  const ForwardTask<In> task{s,
                            q,
                            k,
                            v,
                            keys,
                            copies ? s.D : k.strides[1],
                            copies ? s.M * s.D : k.strides[2],
                            copies ? s.Hkv * s.M * s.D : k.strides[0],
                            values,
                            in_place ? v.strides[1] : dv_padded,
                            in_place ? v.strides[2] : s.M * dv_padded,
                            in_place ? v.strides[0] : s.Hkv * s.M * dv_padded,
                            dv_padded,
                            out,
                            lse};
  const typename ForwardTask<In>::Scratch scratch(frame, context, s, dv_padded);
  const int64_t query_blocks = ceil_div(s.N, Blocks<T>::kQuery);
  // Causal blocks have unequal work (the last the most): the dynamic schedule takes the
  // last block of every (b, h) first, so that the light ones fill in at the end.
  parallel_for(context, s.B * s.H * query_blocks, [&](int64_t index) {
    const int64_t bh = index % (s.B * s.H), block = index / (s.B * s.H);
    task.run(bh / s.H, bh % s.H, (s.causal ? query_blocks - 1 - block : block) * Blocks<T>::kQuery,
             scratch.get());
  });
}

template void run<float>(Backend, const Context&, const exact_detail::ExactForwardParams<float>&);
template void run<double>(Backend, const Context&,
                          const exact_detail::ExactForwardParams<double>&);
template void run<bfloat16>(Backend, const Context&,
                            const exact_detail::ExactForwardParams<bfloat16>&);

}  // namespace cpu
}  // namespace subquad
