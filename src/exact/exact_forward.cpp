// Exact attention forward, tiled online softmax (FlashAttention style): one task per
// (batch, head, block of queries) streams key blocks, never holding more than a
// keys x queries tile. O(N M (D + Dv)) time, O(M Dv) extra memory for padded V rows.
// Reference: exact_ref.h (exact_attention_reference_forward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/online_softmax.h"
#include "cpu/tile_gemm.h"
#include "exact/exact_internal.h"

namespace subquad {
namespace exact_detail {
namespace {

template <typename T>
struct ForwardTask {
  const Sizes& s;
  View4<const T> q, k;
  const T* values;  // [B, Hkv, M, Dvp]  V rows padded to whole vectors
  int64_t dv_padded;
  View4<T> out;
  View3<T> lse;  // empty when not requested

  static constexpr int64_t kQuery = Blocks<T>::kQuery, kKey = Blocks<T>::kKey;
  using S = Simd<T>;
  using Vec = typename S::Vec;
  static constexpr int64_t kGroups = kQuery / S::kLanes;  // query vectors per block
  static_assert(kQuery % S::kLanes == 0, "the query block is a whole number of vectors");

  // The tile is held transposed, scores^T [keys, queries]: the queries of the block lie
  // along the vectors, so the softmax statistics of 16 queries are one vector and need no
  // horizontal reduction, and K is read in place as the broadcast operand (no transpose).
  void run(int64_t b, int64_t h, int64_t i0) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const int64_t rows = std::min(kQuery, s.N - i0);
    const int64_t hk = h / s.group;
    const int64_t columns = round_up(rows, S::kLanes), groups = columns / S::kLanes;
    // (scale log2(e)) Q^T [D, kQuery], zero-padded past `rows`, written row by row of Q^T:
    // stores scattered kQuery floats apart would stall the loads of q. Scaling the queries
    // gives scores in log2 units rounded once, so the exponents s - max are differences of
    // rounded values, exactly 0 at the maximum; scaling in the exponent instead (s c - max,
    // one multiply-add) leaves the rounding error of max there, hundreds of units for
    // scores near 1e10, which underflows the maximum's weight to 0.
    Buffer<T> queries(s.D * kQuery);
    const T* q_rows[kQuery];
    for (int64_t r = 0; r < rows; ++r) q_rows[r] = q.row(b, i0 + r, h);
    const T log2_scale = static_cast<T>(s.scale * kLog2e);
    for (int64_t d = 0; d < s.D; ++d)
      for (int64_t r = 0; r < rows; ++r) queries[d * kQuery + r] = log2_scale * q_rows[r][d];
    auto scores = Buffer<T>::uninitialized(kKey * kQuery);  // S^T, then P^T [keys, kQuery]
    Buffer<T> acc(kQuery * dv_padded);                       // unnormalised O [rows, Dvp]
    Vec running_max[kGroups], running_sum[kGroups];          // log2 units; per query
    for (int64_t g = 0; g < kGroups; ++g) {
      running_max[g] = S::splat(minus_inf);
      running_sum[g] = S::splat(T(0));
    }

