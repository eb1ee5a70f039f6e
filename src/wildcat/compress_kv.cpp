// CompressKV: sinks and window kept exactly, the middle of every (batch, kv head) split
// into bins compressed to WildCat coresets without queries (R_Q = R_K), in parallel over
// (batch, kv head, bin). O(B Hkv M bin_rank^2 + B Hkv M D); tests in weighted_kv_test.cpp.
#include <algorithm>
#include <cmath>

#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "coreset.h"
#include "cpu/thread_scratch.h"
#include "subquad/error.h"
#include "subquad/wildcat.h"
#include "wildcat_ops.h"

namespace subquad {
namespace {

struct Layout {
  int64_t sink, window, middle, bins;
};

}  // namespace

CompressKV::CompressKV(const CompressKVOptions& options) : options_(options) {
  check(options.sink >= 0, "CompressKVOptions.sink: expected >= 0, got ", options.sink);
  check(options.window >= 0, "CompressKVOptions.window: expected >= 0, got ", options.window);
  check(options.compression_ratio >= 0.0 && options.compression_ratio < 1.0,
        "CompressKVOptions.compression_ratio: expected a value in [0, 1), got ",
        options.compression_ratio);
  check(options.bin_rank >= 1, "CompressKVOptions.bin_rank: expected >= 1, got ", options.bin_rank);
  if (options.scale)
    check(std::isfinite(*options.scale) && *options.scale > 0.0,
          "CompressKVOptions.scale: expected a finite value > 0, got ", *options.scale);
}

int64_t CompressKV::bins(int64_t M) const {
  check(M >= 0, "CompressKV.bins: expected M >= 0 tokens, got ", M);
  const int64_t sink = std::min(options_.sink, M);
  const int64_t middle = M - sink - std::min(options_.window, M - sink);
  if (middle == 0) return 0;
  // As the authors' press: the kept budget of the middle, in whole bins of bin_rank points
  // (at least one bin, at most one point per bin's key).
  const auto kept = static_cast<int64_t>(std::floor(middle * (1.0 - options_.compression_ratio)));
  return std::clamp<int64_t>(kept / options_.bin_rank, 1, middle);
}

KVSelection CompressKV::select(const Context& context, View4<const float> k,
                               View4<const float> v) const {
  check_view(k, "k");
  check_view(v, "v");
  check_shape(v, {k.dim(0), k.dim(1), k.dim(2), v.dim(3)}, "v");
  return dispatch(context, wildcat::CompressKVParams{*this, options_, k, v});
}

namespace cpu {

KVSelection run(Backend, const Context& context, const wildcat::CompressKVParams& params) {
  const View4<const float> k = params.k, v = params.v;
  const CompressKVOptions& options = params.options;
  const int64_t B = k.dim(0), M = k.dim(1), Hkv = k.dim(2), D = k.dim(3), Dv = v.dim(3);
  KVSelection selection{.batch = B, .kv_heads = Hkv, .value_dim = Dv,
                        .heads = std::vector<KVSelection::Head>(static_cast<size_t>(B * Hkv))};
  const int64_t sink = std::min(options.sink, M);
  const int64_t window = std::min(options.window, M - sink);
  const int64_t middle = M - sink - window;
  const int64_t C = params.compressor.bins(M);
  const double beta = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const ThreadScope threads(context);

  // Recentered middle keys [middle, D] per (batch, kv head); the mean is over all M keys
  // (as the authors'); any shift is exact for softmax and only affects the temperature.
  // A head with a non-finite key or value is not compressed: its middle is kept exactly, so
  // the NaN or inf reaches the outputs as in exact attention (docs/conventions.md: non-finite
  // input propagates) instead of vanishing into a coreset.
  std::vector<std::vector<float>> centered(static_cast<size_t>(B * Hkv));
  std::vector<char> finite(static_cast<size_t>(B * Hkv), 1);
  parallel_for(context, B * Hkv, [&](int64_t index) {
    const int64_t b = index / Hkv, hkv = index % Hkv;
    std::vector<double> mean(static_cast<size_t>(D), 0.0);
    double value_sum = 0.0;
    for (int64_t j = 0; j < M; ++j) {
      for (int64_t e = 0; e < D; ++e) mean[e] += k(b, j, hkv, e);
      for (int64_t c = 0; c < Dv; ++c) value_sum += std::abs(v(b, j, hkv, c));
    }
    for (double& m : mean) m /= static_cast<double>(M);
    for (double m : mean) finite[index] &= std::isfinite(m) ? 1 : 0;
    if (!std::isfinite(value_sum)) finite[index] = 0;
    if (!finite[index]) return;
    auto& keys = centered[index];
    keys.resize(static_cast<size_t>(middle * D));
    for (int64_t j = 0; j < middle; ++j)
      for (int64_t e = 0; e < D; ++e)
        keys[j * D + e] = static_cast<float>(k(b, sink + j, hkv, e) - mean[e]);
  });

  auto span = [&](int64_t c) {  // near-equal contiguous bins of the middle
    const int64_t base = middle / C, extra = middle % C;
    return std::pair<int64_t, int64_t>{c * base + std::min(c, extra), base + (c < extra)};
  };
  std::vector<wildcat::CoresetBin> coresets(static_cast<size_t>(B * Hkv * C));
  WorkspaceFrame frame(context);  // the bins' scratch: none allocated with a workspace
  const ThreadScratch<float> bin_scratch(
      frame, context,
      wildcat::compress_bin_scratch_floats(C > 0 ? span(0).second : 0, D, Dv, options.bin_rank));
  parallel_for(context, B * Hkv * C, [&](int64_t unit) {
    const int64_t index = unit / C, c = unit % C;
    if (!finite[index]) return;
    const auto [first, size] = span(c);
    coresets[unit] = wildcat::compress_bin(
        centered[index].data() + first * D, D, v.row(index / Hkv, sink + first, index % Hkv),
        v.strides[1], size, D, Dv, beta, /*query_radius=*/0.0, options.bin_rank,
        CoresetMethod::wildcat, wildcat::mix_seed(options.seed, static_cast<uint64_t>(unit)),
        bin_scratch.get(), context.interrupt);
  });

  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      KVSelection::Head& head = selection.heads[static_cast<size_t>(b * Hkv + hkv)];
      auto add = [&](int64_t j, const float* value, float weight, float log_scale) {
        head.indices.push_back(j);
        head.values.insert(head.values.end(), value, value + Dv);
        head.weights.push_back(weight);
        head.log_scales.push_back(log_scale);
      };
      for (int64_t j = 0; j < sink; ++j) add(j, v.row(b, j, hkv), 1.0f, 0.0f);
      if (!finite[b * Hkv + hkv]) {
        for (int64_t j = sink; j < M - window; ++j) add(j, v.row(b, j, hkv), 1.0f, 0.0f);
      }
      for (int64_t c = 0; c < C && finite[b * Hkv + hkv]; ++c) {
        const auto& bin = coresets[(b * Hkv + hkv) * C + c];
        // Exact entries carry weight 1 and log scale 0, so coreset entries keep their true
        // log scale (no common shift).
        for (size_t i = 0; i < bin.pivots.size(); ++i) {
          add(sink + span(c).first + bin.pivots[i], bin.values.data() + i * Dv, bin.weights[i],
              static_cast<float>(bin.log_scales[i]));
        }
      }
      for (int64_t j = M - window; j < M; ++j) add(j, v.row(b, j, hkv), 1.0f, 0.0f);
    }
  return selection;
}

}  // namespace cpu
}  // namespace subquad
