// WildCat forward: recentering and value range per (batch, kv head), bins compressed in
// parallel (coreset.cpp), coresets concatenated, weighted attention per query head.
// O(B Hkv M r^2 / C + B H N r (D + Dv)); reference: wildcat_ref.h, tests in wildcat_test.cpp.
#include "subquad/wildcat.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "coreset.h"
#include "subquad/error.h"
#include "subquad/parallel.h"
#include "weighted_attention.h"

namespace subquad {
namespace {

// Queries per parallel work item of the attention phase.
constexpr int64_t kQueryChunk = 512;

// Everything one (batch, kv head) needs: recentered keys [M, D], value range [Dv], the
// radius of its query heads, and finally its concatenated coreset.
struct KvHead {
  std::vector<float> centered;
  std::vector<float> vmin, vmax;
  double query_radius = 0.0;
  std::vector<wildcat::CoresetBin> bins;
  std::vector<float> core_keys;    // [r', D]
  std::vector<float> core_values;  // [r', Dv + 1]
  int64_t core_size = 0;           // r'
};

void check_arguments(View4<const float> q, View4<const float> k, View4<const float> v,
                     const WildcatOptions& options, View4<float> out) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  check_view(out, "out");
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  check(D >= 1, "q: expected a head dim D >= 1, got shape ", shape_string(q.shape));
  check_shape(k, {B, M, Hkv, D}, "k");
  check_shape(v, {B, M, Hkv, Dv}, "v");
  check(Hkv >= 1 && H % Hkv == 0, "k: the number of kv heads must divide the ", H,
        " query heads, got ", Hkv);
  check_shape(out, {B, N, H, Dv}, "out");
  check(options.rank >= 1, "options.rank: expected r >= 1, got ", options.rank);
  check(options.bins >= 1 && options.bins <= options.rank,
        "options.bins: expected 1 <= bins <= rank = ", options.rank, ", got ", options.bins);
  if (options.scale)
    check(std::isfinite(*options.scale) && *options.scale > 0.0,
          "options.scale: expected a finite value > 0, got ", *options.scale);
}

// Keys [first, first + size) of a split of `count` items into `parts` near-equal parts.
struct Span {
  int64_t first, size;
};
Span split(int64_t count, int64_t parts, int64_t part) {
  const int64_t base = count / parts, extra = count % parts;
  return {part * base + std::min(part, extra), base + (part < extra ? 1 : 0)};
}

void prepare_head(View4<const float> q, View4<const float> k, View4<const float> v, int64_t b,
                  int64_t hkv, int64_t group, KvHead& head) {
  const int64_t N = q.dim(1), D = q.dim(3), M = k.dim(1), Dv = v.dim(3);
  std::vector<double> mean(static_cast<size_t>(D), 0.0);
  for (int64_t j = 0; j < M; ++j) {
    const float* key = k.row(b, j, hkv);
    for (int64_t e = 0; e < D; ++e) mean[e] += key[e];
  }
  for (double& m : mean) m /= static_cast<double>(M);
  head.centered.resize(static_cast<size_t>(M * D));
  for (int64_t j = 0; j < M; ++j) {
    const float* key = k.row(b, j, hkv);
    for (int64_t e = 0; e < D; ++e) head.centered[j * D + e] = static_cast<float>(key[e] - mean[e]);
  }
  head.vmin.assign(static_cast<size_t>(Dv), std::numeric_limits<float>::infinity());
  head.vmax.assign(static_cast<size_t>(Dv), -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < M; ++j) {
    const float* value = v.row(b, j, hkv);
    for (int64_t c = 0; c < Dv; ++c) {
      head.vmin[c] = std::min(head.vmin[c], value[c]);
      head.vmax[c] = std::max(head.vmax[c], value[c]);
    }
  }
  double radius = 0.0;
  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h)
    for (int64_t i = 0; i < N; ++i) {
      const float* query = q.row(b, i, h);
      double s = 0.0;
      for (int64_t e = 0; e < D; ++e) s += double(query[e]) * query[e];
      radius = std::max(radius, s);
    }
  head.query_radius = std::sqrt(radius);
}

