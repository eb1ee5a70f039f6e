// Fast MLR attention backward: FlashAttention-2 style, P recomputed tile by tile from the
// forward's lse, the score tile of each pair formed from only the levels whose blocks hold
// both tiles (mlr_tiles.h), so score work is T^2 sum_l r_l / 2^(l-1) (half when causal) and
// no T x T matrix is stored. Forward: mlr_forward.cpp. Reference: mlr_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "exact/simd.h"
#include "structured/mlr_levels.h"
#include "structured/mlr_tiles.h"
#include "subquad/gemm.h"
#include "subquad/parallel.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using mlr::kTile;
using mlr::Levels;
using mlr::TilePair;

int64_t tile_count(int64_t tokens) { return (tokens + kTile - 1) / kTile; }

// row[c] <- exp(row[c] - shift) = 2^((row[c] - shift) log2 e) for c < n, through the exact
// kernel's vector exp2 (a NaN score stays NaN; -inf gives 0). The arguments are <= 0 up to
// rounding: shift is the row's log-sum-exp.
template <typename T>
void exp_shifted(T* row, int64_t n, T shift) {
  using S = exact_detail::Simd<T>;
  const T log2e = static_cast<T>(1.4426950408889634074);
  int64_t c = 0;
  for (; c + S::kLanes <= n; c += S::kLanes)
    S::store(row + c, S::exp2((S::load(row + c) - shift) * log2e));
  for (; c < n; ++c) row[c] = std::exp(row[c] - shift);
}

TilePair tile_pair(int64_t tokens, int64_t query_tile, int64_t key_tile) {
  return {query_tile * kTile, std::min(tokens, (query_tile + 1) * kTile), key_tile * kTile,
          std::min(tokens, (key_tile + 1) * kTile)};
}

// 1/r_l for every column of level l: folding it into the queries makes each covering
// prefix one GEMM.
template <typename T>
std::vector<T> column_scales(const Levels& levels) {
  std::vector<T> scales(static_cast<size_t>(levels.offsets.back()));
  for (int64_t l = 0; l < levels.count; ++l)
    std::fill(scales.begin() + levels.offsets[l], scales.begin() + levels.offsets[l + 1],
              T(1) / static_cast<T>(levels.ranks[l]));
  return scales;
}

// qs [rows, D] = q rows [i0, i1) of head h, times the column scales.
template <typename T>
void scaled_queries(View4<const T> q, int64_t b, int64_t h, int64_t i0, int64_t i1,
                    const std::vector<T>& scales, T* qs) {
  const int64_t D = q.dim(3);
  for (int64_t i = i0; i < i1; ++i) {
    const T* row = q.row(b, i, h);
    T* out = qs + (i - i0) * D;
    for (int64_t c = 0; c < D; ++c) out[c] = row[c] * scales[c];
  }
}

}  // namespace

