// Exact attention forward, tiled online softmax (FlashAttention style): one task per
// (batch, head, block of queries) streams key blocks, never holding more than a
// queries x keys tile. O(N M (D + Dv)) time, O(M (D + Dv)) extra memory for packed K, V.
// Reference: exact_ref.h (exact_attention_reference_forward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "exact/exact_internal.h"
#include "exact/tile_gemm.h"

namespace subquad {
namespace exact_detail {
namespace {

template <typename T>
struct ForwardTask {
  const Sizes& s;
  View4<const T> q;
  const T* key_panels;  // [B, Hkv, blocks, D, kKey]
  const T* values;      // [B, Hkv, blocks * kKey, Dvp]
  int64_t dv_padded;
  View4<T> out;
  View3<T> lse;  // empty when not requested

  static constexpr int64_t kQuery = Blocks<T>::kQuery, kKey = Blocks<T>::kKey;
  using S = Simd<T>;
  using Vec = typename S::Vec;

  void run(int64_t b, int64_t h, int64_t i0) const {
    const int64_t rows = std::min(kQuery, s.N - i0);
    const int64_t b_hk = b * s.Hkv + h / s.group;
    const int64_t blocks = ceil_div(s.M, kKey);
    auto scores = Buffer<T>::uninitialized(kQuery * kKey);  // [rows, kKey], then P
    Buffer<T> acc(kQuery * dv_padded);                       // [rows, Dvp], unnormalised O
    Buffer<T> row_max(kQuery), new_max(kQuery);  // running maxes, in log2 units
    Buffer<T> row_sum(kQuery * S::kLanes);       // per row, lane-wise partial sums
    std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<T>::infinity());
    // The block's queries, contiguous: rows of q are H * D apart, often a multiple of
    // 4 KiB, which would put them all in one L1 set.
    auto queries = Buffer<T>::uninitialized(kQuery * s.D);  // [rows, D]
    for (int64_t r = 0; r < rows; ++r)
      std::copy(q.row(b, i0 + r, h), q.row(b, i0 + r, h) + s.D, queries.data() + r * s.D);

    // Ranges are monotone in i, so the block's union of visible keys is [first, last).
    const int64_t first = s.keys(i0).first, last = s.keys(i0 + rows - 1).last;
    const int64_t last_first = s.keys(i0 + rows - 1).first, first_last = s.keys(i0).last;
    const T log2_scale = static_cast<T>(s.scale * kLog2e);
    for (int64_t j0 = first / kKey * kKey; j0 < last; j0 += kKey) {
      const int64_t width = std::min(kKey, s.M - j0);
      const int64_t padded = round_up(width, S::kLanes);
      // S = Q K^T for this block (unscaled; the scale is folded into the exponent).
      tile_multiply<T>(rows, padded, s.D, queries.data(), s.D, 1,
                       key_panels + (b_hk * blocks + j0 / kKey) * s.D * kKey, kKey,
                       scores.data(), kKey, false);
      const bool unmasked = last_first <= j0 && first_last >= j0 + width;
      // Two passes over the rows, not one per row: each row's max -> exp chain is long,
      // and independent rows in flight hide its latency.
      for (int64_t r = 0; r < rows; ++r)
        new_max[r] = mask_and_max(scores.data() + r * kKey, width, padded, unmasked, i0 + r,
                                  j0, log2_scale, row_max[r]);
      for (int64_t r = 0; r < rows; ++r)
        if (!std::isnan(new_max[r]))
          exponentiate(scores.data() + r * kKey, padded, log2_scale, new_max[r], row_max[r],
                       row_sum.data() + r * S::kLanes, acc.data() + r * dv_padded);
      // O += P V over the keys some row of the block sees.
      const int64_t k0 = std::clamp<int64_t>(first - j0, 0, width);
      const int64_t k1 = std::clamp<int64_t>(last - j0, 0, width);
      if (k0 < k1)
        tile_multiply<T>(rows, dv_padded, k1 - k0, scores.data() + k0, kKey, 1,
                         values + (b_hk * blocks * kKey + j0 + k0) * dv_padded, dv_padded,
                         acc.data(), dv_padded, true);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* o = out.row(b, i0 + r, h);  // [Dv]
      const T* a = acc.data() + r * dv_padded;
      const T sum = S::reduce_sum(S::load(row_sum.data() + r * S::kLanes));
      if (sum == T(0)) {  // the row sees no key
        std::fill(o, o + s.Dv, T(0));
        if (!lse.empty()) lse(b, h, i0 + r) = -std::numeric_limits<T>::infinity();
        continue;
      }
      const T inverse = T(1) / sum;
      for (int64_t d = 0; d < s.Dv; ++d) o[d] = a[d] * inverse;
      if (!lse.empty())
        lse(b, h, i0 + r) = static_cast<T>(static_cast<double>(row_max[r]) * kLn2 +
                                           std::log(static_cast<double>(sum)));
    }
  }