// Concatenates the bins' coresets, rescaling each to the largest log_scale (factors <= 1,
// common to all entries, so they cancel in the weighted attention).
void assemble_head(int64_t D, int64_t Dv, const std::vector<Span>& spans, KvHead& head) {
  double log_scale = -std::numeric_limits<double>::infinity();
  for (const auto& bin : head.bins) log_scale = std::max(log_scale, bin.log_scale);
  for (size_t c = 0; c < head.bins.size(); ++c) {
    const auto& bin = head.bins[c];
    const double factor = std::exp(bin.log_scale - log_scale);
    for (size_t i = 0; i < bin.pivots.size(); ++i) {
      const float* key = head.centered.data() + (spans[c].first + bin.pivots[i]) * D;
      head.core_keys.insert(head.core_keys.end(), key, key + D);
      for (int64_t col = 0; col < Dv; ++col)
        head.core_values.push_back(static_cast<float>(factor * bin.values[i * Dv + col]));
      head.core_values.push_back(static_cast<float>(factor * bin.weights[i]));
    }
    head.core_size += static_cast<int64_t>(bin.pivots.size());
  }
}

}  // namespace

void wildcat_attention(const Context& context, View4<const float> q, View4<const float> k,
                       View4<const float> v, const WildcatOptions& options, View4<float> out) {
  check_arguments(q, k, v, options, out);
  const ThreadScope threads(context);
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  if (B == 0 || N == 0 || H == 0 || Dv == 0) return;
  if (M == 0) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t h = 0; h < H; ++h) std::fill(out.row(b, i, h), out.row(b, i, h) + Dv, 0.0f);
    return;
  }
  const double beta = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t group = H / Hkv;
  const int64_t C = std::min(options.bins, M);
  std::vector<Span> spans, ranks;
  for (int64_t c = 0; c < C; ++c) {
    spans.push_back(split(M, C, c));
    ranks.push_back(split(options.rank, C, c));
  }

  std::vector<KvHead> heads(static_cast<size_t>(B * Hkv));
  parallel_for(context, B * Hkv, [&](int64_t index) {
    KvHead& head = heads[index];
    prepare_head(q, k, v, index / Hkv, index % Hkv, group, head);
    head.bins.resize(static_cast<size_t>(C));
  });
  parallel_for(context, B * Hkv * C, [&](int64_t unit) {
    const int64_t index = unit / C, c = unit % C;
    KvHead& head = heads[index];
    const Span span = spans[c];
    head.bins[c] = wildcat::compress_bin(
        head.centered.data() + span.first * D, D, v.row(index / Hkv, span.first, index % Hkv),
        v.strides[1], span.size, D, Dv, beta, head.query_radius, ranks[c].size, options.method,
        wildcat::mix_seed(options.seed, static_cast<uint64_t>(unit)));
  });
  parallel_for(context, B * Hkv, [&](int64_t index) { assemble_head(D, Dv, spans, heads[index]); });

  const int64_t chunks = (N + kQueryChunk - 1) / kQueryChunk;
  parallel_for(context, B * H * chunks, [&](int64_t item) {
    const int64_t chunk = item % chunks, h = (item / chunks) % H, b = item / (chunks * H);
    const KvHead& head = heads[b * Hkv + h / group];
    const int64_t first = chunk * kQueryChunk, rows = std::min(kQueryChunk, N - first);
    wildcat::weighted_attention_rows(q.row(b, first, h), q.strides[1], rows, D,
                                     head.core_keys.data(), head.core_size, head.core_values.data(),
                                     Dv, static_cast<float>(beta), head.vmin.data(),
                                     head.vmax.data(), out.row(b, first, h), out.strides[1]);
  });
}

}  // namespace subquad
