// WeightedKVCache: per (batch, kv head) keys, weighted values [v, w] and the running value
// range; attention over it is weighted_attention_rows. O(N L (D + Dv)) per head for L
// entries; reference: weighted_attention_reference in wildcat_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
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

}  // namespace

WeightedKVCache::WeightedKVCache(int64_t batch, int64_t kv_heads, int64_t head_dim,
                                 int64_t value_dim)
    : batch_(batch),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      value_dim_(value_dim),
      query_heads_(kv_heads) {
  check(batch >= 0, "WeightedKVCache: expected batch >= 0, got ", batch);
  check(kv_heads >= 1, "WeightedKVCache: expected kv_heads >= 1, got ", kv_heads);
  check(head_dim >= 1, "WeightedKVCache: expected head_dim >= 1, got ", head_dim);
  check(value_dim >= 0, "WeightedKVCache: expected value_dim >= 0, got ", value_dim);
  const int64_t heads = checked_product({batch, kv_heads}, "WeightedKVCache");
  try {
    heads_.resize(static_cast<size_t>(heads));
  } catch (const std::bad_alloc&) {  // MemoryError naming what, not a bare std::bad_alloc
    throw_out_of_memory(static_cast<size_t>(heads) * sizeof(Head),
                        "the " + std::to_string(heads) + " (batch, kv head) entries of a cache");
  }
}

const WeightedKVCache::Head& WeightedKVCache::head(int64_t b, int64_t hkv) const {
  check(b >= 0 && b < batch_ && hkv >= 0 && hkv < kv_heads_, "WeightedKVCache: head (", b, ", ",
        hkv, ") outside [", batch_, ", ", kv_heads_, "]");
  return heads_[b * kv_heads_ + hkv];
}

WeightedKVCache::Head& WeightedKVCache::head(int64_t b, int64_t hkv) {
  return const_cast<Head&>(std::as_const(*this).head(b, hkv));
}

int64_t WeightedKVCache::length(int64_t b, int64_t hkv) const {
  return static_cast<int64_t>(head(b, hkv).keys.size()) / head_dim_;
}

void WeightedKVCache::push(int64_t b, int64_t hkv, const float* key, const float* value,
                           float weight, float log_scale) {
  add_entry(head(b, hkv), key, value, weight, log_scale);
  pushed_ = true;
}

void WeightedKVCache::add_entry(Head& h, const float* key, const float* value, float weight,
                                float log_scale) {
  // Keys and values propagate non-finite entries (as attention does); the weight and log
  // scale are the cache's own bookkeeping, so a NaN there is a caller's bug.
  check(std::isfinite(weight), "WeightedKVCache::push: weight must be finite, got ", weight);
  check(!std::isnan(log_scale) && log_scale != std::numeric_limits<float>::infinity(),
        "WeightedKVCache::push: log_scale must be finite or -inf, got ", log_scale);
  h.keys.insert(h.keys.end(), key, key + head_dim_);
  h.values.insert(h.values.end(), value, value + value_dim_);
  h.values.push_back(weight);
  h.log_scales.push_back(log_scale);
}

void WeightedKVCache::widen_range(int64_t b, int64_t hkv, const float* value) {
  Head& h = head(b, hkv);
  if (h.vmin.empty()) {
    h.vmin.assign(value, value + value_dim_);
    h.vmax.assign(value, value + value_dim_);
    return;
  }
  for (int64_t c = 0; c < value_dim_; ++c) {
    h.vmin[c] = std::min(h.vmin[c], value[c]);
    h.vmax[c] = std::max(h.vmax[c], value[c]);
  }
}

void WeightedKVCache::append(View4<const float> k, View4<const float> v) {
  check_view(k, "k");
  check_view(v, "v");
  const int64_t T = k.dim(1);
  check_shape(k, {batch_, T, kv_heads_, head_dim_}, "k");
  check_shape(v, {batch_, T, kv_heads_, value_dim_}, "v");
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t hkv = 0; hkv < kv_heads_; ++hkv)
      for (int64_t t = 0; t < T; ++t) {
        add_entry(head(b, hkv), k.row(b, t, hkv), v.row(b, t, hkv), 1.0f, 0.0f);
        widen_range(b, hkv, v.row(b, t, hkv));
      }
  seen_ += T;
}

