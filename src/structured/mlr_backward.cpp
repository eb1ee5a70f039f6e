// Fast MLR attention backward: the exact backward's structure (src/exact/exact_backward.cpp),
// P recomputed tile by tile from the forward's lse with the exact kernel's tile products, the
// score tile of each pair formed from only the levels whose blocks hold both tiles
// (mlr_tiles.h), so score work is T^2 sum_l r_l / 2^(l-1) (half when causal) besides the
// T^2 Dv products of dV and dP; no T x T matrix is stored. Forward: mlr_forward.cpp.
// Reference: mlr_ref.h.
#include <algorithm>
#include <limits>

#include "common/buffer.h"
#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/pack.h"
#include "cpu/simd.h"
#include "cpu/thread_scratch.h"
#include "cpu/tile_gemm.h"
#include "structured/mlr_levels.h"
#include "structured/mlr_tiles.h"
#include "structured/structured_ops.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using cpu::round_up;
using cpu::Simd;
using cpu::tile_multiply;
using mlr::Levels;
using mlr::TilePair;

// Queries per tile and keys per block: powers of two, so that when T is a power-of-two
// multiple of them the level blocks hold whole tiles and only the diagonal pairs meet a
// level in part (as in the forward). 64..256 x 64..256 measured within noise
// (docs/perf/structured.md).
constexpr int64_t kQuery = 128;
constexpr int64_t kKey = 128;

// sum_c a[c] b[c] for c < n, in vectors.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  using S = Simd<T>;
  typename S::Vec sum = S::splat(T(0));
  int64_t c = 0;
  for (; c + S::kLanes <= n; c += S::kLanes) sum += S::load(a + c) * S::load(b + c);
  T total = S::reduce_sum(sum);
  for (; c < n; ++c) total += a[c] * b[c];
  return total;
}

// One (batch, kv head): loops over key blocks, the group's query heads and the query tiles
// that see the block, accumulating dK, dV of the block and dQ of every query head, so
// nothing is shared between threads and the result is deterministic.
template <typename T>
struct BackwardTask {
  using S = Simd<T>;
  using Vec = typename S::Vec;

  const Levels& levels;
  const MlrOptions& options;
  int64_t N, D, Dv, group, d_padded, dv_padded;
  View4<const T> q, k, v, out, dout;
  View3<const T> lse;
  View4<T> dq, dk, dv;

  // One thread's buffers, from the call's workspace frame (cpu::ThreadScratch), reused by
  // the tasks that thread runs; the rows of head g of the group start at g * N.
  struct Tiles {
    T* queries;      // [group, N, Dp]   q / r_l per column (Qs), zero-padded
    T* grads_out;    // [group, N, Dvp]  dO, zero-padded
    T* lse2;         // [group, N]       lse in log2 units
    T* row_dot;      // [group, N]       D_i = rowsum(dO * O)
    T* dq_acc;       // [group, N, Dp]   dQs
    T* key_panel;    // [D, kKey]        K^T of the block
    T* value_panel;  // [Dv, kKey]       V^T of the block
    T* masked_keys;  // [L, kKey, Dp]    copy m: K rows, columns >= c_m zeroed
    T* dk_acc;       // [D, kKey]        dK^T of the block
    T* dv_acc;       // [kKey, Dvp]
    T* probs;        // [kQuery, kKey]   P
    T* grads;        // [kQuery, kKey]   dP, then dS
    T* weights;      // [kQuery, kKey]   1 / level count where it varies
  };
  struct Scratch {
    cpu::ThreadScratch<T> queries, grads_out, lse2, row_dot, dq_acc, key_panel, value_panel,
        masked_keys, dk_acc, dv_acc, probs, grads, weights;
    Scratch(WorkspaceFrame& frame, const Context& context, const BackwardTask& t)
        : queries(frame, context, t.group * t.N * t.d_padded),
          grads_out(frame, context, t.group * t.N * t.dv_padded),
          lse2(frame, context, t.group * t.N),
          row_dot(frame, context, t.group * t.N),
          dq_acc(frame, context, t.group * t.N * t.d_padded),
          key_panel(frame, context, t.D * kKey),
          value_panel(frame, context, t.Dv * kKey),
          masked_keys(frame, context, t.levels.count * kKey * t.d_padded),
          dk_acc(frame, context, t.D * kKey),
          dv_acc(frame, context, kKey * t.dv_padded),
          probs(frame, context, kQuery * kKey),
          grads(frame, context, kQuery * kKey),
          weights(frame, context, kQuery * kKey) {}
    Tiles get() const {
      return {queries.get(),   grads_out.get(), lse2.get(),        row_dot.get(), dq_acc.get(),
              key_panel.get(), value_panel.get(), masked_keys.get(), dk_acc.get(), dv_acc.get(),
              probs.get(),     grads.get(),     weights.get()};
    }
  };

