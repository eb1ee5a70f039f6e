// KV-cache baselines at a fixed budget: StreamingLLM (sinks + recent window) and SnapKV
// (observation-window votes, average-pooled, top-k per kv head). SnapKV costs
// O(B H W M D) for the votes; tests in weighted_kv_test.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "common/gemm.h"
#include "common/parallel.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"
#include "wildcat_ops.h"

namespace subquad {
namespace {

// The selection of the tokens `kept` (ascending) of each (batch, kv head), weight 1.
KVSelection selection_of(View4<const float> v, std::vector<std::vector<int64_t>> kept) {
  const int64_t B = v.dim(0), Hkv = v.dim(2), Dv = v.dim(3);
  KVSelection selection{.batch = B, .kv_heads = Hkv, .value_dim = Dv,
                        .heads = std::vector<KVSelection::Head>(static_cast<size_t>(B * Hkv))};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      KVSelection::Head& head = selection.heads[static_cast<size_t>(b * Hkv + hkv)];
      head.indices = std::move(kept[static_cast<size_t>(b * Hkv + hkv)]);
      for (int64_t j : head.indices) head.values.insert(head.values.end(), v.row(b, j, hkv),
                                                        v.row(b, j, hkv) + Dv);
      head.weights.assign(head.indices.size(), 1.0f);
      head.log_scales.assign(head.indices.size(), 0.0f);
    }
  return selection;
}

void check_kv(View4<const float> k, View4<const float> v) {
  check_view(k, "k");
  check_view(v, "v");
  check(k.dim(2) >= 1, "k: expected at least one kv head, got shape ", shape_text(k.shape));
  check(k.dim(3) >= 1, "k: expected a head dim D >= 1, got shape ", shape_text(k.shape));
  check_shape(v, {k.dim(0), k.dim(1), k.dim(2), v.dim(3)}, "v");
}

}  // namespace

KVSelection streaming_llm_select(View4<const float> k, View4<const float> v, int64_t sink,
                                 int64_t window) {
  check_kv(k, v);
  check(sink >= 0, "sink: expected >= 0, got ", sink);
  check(window >= 0, "window: expected >= 0, got ", window);
  const int64_t M = k.dim(1);
  std::vector<int64_t> kept;
  for (int64_t j = 0; j < M; ++j)
    if (j < sink || j >= M - window) kept.push_back(j);
  return selection_of(v, std::vector<std::vector<int64_t>>(k.dim(0) * k.dim(2), kept));
}

KVSelection snapkv_select(const Context& context, View4<const float> q_obs, View4<const float> k,
                          View4<const float> v, const SnapKVOptions& options) {
  check_kv(k, v);
  check_view(q_obs, "q_obs");
  const int64_t B = k.dim(0), M = k.dim(1), Hkv = k.dim(2), D = k.dim(3);
  const int64_t W = q_obs.dim(1), H = q_obs.dim(2);
  check_shape(q_obs, {B, W, H, D}, "q_obs");
  check(H % Hkv == 0, "q_obs: the ", Hkv, " kv heads must divide the ", H, " query heads");
  check(W <= M, "q_obs: expected at most M = ", M, " observation queries, got ", W);
  check(options.capacity >= W, "SnapKVOptions.capacity: expected >= the observation window ", W,
        ", got ", options.capacity);
  check(options.pool_kernel >= 1 && options.pool_kernel % 2 == 1,
        "SnapKVOptions.pool_kernel: expected an odd width >= 1, got ", options.pool_kernel);
  if (options.scale)
    check(std::isfinite(*options.scale) && *options.scale > 0.0,
          "SnapKVOptions.scale: expected a finite value > 0, got ", *options.scale);
  const auto beta =
      static_cast<float>(options.scale.value_or(1.0 / std::sqrt(static_cast<double>(D))));
  return dispatch(context, wildcat::SnapKVParams{q_obs, k, v, options, beta});
}

namespace cpu {

KVSelection run(Backend, const Context& context, const wildcat::SnapKVParams& params) {
  const View4<const float> q_obs = params.q_obs, k = params.k, v = params.v;
  const SnapKVOptions& options = params.options;
  const float beta = params.beta;
  const int64_t B = k.dim(0), M = k.dim(1), Hkv = k.dim(2), D = k.dim(3);
  const int64_t W = q_obs.dim(1), H = q_obs.dim(2);
  const int64_t group = H / Hkv, prefix = M - W, top = options.capacity - W;
  const ThreadScope threads(context);

  std::vector<std::vector<int64_t>> kept(static_cast<size_t>(B * Hkv));
  parallel_for(context, B * Hkv, [&](int64_t index) {
    const int64_t b = index / Hkv, hkv = index % Hkv;
    auto& keep = kept[index];
    if (M <= options.capacity) {
      keep.resize(static_cast<size_t>(M));
      std::iota(keep.begin(), keep.end(), int64_t{0});
      return;
    }
    // Votes: the causal softmax of observation query w (position prefix + w) over keys
    // [0, prefix + w], summed over w and the group's query heads, restricted to the prefix.
    std::vector<double> votes(static_cast<size_t>(prefix), 0.0);
    std::vector<float> scores(static_cast<size_t>(W * M));
    for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
      gemm(Transpose::no, Transpose::yes, W, M, D, beta, q_obs.row(b, 0, h), q_obs.strides[1],
           k.row(b, 0, hkv), k.strides[1], 0.0f, scores.data(), M);
      for (int64_t w = 0; w < W; ++w) {
        const float* row = scores.data() + w * M;
        const int64_t visible = prefix + w + 1;
        const float row_max = *std::max_element(row, row + visible);
        double sum = 0.0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(double(row[j]) - row_max);
        for (int64_t j = 0; j < prefix; ++j) votes[j] += std::exp(double(row[j]) - row_max) / sum;
      }
    }
    // Average pooling, zero padded, divided by the full width (as torch's avg_pool1d).
    const int64_t half = options.pool_kernel / 2;
    std::vector<double> pooled(static_cast<size_t>(prefix), 0.0);
    for (int64_t j = 0; j < prefix; ++j) {
      for (int64_t o = std::max<int64_t>(0, j - half); o <= std::min(prefix - 1, j + half); ++o)
        pooled[j] += votes[o];
      pooled[j] /= static_cast<double>(options.pool_kernel);
    }
    std::vector<int64_t> order(static_cast<size_t>(prefix));
    std::iota(order.begin(), order.end(), int64_t{0});
    // Ties go to the earlier token, so the selection is deterministic.
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t c) {
      return pooled[a] > pooled[c] || (pooled[a] == pooled[c] && a < c);
    });
    keep.assign(order.begin(), order.begin() + top);
    std::sort(keep.begin(), keep.end());
    for (int64_t j = prefix; j < M; ++j) keep.push_back(j);
  });
  return selection_of(v, std::move(kept));
}

}  // namespace cpu
}  // namespace subquad