void WeightedKVCache::update(const Context& context, View4<const float> q, View4<const float> k,
                             View4<const float> v, View4<float> out,
                             std::optional<double> scale) {
  check_view(q, "q");
  check(q.dim(2) % kv_heads_ == 0, "q: the cache's ", kv_heads_, " kv heads must divide the ",
        q.dim(2), " query heads");
  // What append changes, restored when attend refuses (its checks, or no backend for the
  // device): a refused update leaves the cache as it was.
  struct Saved {
    size_t keys, values, log_scales;
    std::vector<float> vmin, vmax;
  };
  std::vector<Saved> saved;
  for (const Head& h : heads_)
    saved.push_back({h.keys.size(), h.values.size(), h.log_scales.size(), h.vmin, h.vmax});
  const int64_t seen = seen_, query_heads = query_heads_;
  append(k, v);
  query_heads_ = q.dim(2);
  try {
    attend(context, q, out, scale);
  } catch (...) {
    for (size_t i = 0; i < heads_.size(); ++i) {
      Head& h = heads_[i];
      h.keys.resize(saved[i].keys);
      h.values.resize(saved[i].values);
      h.log_scales.resize(saved[i].log_scales);
      h.vmin = std::move(saved[i].vmin);
      h.vmax = std::move(saved[i].vmax);
    }
    seen_ = seen;
    query_heads_ = query_heads;
    throw;
  }
}

void WeightedKVCache::append(const Context&, const DecodeTokens<float>& tokens) {
  append(tokens.k, tokens.v);
}

void WeightedKVCache::update(const Context& context, const DecodeTokens<float>& tokens,
                             View4<float> out) {
  update(context, tokens.q, tokens.k, tokens.v, out);
}

void WeightedKVCache::truncate(int64_t length) {
  check(length >= 0 && length <= seen_, "length: expected a value in [0, ", seen_, "], got ",
        length);
  check(!pushed_, "length: a cache with pushed entries (compressed, or built entry by entry) "
        "holds no tokens to roll back to");
  for (Head& h : heads_) {
    h.keys.resize(static_cast<size_t>(length * head_dim_));
    h.values.resize(static_cast<size_t>(length * (value_dim_ + 1)));
    h.log_scales.resize(static_cast<size_t>(length));
    // The value range of the tokens kept (every entry is a token: weight 1, its value).
    h.vmin.clear();
    h.vmax.clear();
    for (int64_t j = 0; j < length; ++j) {
      const float* value = h.values.data() + j * (value_dim_ + 1);
      if (h.vmin.empty()) {
        h.vmin.assign(value, value + value_dim_);
        h.vmax.assign(value, value + value_dim_);
      }
      for (int64_t c = 0; c < value_dim_; ++c) {
        h.vmin[c] = std::min(h.vmin[c], value[c]);
        h.vmax[c] = std::max(h.vmax[c], value[c]);
      }
    }
  }
  seen_ = length;
}

std::unique_ptr<DecodeCache<float>> WeightedKVCache::clone() const {
  return std::make_unique<WeightedKVCache>(*this);
}

int64_t WeightedKVCache::memory_bytes() const {
  int64_t floats = 0;
  for (const Head& h : heads_)
    floats += static_cast<int64_t>(h.keys.size() + h.values.size() + h.log_scales.size() +
                                   h.vmin.size() + h.vmax.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

void WeightedKVCache::attend(const Context& context, View4<const float> q, View4<float> out,
                             std::optional<double> scale) const {
  check_view(q, "q");
  check_view(out, "out");
  const int64_t N = q.dim(1), H = q.dim(2);
  check_shape(q, {batch_, N, H, head_dim_}, "q");
  check(H % kv_heads_ == 0, "q: the cache's ", kv_heads_, " kv heads must divide the ", H,
        " query heads");
  check_shape(out, {batch_, N, H, value_dim_}, "out");
  if (scale)
    check(std::isfinite(*scale) && *scale > 0.0, "scale: expected a finite value > 0, got ",
          *scale);
  const auto beta =
      static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim_))));
  dispatch(context, wildcat::WeightedAttendParams{*this, q, beta, out});
}