  void run(int64_t b, int64_t hk, Tiles& w) const {
    pack_heads(b, hk, w);
    std::fill(w.dq_acc, w.dq_acc + group * N * d_padded, T(0));
    for (int64_t j0 = 0; j0 < N; j0 += kKey) {
      const int64_t width = std::min(kKey, N - j0);
      pack_key_block(b, hk, j0, width, w);
      std::fill(w.dk_acc, w.dk_acc + D * kKey, T(0));
      std::fill(w.dv_acc, w.dv_acc + kKey * dv_padded, T(0));
      // Causal: query tiles on the kQuery grid from the one holding query j0.
      const int64_t first = options.causal ? j0 / kQuery * kQuery : 0;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i0 = first; i0 < N; i0 += kQuery)
          pair(g, {i0, std::min(N, i0 + kQuery), j0, j0 + width}, w);
      for (int64_t j = 0; j < width; ++j) {
        T* dk_row = dk.row(b, j0 + j, hk);
        for (int64_t d = 0; d < D; ++d) dk_row[d] = w.dk_acc[d * kKey + j];
        std::copy(w.dv_acc + j * dv_padded, w.dv_acc + j * dv_padded + Dv,
                  dv.row(b, j0 + j, hk));
      }
    }
    // dq = dQs / r_l per column (Qs = q / r_l).
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < N; ++i) {
        T* row = dq.row(b, i, hk * group + g);
        const T* acc = w.dq_acc + (g * N + i) * d_padded;
        for (int64_t l = 0; l < levels.count; ++l) {
          const T scale = T(1) / static_cast<T>(levels.ranks[l]);
          for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d)
            row[d] = acc[d] * scale;
        }
      }
  }

  // The group's scaled queries, dO, lse in log2 units and D_i.
  void pack_heads(int64_t b, int64_t hk, Tiles& w) const {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = hk * group + g;
      for (int64_t i = 0; i < N; ++i) {
        const T* qi = q.row(b, i, h);
        T* qs = w.queries + (g * N + i) * d_padded;
        for (int64_t l = 0; l < levels.count; ++l) {
          const T scale = T(1) / static_cast<T>(levels.ranks[l]);
          for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d) qs[d] = qi[d] * scale;
        }
        std::fill(qs + D, qs + d_padded, T(0));
        const T* o = out.row(b, i, h);
        const T* go = dout.row(b, i, h);
        T* dout_row = w.grads_out + (g * N + i) * dv_padded;
        std::copy(go, go + Dv, dout_row);
        std::fill(dout_row + Dv, dout_row + dv_padded, T(0));
        T sum = 0;
        for (int64_t d = 0; d < Dv; ++d) sum += o[d] * go[d];
        w.row_dot[g * N + i] = sum;
        w.lse2[g * N + i] = static_cast<T>(lse(b, h, i) * cpu::kLog2e);
      }
    }
  }

  // K^T and V^T of keys [j0, j0 + width) (columns past width zero), and the masked copies of
  // K: the dQ product runs over whole vectors of columns, and the zeros keep the columns
  // past the covering levels' c_m unchanged.
  void pack_key_block(int64_t b, int64_t hk, int64_t j0, int64_t width, Tiles& w) const {
    std::fill(w.key_panel, w.key_panel + D * kKey, T(0));
    std::fill(w.value_panel, w.value_panel + Dv * kKey, T(0));
    for (int64_t j = 0; j < width; ++j) {
      const T* kj = k.row(b, j0 + j, hk);
      const T* vj = v.row(b, j0 + j, hk);
      for (int64_t d = 0; d < D; ++d) w.key_panel[d * kKey + j] = kj[d];
      for (int64_t d = 0; d < Dv; ++d) w.value_panel[d * kKey + j] = vj[d];
      for (int64_t m = 1; m <= levels.count; ++m) {
        T* row = w.masked_keys + ((m - 1) * kKey + j) * d_padded;
        std::copy(kj, kj + levels.offsets[m], row);
        std::fill(row + levels.offsets[m], row + d_padded, T(0));
      }
    }
  }

  // One query tile against one key block (query head g of the group):
  //   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = w P (dP - D_i),
  //   dK[:, :c] += dS^T Qs[:, :c], dQs[:, :c] += dS K[:, :c]  (c: the covering columns),
  // and the levels met in part by rectangles.
  void pair(int64_t g, const TilePair& tile, Tiles& w) const {
    const int64_t rows = tile.rows(), width = tile.cols();
    const int64_t padded = round_up(width, S::kLanes);
    const T* qs = w.queries + (g * N + tile.i0) * d_padded;     // [rows, Dp]
    const T* go = w.grads_out + (g * N + tile.i0) * dv_padded;  // [rows, Dvp]
    T* dqs = w.dq_acc + (g * N + tile.i0) * d_padded;           // [rows, Dp]
    // In the forward: S = w sum_l Qs_l K_l^T, O = P V.
    auto prefix = [&](int64_t depth) {
      tile_multiply<T>(rows, padded, depth, qs, d_padded, 1, w.key_panel, kKey,
                       w.probs, kKey, false);
    };
    const mlr::TileWeights<T> weights =
        mlr::form_scores(levels, options, tile, qs, d_padded, w.key_panel, kKey, prefix,
                         w.probs, w.weights, kKey);
    tile_multiply<T>(rows, padded, Dv, go, dv_padded, 1, w.value_panel, kKey, w.grads,
                     kKey, false);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = tile.i0 + r;
      const int64_t visible =
          options.causal ? std::clamp<int64_t>(i + 1 - tile.j0, 0, width) : width;
      T* p = w.probs + r * kKey;
      T* ds = w.grads + r * kKey;
      const T shift = w.lse2[g * N + i], di = w.row_dot[g * N + i];
      if (weights.per_entry)
        probabilities_row<true>(p, ds, w.weights + r * kKey, weights.uniform, visible,
                                padded, shift, di);
      else
        probabilities_row<false>(p, ds, nullptr, weights.uniform, visible, padded, shift, di);
    }
    // dK^T [c, keys]: rows of the product are the c columns, so no column past c is touched.
    const int64_t c = levels.offsets[weights.covering];
    const T* covering_keys = w.masked_keys + (weights.covering - 1) * kKey * d_padded;
    if (!options.causal || tile.i0 + 1 - tile.j0 >= width) {  // every query sees every key
      tile_multiply<T>(width, dv_padded, rows, w.probs, 1, kKey, go, dv_padded,
                       w.dv_acc, dv_padded, true);
      tile_multiply<T>(c, padded, rows, qs, 1, d_padded, w.grads, kKey, w.dk_acc,
                       kKey, true);
      tile_multiply<T>(rows, round_up(c, S::kLanes), width, w.grads, kKey, 1,
                       covering_keys, d_padded, dqs, d_padded, true);
    } else {
      // A tile on the causal diagonal, query by query over the keys it sees: its masked P
      // and dS are 0, but 0 times a NaN or inf in a key or value it does not see (a future
      // token, padding) would still be NaN (docs/conventions.md, "Masked entries").
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = std::clamp<int64_t>(tile.i0 + r + 1 - tile.j0, 0, width);
        if (visible == 0) continue;
        tile_multiply<T>(visible, dv_padded, 1, w.probs + r * kKey, 1, kKey,
                         go + r * dv_padded, dv_padded, w.dv_acc, dv_padded, true);
        tile_multiply<T>(c, round_up(visible, S::kLanes), 1, qs + r * d_padded, 1, d_padded,
                         w.grads + r * kKey, kKey, w.dk_acc, kKey, true);
        tile_multiply<T>(1, round_up(c, S::kLanes), visible, w.grads + r * kKey, kKey, 1,
                         covering_keys, d_padded, dqs + r * d_padded, d_padded, true);
      }
    }
    add_partial_gradients(weights.covering, tile, qs, dqs, w);
  }

  // p [padded] holds S, ds [padded] holds dP; on return p = 2^(w S log2(e) - lse2) on the
  // `visible` first keys and 0 elsewhere, ds = w p (dP - D_i). A row that sees no key
  // (lse = -inf) is all zeros.
  template <bool kPerEntry>
  static void probabilities_row(T* p, T* ds, const T* weight_row, T uniform, int64_t visible,
                                int64_t padded, T shift, T di) {
    if (visible <= 0 || shift == -std::numeric_limits<T>::infinity()) {
      std::fill(p, p + padded, T(0));
      std::fill(ds, ds + padded, T(0));
      return;
    }
    const Vec log2e = S::splat(static_cast<T>(cpu::kLog2e));
    const Vec lse2 = S::splat(shift), dot = S::splat(di);
    for (int64_t c = 0; c < padded; c += S::kLanes) {
      const Vec weight = kPerEntry ? S::load(weight_row + c) : S::splat(uniform);
      const Vec prob = S::exp2(S::load(p + c) * weight * log2e - lse2);
      S::store(p + c, prob);
      S::store(ds + c, weight * prob * (S::load(ds + c) - dot));
    }
    std::fill(p + visible, p + padded, T(0));
    std::fill(ds + visible, ds + padded, T(0));
  }

  // The levels that meet the pair in part: dQs_l += dS K_l and dK_l += dS^T Qs_l over each
  // rectangle, as vector loops along the keys.
  void add_partial_gradients(int64_t covering, const TilePair& tile, const T* qs, T* dqs,
                             Tiles& w) const {
    mlr::for_each_partial_block(
        levels, covering, tile, [&](int64_t l, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
          const int64_t begin = c0 - tile.j0;
          for (int64_t i = r0; i < r1; ++i) {
            // Causal: only the keys query i sees (a masked key may hold NaN).
            const int64_t count =
                options.causal ? std::clamp<int64_t>(i + 1 - c0, 0, c1 - c0) : c1 - c0;
            const T* ds = w.grads + (i - tile.i0) * kKey + begin;
            const T* qrow = qs + (i - tile.i0) * d_padded;
            T* dq_row = dqs + (i - tile.i0) * d_padded;
            for (int64_t d = levels.offsets[l]; d < levels.offsets[l + 1]; ++d) {
              T* dk_row = w.dk_acc + d * kKey + begin;
              dq_row[d] += dot(ds, w.key_panel + d * kKey + begin, count);
              const T qd = qrow[d];
              for (int64_t j = 0; j < count; ++j) dk_row[j] += qd * ds[j];
            }
          }
        });
  }
};

}  // namespace