  // Masks row r of the tile (entries past `width`, up to `padded`, too) and returns the
  // new running max in log2 units, or NaN when the row sees no key of this block (then
  // the row is zeroed and needs no update).
  T mask_and_max(T* row, int64_t width, int64_t padded, bool unmasked, int64_t i, int64_t j0,
                 T log2_scale, T running_max) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    int64_t k0 = 0, k1 = width;
    if (!unmasked) {
      const KeyRange keys = s.keys(i);
      k0 = std::clamp<int64_t>(keys.first - j0, 0, width);
      k1 = std::clamp<int64_t>(keys.last - j0, 0, width);
      if (k0 >= k1) {
        std::fill(row, row + padded, T(0));
        return std::numeric_limits<T>::quiet_NaN();
      }
    }
    std::fill(row, row + k0, minus_inf);
    std::fill(row + k1, row + padded, minus_inf);
    // Two independent chains halve the latency of the max.
    Vec max0 = S::splat(minus_inf), max1 = max0;
    int64_t k = 0;
    for (; k + 2 * S::kLanes <= padded; k += 2 * S::kLanes) {
      const Vec x0 = S::load(row + k), x1 = S::load(row + k + S::kLanes);
      max0 = x0 > max0 ? x0 : max0;
      max1 = x1 > max1 ? x1 : max1;
    }
    if (k < padded) {
      const Vec x = S::load(row + k);
      max0 = x > max0 ? x : max0;
    }
    max0 = max1 > max0 ? max1 : max0;
    return std::max(running_max, S::reduce_max(max0) * log2_scale);
  }

  // Turns the row's scores into unnormalised probabilities p = 2^(s log2_scale - m) in
  // place, with m the new running max, and rescales the running sum and the accumulator
  // row by 2^(old max - m). The running sum stays a vector (one partial per lane) so that
  // only the max needs a horizontal reduction.
  void exponentiate(T* row, int64_t padded, T log2_scale, T new_max, T& running_max,
                    T* running_sum, T* acc) const {
    const Vec scale = S::splat(log2_scale), shift = S::splat(new_max);
    Vec sum = S::splat(T(0));
    for (int64_t k = 0; k < padded; k += S::kLanes) {
      const Vec p = S::exp2(S::load(row + k) * scale - shift);
      S::store(row + k, p);
      sum += p;
    }
    // The vector exp2 on one lane: cheaper than a libm call, and the same rounding as p.
    const Vec c = S::exp2(S::splat(running_max - new_max));
    if (c[0] != T(1))
      for (int64_t d = 0; d < dv_padded; d += S::kLanes)
        S::store(acc + d, S::load(acc + d) * c);
    S::store(running_sum, S::load(running_sum) * c + sum);
    running_max = new_max;
  }
};

}  // namespace
}  // namespace exact_detail

template <typename T>
void exact_attention_forward(const Context& context, View4<const T> q, View4<const T> k,
                             View4<const T> v, const ExactOptions& options, View4<T> out,
                             View3<T> lse) {
  using namespace exact_detail;
  const Sizes s = check_inputs(q, k, v, options);
  check_view(out, "out");
  check_shape(out, {s.B, s.N, s.H, s.Dv}, "out (expected [B, N, H, Dv])");
  if (!lse.empty()) {
    check_view(lse, "lse");
    check_shape(lse, {s.B, s.H, s.N}, "lse (expected [B, H, N])");
  }
  if (s.B * s.N * s.H == 0) return;
  if (s.M == 0) {  // no keys: every row is fully masked
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h) {
          std::fill(out.row(b, i, h), out.row(b, i, h) + s.Dv, T(0));
          if (!lse.empty()) lse(b, h, i) = -std::numeric_limits<T>::infinity();
        }
    return;
  }
  constexpr int64_t key_block = Blocks<T>::kKey;
  const int64_t dv_padded = round_up(s.Dv, Simd<T>::kLanes);
  const Buffer<T> key_panels = pack_panels(context, k, key_block);
  const Buffer<T> values =
      pack_rows(context, v, ceil_div(s.M, key_block) * key_block, dv_padded);
  const ForwardTask<T> task{s, q, key_panels.data(), values.data(), dv_padded, out, lse};
  const int64_t query_blocks = ceil_div(s.N, Blocks<T>::kQuery);
  parallel_for(context, s.B * s.H * query_blocks, [&](int64_t index) {
    const int64_t block = index % query_blocks, bh = index / query_blocks;
    task.run(bh / s.H, bh % s.H, block * Blocks<T>::kQuery);
  });
}

template void exact_attention_forward<float>(const Context&, View4<const float>,
                                             View4<const float>, View4<const float>,
                                             const ExactOptions&, View4<float>, View3<float>);
template void exact_attention_forward<double>(const Context&, View4<const double>,
                                              View4<const double>, View4<const double>,
                                              const ExactOptions&, View4<double>,
                                              View3<double>);

}  // namespace subquad
