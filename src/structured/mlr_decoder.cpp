// Incremental causal decoding of MLR attention with a per-level key cache: level l holds
// the keys (its r_l columns) of the current level-l block only, so the cache peaks at
// T sum_l r_l / 2^(l-1) floats per kv head; values are kept for all tokens. One step costs
// O(sum_l r_l (t mod s_l) + t Dv) per head. Reference: the causal rows of mlr_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "structured/mlr_levels.h"
#include "subquad/parallel.h"
#include "subquad/structured.h"

namespace subquad {

template <typename T>
MlrDecoder<T>::MlrDecoder(int64_t batch, int64_t heads, int64_t kv_heads, int64_t value_dim,
                          int64_t context, MlrOptions options)
    : batch_(batch),
      heads_(heads),
      kv_heads_(kv_heads),
      value_dim_(value_dim),
      context_(context),
      options_(std::move(options)) {
  check(batch >= 1, "batch: expected >= 1, got ", batch);
  check(kv_heads >= 1 && heads >= 1 && heads % kv_heads == 0,
        "kv_heads: expected a divisor of heads = ", heads, ", got ", kv_heads);
  check(value_dim >= 1, "value_dim: expected >= 1, got ", value_dim);
  check(context >= 1, "context: expected >= 1, got ", context);
  int64_t head_dim = 0;
  for (int64_t r : options_.ranks) head_dim += r;
  head_dim_ = head_dim;
  const mlr::Levels levels = mlr::make_levels(options_.ranks, head_dim, context);
  offsets_ = levels.offsets;
  block_sizes_ = levels.block_sizes;
  options_.causal = true;
  for (int64_t l = 0; l < levels.count; ++l)
    keys_.emplace_back(static_cast<size_t>(batch * kv_heads * block_sizes_[l] * levels.ranks[l]));
  values_.resize(static_cast<size_t>(batch * kv_heads * context * value_dim));
}

template <typename T>
int64_t MlrDecoder<T>::key_cache_floats() const {
  if (position_ == 0) return 0;
  int64_t floats = 0;
  const int64_t last = position_ - 1;  // the newest token sets which blocks are current
  for (size_t l = 0; l < block_sizes_.size(); ++l)
    floats += (last % block_sizes_[l] + 1) * (offsets_[l + 1] - offsets_[l]);
  return floats * batch_ * kv_heads_;
}

template <typename T>
void MlrDecoder<T>::step(const Context& context, View3<const T> q, View3<const T> k,
                         View3<const T> v, View3<T> out) {
  check(position_ < context_, "step: the context of ", context_, " tokens is full");
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  check_view(out, "out");
  check_shape(q, {batch_, heads_, head_dim_}, "q");
  check_shape(k, {batch_, kv_heads_, head_dim_}, "k");
  check_shape(v, {batch_, kv_heads_, value_dim_}, "v");
  check_shape(out, {batch_, heads_, value_dim_}, "out");
  const int64_t t = position_, L = static_cast<int64_t>(block_sizes_.size());
  const int64_t Dv = value_dim_, group = heads_ / kv_heads_;

  // Store the new token: slot t mod s_l of level l; a new block simply overwrites from 0.
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t hk = 0; hk < kv_heads_; ++hk) {
      for (int64_t l = 0; l < L; ++l) {
        const int64_t r = offsets_[l + 1] - offsets_[l];
        T* slot = keys_[l].data() + ((b * kv_heads_ + hk) * block_sizes_[l] + t % block_sizes_[l]) * r;
        std::copy(k.row(b, hk) + offsets_[l], k.row(b, hk) + offsets_[l + 1], slot);
      }
      std::copy(v.row(b, hk), v.row(b, hk) + Dv,
                values_.data() + ((b * kv_heads_ + hk) * context_ + t) * Dv);
    }

  parallel_for(context, batch_ * heads_, [&](int64_t task) {
    const int64_t h = task % heads_, b = task / heads_, hk = h / group;
    std::vector<T> scores(static_cast<size_t>(t + 1), T(0));
    std::vector<int64_t> shared(static_cast<size_t>(t + 1), 0);
    const T* query = q.row(b, h);
    for (int64_t l = 0; l < L; ++l) {
      const int64_t size = block_sizes_[l], r = offsets_[l + 1] - offsets_[l];
      const int64_t start = t - t % size;  // first position of the current level-l block
      const T* cache = keys_[l].data() + (b * kv_heads_ + hk) * size * r;
      for (int64_t j = start; j <= t; ++j) {
        const T* key = cache + (j - start) * r;
        T dot = 0;
        for (int64_t c = 0; c < r; ++c) dot += query[offsets_[l] + c] * key[c];
        scores[j] += dot / static_cast<T>(r);
        ++shared[j];
      }
    }
    if (options_.block_divide)
      for (int64_t j = 0; j <= t; ++j) scores[j] /= static_cast<T>(shared[j]);
    const T row_max = *std::max_element(scores.begin(), scores.end());
    T sum = 0;
    for (T& s : scores) sum += (s = std::exp(s - row_max));
    T* o = out.row(b, h);
    std::fill(o, o + Dv, T(0));
    const T* value = values_.data() + (b * kv_heads_ + hk) * context_ * Dv;
    for (int64_t j = 0; j <= t; ++j) {
      const T p = scores[j] / sum;
      for (int64_t c = 0; c < Dv; ++c) o[c] += p * value[j * Dv + c];
    }
  });
  ++position_;
}

template class MlrDecoder<float>;
template class MlrDecoder<double>;

}  // namespace subquad