// Per (batch, kv head): for each query head of the group, key tile and visible query tile,
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = w P (dP - rowsum(dO * O)),
//   dQs[:, :c] += dS K[:, :c], dK[:, :c] += dS^T Qs[:, :c]  (c: the covering columns),
// partial blocks by rectangles, and finally dq = dQs / r_l per column.
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
  const Levels levels = mlr::make_levels(options.ranks, D, N);
  const std::vector<T> scales = column_scales<T>(levels);
  const int64_t group = H / Hkv, tiles = tile_count(N);

  parallel_for(context, B * Hkv, [&](int64_t task) {
    const int64_t hk = task % Hkv, b = task / Hkv;
    std::vector<T> dk_acc(static_cast<size_t>(N * D), T(0)), dv_acc(static_cast<size_t>(N * Dv), T(0));
    std::vector<T> qs(static_cast<size_t>(N * D)), dqs(static_cast<size_t>(N * D));
    std::vector<T> row_dot(static_cast<size_t>(N));
    std::vector<T> p(static_cast<size_t>(kTile * kTile)), ds(p.size()), weights(p.size());
    const T* k_base = k.row(b, 0, hk);
    const T* v_base = v.row(b, 0, hk);
    const int64_t ldk = k.strides[1], ldv = v.strides[1];
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      scaled_queries(q, b, h, 0, N, scales, qs.data());
      std::fill(dqs.begin(), dqs.end(), T(0));
      for (int64_t i = 0; i < N; ++i) {
        const T* o = out.row(b, i, h);
        const T* g = dout.row(b, i, h);
        T dot = 0;
        for (int64_t c = 0; c < Dv; ++c) dot += o[c] * g[c];
        row_dot[i] = dot;
      }
      const T* dout_base = dout.row(b, 0, h);
      const int64_t ldo = dout.strides[1];
      for (int64_t kt = 0; kt < tiles; ++kt)
        for (int64_t qt = options.causal ? kt : 0; qt < tiles; ++qt) {
          const TilePair tile = tile_pair(N, qt, kt);
          const int64_t rows = tile.rows(), cols = tile.cols();
          auto prefix = [&](int64_t width) {
            gemm(Transpose::no, Transpose::yes, rows, cols, width, T(1), qs.data() + tile.i0 * D,
                 D, k_base + tile.j0 * ldk, ldk, T(0), p.data(), kTile);
          };
          const mlr::TileWeights<T> w =
              mlr::form_scores(levels, options, tile, qs.data() + tile.i0 * D, D,
                               k_base + tile.j0 * ldk, ldk, prefix, p.data(), weights.data(), kTile);
          for (int64_t r = 0; r < rows; ++r) {
            T* row = p.data() + r * kTile;
            const T row_lse = lse(b, h, tile.i0 + r);
            if (row_lse == -std::numeric_limits<T>::infinity())
              std::fill(row, row + cols, T(0));
            else
              exp_shifted(row, cols, row_lse);
          }
          gemm(Transpose::yes, Transpose::no, cols, Dv, rows, T(1), p.data(), kTile,
               dout_base + tile.i0 * ldo, ldo, T(1), dv_acc.data() + tile.j0 * Dv, Dv);
          gemm(Transpose::no, Transpose::yes, rows, cols, Dv, T(1), dout_base + tile.i0 * ldo, ldo,
               v_base + tile.j0 * ldv, ldv, T(0), ds.data(), kTile);
          for (int64_t r = 0; r < rows; ++r) {
            const T dot = row_dot[tile.i0 + r];
            T* dsr = ds.data() + r * kTile;
            const T* pr = p.data() + r * kTile;
            if (w.per_entry) {
              const T* wr = weights.data() + r * kTile;
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - dot) * wr[c];
            } else {
              const T scale = w.uniform;
#pragma omp simd
              for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - dot) * scale;
            }
          }
          const int64_t width = levels.offsets[w.covering];
          gemm(Transpose::no, Transpose::no, rows, width, cols, T(1), ds.data(), kTile,
               k_base + tile.j0 * ldk, ldk, T(1), dqs.data() + tile.i0 * D, D);
          gemm(Transpose::yes, Transpose::no, cols, width, rows, T(1), ds.data(), kTile,
               qs.data() + tile.i0 * D, D, T(1), dk_acc.data() + tile.j0 * D, D);
          mlr::for_each_partial_block(
              levels, w.covering, tile, [&](int64_t l, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                for (int64_t i = r0; i < r1; ++i)
                  for (int64_t j = c0; j < c1; ++j) {
                    const T g = ds[(i - tile.i0) * kTile + (j - tile.j0)];
                    const T* krow = k_base + j * ldk;
                    for (int64_t c = levels.offsets[l]; c < levels.offsets[l + 1]; ++c) {
                      dqs[i * D + c] += g * krow[c];
                      dk_acc[j * D + c] += g * qs[i * D + c];
                    }
                  }
              });
        }
      for (int64_t i = 0; i < N; ++i) {
        T* row = dq.row(b, i, h);
        for (int64_t c = 0; c < D; ++c) row[c] = dqs[i * D + c] * scales[c];
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      std::copy(dk_acc.begin() + j * D, dk_acc.begin() + (j + 1) * D, dk.row(b, j, hk));
      std::copy(dv_acc.begin() + j * Dv, dv_acc.begin() + (j + 1) * Dv, dv.row(b, j, hk));
    }
  });
}

#define SUBQUAD_INSTANTIATE(T)                                                                    \
  template void mlr_attention_backward<T>(const Context&, View4<const T>, View4<const T>,         \
                                          View4<const T>, View4<const T>, View3<const T>,         \
                                          View4<const T>, const MlrOptions&, View4<T>, View4<T>, \
                                          View4<T>);
SUBQUAD_INSTANTIATE(float)
SUBQUAD_INSTANTIATE(double)
#undef SUBQUAD_INSTANTIATE

}  // namespace subquad