template <typename T>
void mlr_attention_backward(const Context& context, View4<const T> q, View4<const T> k,
                            View4<const T> v, View4<const T> out, View3<const T> lse,
                            View4<const T> dout, const MlrOptions& options, View4<T> dq,
                            View4<T> dk, View4<T> dv) {
  mlr::check_attention_arguments(q, k, v, options);
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3);
  const int64_t Hkv = k.dim(2);
  mlr::check_output(out, {B, N, H, Dv}, "out");
  mlr::check_output(dout, {B, N, H, Dv}, "dout");
  check(!lse.empty(), "lse: the backward needs the forward's lse, got an empty view");
  mlr::check_output(lse, {B, H, N}, "lse");
  mlr::check_output(dq, {B, N, H, D}, "dq");
  mlr::check_output(dk, {B, N, Hkv, D}, "dk");
  mlr::check_output(dv, {B, N, Hkv, Dv}, "dv");
  if (checked_product({B, N, H}, "q") == 0) return;
  dispatch(context, mlr::MlrBackwardParams<T>{q, k, v, out, lse, dout, options, dq, dk, dv});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const mlr::MlrBackwardParams<T>& params) {
  const View4<const T> q = params.q, k = params.k, v = params.v, out = params.out;
  const View3<const T> lse = params.lse;
  const View4<const T> dout = params.dout;
  const MlrOptions& options = params.options;
  const View4<T> dq = params.dq, dk = params.dk, dv = params.dv;
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3);
  const int64_t Hkv = k.dim(2);
  const Levels levels = mlr::make_levels(options.ranks, D, N);
  const BackwardTask<T> task{levels,
                             options,
                             N,
                             D,
                             Dv,
                             H / Hkv,
                             round_up(D, Simd<T>::kLanes),
                             round_up(Dv, Simd<T>::kLanes),
                             q,
                             k,
                             v,
                             out,
                             dout,
                             lse,
                             dq,
                             dk,
                             dv};
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const typename BackwardTask<T>::Scratch scratch(frame, context, task);
  parallel_for(context, B * Hkv, [&](int64_t index) {
    typename BackwardTask<T>::Tiles w = scratch.get();
    task.run(index / Hkv, index % Hkv, w);
  });
}

template void run<float>(Backend, const Context&, const mlr::MlrBackwardParams<float>&);
template void run<double>(Backend, const Context&, const mlr::MlrBackwardParams<double>&);

}  // namespace cpu

#define SUBQUAD_INSTANTIATE(T)                                                        \
  template void mlr_attention_backward<T>(                                            \
      const Context&, View4<const T>, View4<const T>, View4<const T>, View4<const T>, \
      View3<const T>, View4<const T>, const MlrOptions&, View4<T>, View4<T>, View4<T>);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
