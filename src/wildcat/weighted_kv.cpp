// Attention over caller-owned weighted key-value entries (weighted_kv_attention), and the
// entries of a compressor's selection (weighted_kv_entries). O(N L (D + Dv)) per head for L
// entries through weighted_attention_rows; reference: weighted_attention_reference in
// wildcat_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "cpu/thread_scratch.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"
#include "weighted_attention.h"
#include "wildcat_ops.h"

namespace subquad {
namespace {

constexpr int64_t kQueryChunk = 512;  // queries per parallel work item

// A per-head row block read as one contiguous [rows, width] array.
template <int Rank>
void check_rows_contiguous(const View<const float, Rank>& view, const char* name) {
  check_view(view, name);
  check(view.shape[Rank - 2] <= 1 || view.strides[Rank - 2] == view.shape[Rank - 1], name,
        ": expected the rows of each head contiguous (stride ", view.shape[Rank - 1],
        " between entries), got stride ", view.strides[Rank - 2]);
}

}  // namespace

void weighted_kv_attention(const Context& context, View4<const float> q, const WeightedKV& kv,
                           View4<float> out, std::optional<double> scale) {
  check_view(q, "q");
  check_view(out, "out");
  check_rows_contiguous(kv.keys, "keys");
  check_rows_contiguous(kv.values, "values");
  check_view(kv.log_scales, "log_scales");
  const int64_t B = kv.keys.dim(0), Hkv = kv.keys.dim(1), L = kv.keys.dim(2),
                D = kv.keys.dim(3);
  const int64_t N = q.dim(1), H = q.dim(2), Dv = kv.values.dim(3) - 1;
  check(kv.values.dim(0) == B && kv.values.dim(1) == Hkv && kv.values.dim(2) == L && Dv >= 0,
        "values: expected [", B, ", ", Hkv, ", ", L, ", Dv + 1] (the keys' heads and entries, "
        "the weight last), got ", shape_text(kv.values.shape));
  check_shape(kv.log_scales, {B, Hkv, L}, "log_scales (expected [B, Hkv, L])");
  check_shape(q, {B, N, H, D}, "q (expected [B, N, H, D] with the keys' B and D)");
  check(H % Hkv == 0, "q: the ", Hkv, " kv heads must divide the ", H, " query heads");
  check_shape(out, {B, N, H, Dv}, "out (expected [B, N, H, Dv])");
  if (!kv.lengths.empty()) {
    check_view(kv.lengths, "lengths");
    check_shape(kv.lengths, {B, Hkv}, "lengths (expected [B, Hkv])");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h)
        check(kv.lengths(b, h) >= 0 && kv.lengths(b, h) <= L, "lengths: expected values in [0, ",
              L, "], got ", kv.lengths(b, h));
  }
  check(kv.value_min.empty() == kv.value_max.empty(),
        "value_min: expected value_min and value_max both given or both absent");
  if (!kv.value_min.empty()) {
    check_shape(kv.value_min, {B, Hkv, Dv}, "value_min (expected [B, Hkv, Dv])");
    check_shape(kv.value_max, {B, Hkv, Dv}, "value_max (expected [B, Hkv, Dv])");
    check_view(kv.value_min, "value_min");
    check_view(kv.value_max, "value_max");
  }
  if (scale)
    check(std::isfinite(*scale) && *scale > 0.0, "scale: expected a finite value > 0, got ",
          *scale);
  const auto beta = static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(D))));
  dispatch(context, wildcat::WeightedAttendParams{kv, q, beta, out});
}

namespace cpu {

void run(Backend, const Context& context, const wildcat::WeightedAttendParams& params) {
  const WeightedKV& kv = params.kv;
  const View4<const float> q = params.q;
  const View4<float> out = params.out;
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = out.dim(3);
  const int64_t Hkv = kv.keys.dim(1), L = kv.keys.dim(2), group = H / Hkv;
  if (B * N * H == 0) return;
  const ThreadScope threads(context);
  const int64_t chunks = (N + kQueryChunk - 1) / kQueryChunk;
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const ThreadScratch<float> scratch(
      frame, context,
      wildcat::weighted_attention_scratch_floats(std::min(N, kQueryChunk), L, Dv));
  const bool ranged = !kv.value_min.empty();
  parallel_for(context, B * H * chunks, [&](int64_t item) {
    const int64_t chunk = item % chunks, h = (item / chunks) % H, b = item / (chunks * H);
    const int64_t hkv = h / group;
    const int64_t first = chunk * kQueryChunk, rows = std::min(kQueryChunk, N - first);
    const int64_t length = kv.lengths.empty() ? L : kv.lengths(b, hkv);
    wildcat::weighted_attention_rows(
        q.row(b, first, h), q.strides[1], rows, D, kv.keys.row(b, hkv, 0),
        kv.log_scales.row(b, hkv), length, kv.values.row(b, hkv, 0), Dv, params.beta,
        ranged ? kv.value_min.row(b, hkv) : nullptr, ranged ? kv.value_max.row(b, hkv) : nullptr,
        out.row(b, first, h), out.strides[1], scratch.get());
  });
}

}  // namespace cpu