    // Ranges are monotone in i, so the block's union of visible keys is [first, last).
    const int64_t first = s.keys(i0).first, last = s.keys(i0 + rows - 1).last;
    const int64_t last_first = s.keys(i0 + rows - 1).first, first_last = s.keys(i0).last;
    for (int64_t j0 = first; j0 < last; j0 += kKey) {
      const int64_t keys = std::min(kKey, last - j0);
      // S^T = K Q^T in log2 units.
      tile_multiply<T>(keys, columns, s.D, k.row(b, j0, hk), k.strides[1], 1, queries.data(),
                       kQuery, scores.data(), kQuery, false);
      const bool masked = !(last_first <= j0 && first_last >= j0 + keys);
      if (masked) mask(scores.data(), keys, i0, j0);

      online_softmax_step<T, kGroups>(scores.data(), kQuery, keys, groups, rows, running_max,
                                      running_sum, acc.data(), dv_padded);
      // O += P V, with P read transposed from the tile.
      const T* value_tile = values + ((b * s.Hkv + hk) * s.M + j0) * dv_padded;
      if (masked) {
        add_visible_products(scores.data(), keys, rows, i0, j0, value_tile, acc.data());
      } else {
        tile_multiply<T>(rows, dv_padded, keys, scores.data(), 1, kQuery, value_tile, dv_padded,
                         acc.data(), dv_padded, true);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T max = running_max[r / S::kLanes][r % S::kLanes];
      const T sum = running_sum[r / S::kLanes][r % S::kLanes];
      T* o = out.row(b, i0 + r, h);  // [Dv]
      if (sum == T(0)) {             // the row sees no key
        std::fill(o, o + s.Dv, T(0));
        if (!lse.empty()) lse(b, h, i0 + r) = minus_inf;
        continue;
      }
      const T inverse = T(1) / sum;
      const T* a = acc.data() + r * dv_padded;
      for (int64_t d = 0; d < s.Dv; ++d) o[d] = a[d] * inverse;
      if (!lse.empty())
        lse(b, h, i0 + r) = static_cast<T>(static_cast<double>(max) * kLn2 +
                                           std::log(static_cast<double>(sum)));
    }
  }

  // O[r] += sum_j P^T[j, r] V[j] over the keys j of the tile visible to query i0 + r only.
  // In a partially masked tile the masked weights are exactly 0, but 0 times a NaN or inf
  // value is NaN: padding or future tokens holding non-finite values poisoned rows that
  // cannot see them (N = M = 131: the 130 earlier rows). Masked entries never influence an
  // output, so their values are never read here.
  void add_visible_products(const T* p, int64_t keys, int64_t rows, int64_t i0, int64_t j0,
                            const T* value_tile, T* acc) const {
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange range = s.keys(i0 + r);
      const int64_t begin = std::clamp<int64_t>(range.first - j0, 0, keys);
      const int64_t end = std::clamp<int64_t>(range.last - j0, begin, keys);
      T* a = acc + r * dv_padded;  // [Dvp]
      for (int64_t j = begin; j < end; ++j) {
        const T weight = p[j * kQuery + r];
        const T* value = value_tile + j * dv_padded;  // [Dvp]
#pragma omp simd
        for (int64_t d = 0; d < dv_padded; ++d) a[d] += weight * value[d];
      }
    }
  }

  // Sets the scores of key j0 + j invisible to query i0 + r to -inf. Key j is seen by the
  // queries i with j - (M - N) <= i (causal) and i < j - (M - N) + window (window).
  void mask(T* scores, int64_t keys, int64_t i0, int64_t j0) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const int64_t offset = s.M - s.N;
    for (int64_t j = 0; j < keys; ++j) {
      T* row = scores + j * kQuery;  // [kQuery]
      const int64_t key = j0 + j;
      const int64_t begin = std::clamp<int64_t>(key - offset - i0, 0, kQuery);
      const int64_t end =
          s.window > 0 ? std::clamp<int64_t>(key - offset + s.window - i0, begin, kQuery)
                       : kQuery;
      std::fill(row, row + begin, minus_inf);
      std::fill(row + end, row + kQuery, minus_inf);
    }
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
  if (checked_product({s.B, s.N, s.H}, "q") == 0) return;
  if (s.M == 0) {  // no keys: every row is fully masked
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t h = 0; h < s.H; ++h) {
          std::fill(out.row(b, i, h), out.row(b, i, h) + s.Dv, T(0));
          if (!lse.empty()) lse(b, h, i) = -std::numeric_limits<T>::infinity();
        }
    return;
  }
  const int64_t dv_padded = round_up(s.Dv, Simd<T>::kLanes);
  const Buffer<T> values = pack_rows(context, v, s.M, dv_padded);
  const ForwardTask<T> task{s, q, k, values.data(), dv_padded, out, lse};
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