namespace cpu {

void run(Backend, const Context& context, const wildcat::WeightedAttendParams& params) {
  const WeightedKVCache& cache = params.cache;
  const View4<const float> q = params.q;
  const View4<float> out = params.out;
  const int64_t N = q.dim(1), H = q.dim(2), D = cache.head_dim(), Dv = cache.value_dim();
  const int64_t group = H / cache.kv_heads();
  const ThreadScope threads(context);
  const int64_t chunks = (N + kQueryChunk - 1) / kQueryChunk;
  int64_t longest = 0;  // entries of the longest head: the scratch of every chunk fits
  for (int64_t b = 0; b < cache.batch(); ++b)
    for (int64_t hkv = 0; hkv < cache.kv_heads(); ++hkv)
      longest = std::max(longest, cache.length(b, hkv));
  WorkspaceFrame frame(context);  // the scratch below: none allocated with a workspace
  const ThreadScratch<float> scratch(
      frame, context,
      wildcat::weighted_attention_scratch_floats(std::min(N, kQueryChunk), longest, Dv));
  parallel_for(context, cache.batch() * H * chunks, [&](int64_t item) {
    const int64_t chunk = item % chunks, h = (item / chunks) % H, b = item / (chunks * H);
    const int64_t hkv = h / group;
    const int64_t first = chunk * kQueryChunk, rows = std::min(kQueryChunk, N - first);
    const auto length = cache.length(b, hkv);
    // A head filled by push() alone has no value range yet: it is not clamped.
    const bool ranged = !cache.value_min(b, hkv).empty();
    wildcat::weighted_attention_rows(
        q.row(b, first, h), q.strides[1], rows, D, cache.keys(b, hkv).data(),
        cache.log_scales(b, hkv).data(), length, cache.values(b, hkv).data(), Dv, params.beta,
        ranged ? cache.value_min(b, hkv).data() : nullptr,
        ranged ? cache.value_max(b, hkv).data() : nullptr, out.row(b, first, h), out.strides[1],
        scratch.get());
  });
}

}  // namespace cpu

int64_t KVSelection::max_entries() const {
  size_t most = 0;
  for (const Head& head : heads) most = std::max(most, head.indices.size());
  return static_cast<int64_t>(most);
}

WeightedKVCache weighted_kv_cache(View4<const float> k, View4<const float> v,
                                  const KVSelection& selection) {
  const int64_t B = k.dim(0), M = k.dim(1), Hkv = k.dim(2), Dv = v.dim(3);
  check(selection.batch == B && selection.kv_heads == Hkv && selection.value_dim == Dv,
        "selection: expected one of k [", B, ", M, ", Hkv, ", D] and value dim ", Dv, ", got [",
        selection.batch, ", ", selection.kv_heads, "] and ", selection.value_dim);
  WeightedKVCache cache(B, Hkv, k.dim(3), Dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      for (int64_t j = 0; j < M; ++j) cache.widen_range(b, hkv, v.row(b, j, hkv));
      const KVSelection::Head& head = selection.head(b, hkv);
      for (size_t i = 0; i < head.indices.size(); ++i) {
        const int64_t j = head.indices[i];
        check(j >= 0 && j < M, "selection: index ", j, " out of the ", M, " tokens");
        cache.push(b, hkv, k.row(b, j, hkv), head.values.data() + i * Dv, head.weights[i],
                   head.log_scales[i]);
      }
    }
  return cache;
}

}  // namespace subquad
