// WildCat forward: recentering and value range per (batch, kv head), bins compressed in
// parallel (coreset.cpp), coresets concatenated, weighted attention per query head.
// O(B Hkv (M r^2 / C^2 + M r (D + Dv) / C) + B H N r (D + Dv)); reference: wildcat_ref.h,
// tests in wildcat_test.cpp.
#include "subquad/wildcat.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/parallel.h"
#include "common/workspace_frame.h"
#include "coreset.h"
#include "cpu/thread_scratch.h"
#include "subquad/error.h"
#include "weighted_attention.h"
#include "wildcat_ops.h"

namespace subquad {
namespace {

// Queries per parallel work item of the attention phase.
constexpr int64_t kQueryChunk = 512;
// Largest bound on |scores| accepted: a score plus a log scale (after the head's shift up to
// twice sq_max), minus the row max, stays within 4x the bound; a further 4x is headroom for
// the constants hidden in sq_max ~ bound / 4.
constexpr double kMaxScoreBound = std::numeric_limits<float>::max() / 16;

// Everything one (batch, kv head) needs: recentered keys [M, D], value range [Dv], the
// radius of its query heads, and finally its concatenated coreset.
struct KvHead {
  std::vector<float> centered;
  std::vector<float> vmin, vmax;
  double query_radius = 0.0, key_radius = 0.0;  // max norms of the group's queries, centred keys
  bool finite = true;  // every key and value finite (else the group's outputs are NaN)
  std::vector<wildcat::CoresetBin> bins;
  std::vector<float> core_keys;        // [r', D]
  std::vector<float> core_values;      // [r', Dv + 1]
  std::vector<float> core_log_scales;  // [r']
  int64_t core_size = 0;               // r'
};

void check_arguments(View4<const float> q, View4<const float> k, View4<const float> v,
                     const WildcatOptions& options, View4<float> out) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  check_view(out, "out");
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  check(D >= 1, "q: expected a head dim D >= 1, got shape ", shape_text(q.shape));
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

// The passes below are O((M + N) D) per head: vectorised (`omp simd` lets the norms' sums be
// reassociated, which stays deterministic), they cost less than the coreset itself.
void prepare_head(View4<const float> q, View4<const float> k, View4<const float> v, int64_t b,
                  int64_t hkv, int64_t group, KvHead& head) {
  const int64_t N = q.dim(1), D = q.dim(3), M = k.dim(1), Dv = v.dim(3);
  std::vector<double> mean(static_cast<size_t>(D), 0.0);
  for (int64_t j = 0; j < M; ++j) {
    const float* key = k.row(b, j, hkv);
#pragma omp simd
    for (int64_t e = 0; e < D; ++e) mean[e] += key[e];
  }
  for (double& m : mean) m /= static_cast<double>(M);
  // A NaN or inf key makes the mean, so every centred key and every output row, non-finite.
  for (double m : mean) head.finite = head.finite && std::isfinite(m);
  head.centered.resize(static_cast<size_t>(M * D));
  double key_sq = 0.0;
  for (int64_t j = 0; j < M; ++j) {
    const float* key = k.row(b, j, hkv);
    float* centered = head.centered.data() + j * D;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t e = 0; e < D; ++e) {
      centered[e] = static_cast<float>(key[e] - mean[e]);
      s += double(centered[e]) * centered[e];
    }
    key_sq = std::max(key_sq, s);
  }
  head.key_radius = std::sqrt(key_sq);
  head.vmin.assign(static_cast<size_t>(Dv), std::numeric_limits<float>::infinity());
  head.vmax.assign(static_cast<size_t>(Dv), -std::numeric_limits<float>::infinity());
  double value_sum = 0.0;
  for (int64_t j = 0; j < M; ++j) {
    const float* value = v.row(b, j, hkv);
#pragma omp simd reduction(+ : value_sum)
    for (int64_t c = 0; c < Dv; ++c) {
      head.vmin[c] = std::min(head.vmin[c], value[c]);
      head.vmax[c] = std::max(head.vmax[c], value[c]);
      value_sum += std::abs(value[c]);
    }
  }
  head.finite = head.finite && std::isfinite(value_sum);
  double radius = 0.0;
  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h)
    for (int64_t i = 0; i < N; ++i) {
      const float* query = q.row(b, i, h);
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < D; ++e) s += double(query[e]) * query[e];
      // A non-finite query affects its own row only (as in exact attention), not the
      // temperature of the coreset every query of the group shares.
      if (std::isfinite(s)) radius = std::max(radius, s);
    }
  head.query_radius = std::sqrt(radius);
}