int64_t KVSelection::max_entries() const {
  size_t most = 0;
  for (const Head& head : heads) most = std::max(most, head.indices.size());
  return static_cast<int64_t>(most);
}

WeightedKV WeightedKVEntries::view() const {
  const int64_t B = batch, Hkv = kv_heads, L = entries, D = head_dim, Dv = value_dim;
  return {View4<const float>(keys.data(), {B, Hkv, L, D}),
          View4<const float>(values.data(), {B, Hkv, L, Dv + 1}),
          View3<const float>(log_scales.data(), {B, Hkv, L}),
          View2<const int64_t>(lengths.data(), {B, Hkv}),
          View3<const float>(value_min.data(), {B, Hkv, Dv}),
          View3<const float>(value_max.data(), {B, Hkv, Dv})};
}

WeightedKVEntries weighted_kv_entries(View4<const float> k, View4<const float> v,
                                      const KVSelection& selection) {
  check_view(k, "k");
  check_view(v, "v");
  const int64_t B = k.dim(0), M = k.dim(1), Hkv = k.dim(2), D = k.dim(3), Dv = v.dim(3);
  check_shape(v, {B, M, Hkv, Dv}, "v (expected [B, M, Hkv, Dv] like k)");
  check(selection.batch == B && selection.kv_heads == Hkv && selection.value_dim == Dv &&
            static_cast<int64_t>(selection.heads.size()) == B * Hkv,
        "selection: expected one of k [", B, ", M, ", Hkv, ", D] and value dim ", Dv, ", got [",
        selection.batch, ", ", selection.kv_heads, "] and ", selection.value_dim);
  WeightedKVEntries e;
  e.batch = B;
  e.kv_heads = Hkv;
  e.entries = selection.max_entries();
  e.head_dim = D;
  e.value_dim = Dv;
  const int64_t L = e.entries;
  const int64_t heads = checked_product({B, Hkv}, "selection");
  try {
    e.keys.assign(static_cast<size_t>(checked_product({heads, L, D}, "keys")), 0.0f);
    e.values.assign(static_cast<size_t>(checked_product({heads, L, Dv + 1}, "values")), 0.0f);
    e.log_scales.assign(static_cast<size_t>(heads * L),
                        -std::numeric_limits<float>::infinity());
    e.lengths.assign(static_cast<size_t>(heads), 0);
    e.value_min.assign(static_cast<size_t>(heads * Dv), 0.0f);
    e.value_max.assign(static_cast<size_t>(heads * Dv), 0.0f);
  } catch (const std::bad_alloc&) {  // MemoryError naming what, not a bare std::bad_alloc
    throw_out_of_memory(static_cast<size_t>(heads * L) * (D + Dv + 2) * sizeof(float),
                        "the entries of " + std::to_string(heads) + " (batch, kv head) heads");
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      const int64_t head_index = b * Hkv + hkv;
      const KVSelection::Head& head = selection.head(b, hkv);
      const auto count = static_cast<int64_t>(head.indices.size());
      e.lengths[head_index] = count;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t j = head.indices[i];
        check(j >= 0 && j < M, "selection: index ", j, " out of the ", M, " tokens");
        // The weight and log scale are the compressor's bookkeeping, so a NaN there is a bug
        // of its (keys and values may hold anything: non-finite entries propagate).
        const float weight = head.weights[i], log_scale = head.log_scales[i];
        check(std::isfinite(weight), "selection: weight must be finite, got ", weight);
        check(!std::isnan(log_scale) && log_scale != std::numeric_limits<float>::infinity(),
              "selection: log_scale must be finite or -inf, got ", log_scale);
        const int64_t at = head_index * L + i;
        std::copy_n(k.row(b, j, hkv), D, e.keys.begin() + at * D);
        std::copy_n(head.values.begin() + i * Dv, Dv, e.values.begin() + at * (Dv + 1));
        e.values[at * (Dv + 1) + Dv] = weight;
        e.log_scales[at] = log_scale;
      }
      // The value range of every token of the head (the clamp of weighted attention).
      float* lo = e.value_min.data() + head_index * Dv;
      float* hi = e.value_max.data() + head_index * Dv;
      for (int64_t j = 0; j < M; ++j) {
        const float* value = v.row(b, j, hkv);
        for (int64_t c = 0; c < Dv; ++c) {
          lo[c] = j == 0 ? value[c] : std::min(lo[c], value[c]);
          hi[c] = j == 0 ? value[c] : std::max(hi[c], value[c]);
        }
      }
    }
  return e;
}

}  // namespace subquad