// Concatenates the bins' coresets. The log scales are shifted by their largest finite value
// (a factor common to every entry of the head, so it cancels in the weighted attention) and
// stored as float: what matters is their spread, which float holds far beyond exp's range.
void assemble_head(int64_t D, int64_t Dv, const std::vector<Span>& spans, KvHead& head) {
  double shift = -std::numeric_limits<double>::infinity();
  for (const auto& bin : head.bins)
    for (double log_scale : bin.log_scales)
      if (std::isfinite(log_scale)) shift = std::max(shift, log_scale);
  if (!std::isfinite(shift)) shift = 0.0;
  for (size_t c = 0; c < head.bins.size(); ++c) {
    const auto& bin = head.bins[c];
    for (size_t i = 0; i < bin.pivots.size(); ++i) {
      const float* key = head.centered.data() + (spans[c].first + bin.pivots[i]) * D;
      head.core_keys.insert(head.core_keys.end(), key, key + D);
      head.core_values.insert(head.core_values.end(), bin.values.begin() + i * Dv,
                              bin.values.begin() + (i + 1) * Dv);
      head.core_values.push_back(bin.weights[i]);
      head.core_log_scales.push_back(static_cast<float>(bin.log_scales[i] - shift));
    }
    head.core_size += static_cast<int64_t>(bin.pivots.size());
  }
}

}  // namespace

void wildcat_attention(const Context& context, View4<const float> q, View4<const float> k,
                       View4<const float> v, const WildcatOptions& options, View4<float> out) {
  check_arguments(q, k, v, options, out);
  if (checked_product({q.dim(0), q.dim(1), q.dim(2), v.dim(3)}, "out") == 0) return;
  dispatch(context, wildcat::WildcatParams{q, k, v, options, out});
}

namespace cpu {

// The score bound is checked here, after the per-head radii are known.
void run(Backend, const Context& context, const wildcat::WildcatParams& params) {
  const View4<const float> q = params.q, k = params.k, v = params.v;
  const WildcatOptions& options = params.options;
  const View4<float> out = params.out;
  const ThreadScope threads(context);
  const int64_t B = q.dim(0), N = q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
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
  // Scores beta q.k, the scaled squared norms and the log scales are all bounded by about
  // max(beta, 1) R_Q R_K (the temperature makes sq_max ~ beta R_Q R_K / 4): finite inputs
  // beyond that overflow float32 and give inf - inf = NaN in the row max subtraction, as the
  // scores of float32 exact attention do past float's range. Such a kv group is non-finite
  // input: its outputs are NaN, like those of a group with a non-finite key.
  for (int64_t index = 0; index < B * Hkv; ++index) {
    KvHead& head = heads[index];
    const double bound = std::max(beta, 1.0) * head.query_radius * head.key_radius;
    if (head.finite && !(bound <= kMaxScoreBound)) head.finite = false;
  }
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  int64_t longest_bin = 0, largest_rank = 0;
  for (int64_t c = 0; c < C; ++c) {
    longest_bin = std::max(longest_bin, spans[c].size);
    largest_rank = std::max(largest_rank, ranks[c].size);
  }
  const ThreadScratch<float> bin_scratch(
      frame, context, wildcat::compress_bin_scratch_floats(longest_bin, D, Dv, largest_rank));
  parallel_for(context, B * Hkv * C, [&](int64_t unit) {
    const int64_t index = unit / C, c = unit % C;
    KvHead& head = heads[index];
    if (!head.finite) return;
    const Span span = spans[c];
    // compress_bin takes a query radius of 0 as R_Q = R_K of the bin. The score bound above
    // keeps the queries' true radius either way: it bounds the scores, not the temperature.
    const double query_radius = options.query_radius == QueryRadius::keys ? 0.0 : head.query_radius;
    head.bins[c] = wildcat::compress_bin(
        head.centered.data() + span.first * D, D, v.row(index / Hkv, span.first, index % Hkv),
        v.strides[1], span.size, D, Dv, beta, query_radius, ranks[c].size, options.method,
        wildcat::mix_seed(options.seed, static_cast<uint64_t>(unit)), bin_scratch.get(),
        context.interrupt);
  });
  parallel_for(context, B * Hkv, [&](int64_t index) { assemble_head(D, Dv, spans, heads[index]); });

  int64_t largest = 0;  // the largest coreset: the attention scratch of every chunk fits
  for (const KvHead& head : heads) largest = std::max(largest, head.core_size);
  const ThreadScratch<float> scratch(
      frame, context,
      wildcat::weighted_attention_scratch_floats(std::min(N, kQueryChunk), largest, Dv));
  const int64_t chunks = (N + kQueryChunk - 1) / kQueryChunk;
  parallel_for(context, B * H * chunks, [&](int64_t item) {
    const int64_t chunk = item % chunks, h = (item / chunks) % H, b = item / (chunks * H);
    const KvHead& head = heads[b * Hkv + h / group];
    const int64_t first = chunk * kQueryChunk, rows = std::min(kQueryChunk, N - first);
    if (!head.finite) {
      for (int64_t i = first; i < first + rows; ++i)
        std::fill(out.row(b, i, h), out.row(b, i, h) + Dv, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    wildcat::weighted_attention_rows(q.row(b, first, h), q.strides[1], rows, D,
                                     head.core_keys.data(), head.core_log_scales.data(),
                                     head.core_size, head.core_values.data(), Dv,
                                     static_cast<float>(beta), head.vmin.data(), head.vmax.data(),
                                     out.row(b, first, h), out.strides[1], scratch.get());
  });
}

}  // namespace cpu
}  // namespace subquad
