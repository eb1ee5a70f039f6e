// Incremental causal decoding of MLR attention with a per-level key cache: level l holds
// the keys (its r_l columns) of the current level-l block only, so the cache peaks at
// T sum_l r_l / 2^(l-1) floats per kv head; values are kept for all tokens. One token costs
// O(sum_l r_l (t mod s_l) + t Dv) per head. Reference: the causal rows of mlr_ref.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "common/parallel.h"
#include "structured/mlr_levels.h"
#include "structured/structured_ops.h"
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
  offsets_.assign(levels.offsets.begin(), levels.offsets.begin() + levels.count + 1);
  block_sizes_.assign(levels.block_sizes.begin(), levels.block_sizes.begin() + levels.count);
  options_.causal = true;
  for (int64_t l = 0; l < levels.count; ++l)
    keys_.emplace_back(static_cast<size_t>(batch * kv_heads * block_sizes_[l] * levels.ranks[l]));
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
int64_t MlrDecoder<T>::memory_bytes() const {
  // The level caches are allocated for a whole block; the values grow with the tokens.
  int64_t floats = static_cast<int64_t>(values_.size());
  for (const std::vector<T>& level : keys_) floats += static_cast<int64_t>(level.size());
  return floats * static_cast<int64_t>(sizeof(T));
}

template <typename T>
void MlrDecoder<T>::check_tokens(View4<const T> k, View4<const T> v) const {
  check_view(k, "k");
  check_view(v, "v");
  const int64_t tokens = k.dim(1);
  check_shape(k, {batch_, tokens, kv_heads_, head_dim_}, "k (expected [B, T, Hkv, D])");
  check_shape(v, {batch_, tokens, kv_heads_, value_dim_}, "v (expected [B, T, Hkv, Dv])");
  check(position_ + tokens <= context_, "k: ", tokens, " more tokens exceed the context of ",
        context_, " (", position_, " seen)");
}

template <typename T>
void MlrDecoder<T>::store(View4<const T> k, View4<const T> v, int64_t token) {
  // Slot t mod s_l of level l; a new block simply overwrites from 0. Values: [S, B, Hkv, Dv].
  const int64_t t = position_, L = static_cast<int64_t>(block_sizes_.size()), Dv = value_dim_;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t hk = 0; hk < kv_heads_; ++hk) {
      const T* key = k.row(b, token, hk);
      for (int64_t l = 0; l < L; ++l) {
        const int64_t r = offsets_[l + 1] - offsets_[l];
        T* slot =
            keys_[l].data() + ((b * kv_heads_ + hk) * block_sizes_[l] + t % block_sizes_[l]) * r;
        std::copy(key + offsets_[l], key + offsets_[l + 1], slot);
      }
      values_.insert(values_.end(), v.row(b, token, hk), v.row(b, token, hk) + Dv);
    }
  ++position_;
}

template <typename T>
void MlrDecoder<T>::attend_newest(const Context& context, View4<const T> q, int64_t token,
                                  View4<T> out) const {
  std::vector<const T*> keys;
  for (const std::vector<T>& level : keys_) keys.push_back(level.data());
  dispatch(context, mlr::MlrDecodeParams<T>{keys.data(), offsets_.data(), block_sizes_.data(),
                                            static_cast<int64_t>(block_sizes_.size()),
                                            values_.data(), kv_heads_, position_ - 1, token,
                                            options_.block_divide, q, out});
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const mlr::MlrDecodeParams<T>& params) {
  const View4<const T> q = params.q;
  const View4<T> out = params.out;
  const int64_t t = params.t, L = params.levels, token = params.token;
  const int64_t B = out.dim(0), H = out.dim(2), Dv = out.dim(3), Hkv = params.kv_heads;
  const int64_t group = H / Hkv;
  const int64_t* offsets = params.offsets;
  parallel_for(context, B * H, [&](int64_t task) {
    const int64_t h = task % H, b = task / H, hk = h / group;
    std::vector<T> scores(static_cast<size_t>(t + 1), T(0));
    std::vector<int64_t> shared(static_cast<size_t>(t + 1), 0);
    const T* query = q.row(b, token, h);
    for (int64_t l = 0; l < L; ++l) {
      const int64_t size = params.block_sizes[l], r = offsets[l + 1] - offsets[l];
      const int64_t start = t - t % size;  // first position of the current level-l block
      const T* cache = params.keys[l] + (b * Hkv + hk) * size * r;
      for (int64_t j = start; j <= t; ++j) {
        const T* key = cache + (j - start) * r;
        T dot = 0;
        for (int64_t c = 0; c < r; ++c) dot += query[offsets[l] + c] * key[c];
        scores[j] += dot / static_cast<T>(r);
        ++shared[j];
      }
    }
    if (params.block_divide)
      for (int64_t j = 0; j <= t; ++j) scores[j] /= static_cast<T>(shared[j]);
    const T row_max = *std::max_element(scores.begin(), scores.end());
    T sum = 0;
    for (T& s : scores) sum += (s = std::exp(s - row_max));
    T* o = out.row(b, token, h);
    std::fill(o, o + Dv, T(0));
    for (int64_t j = 0; j <= t; ++j) {
      const T p = scores[j] / sum;
      const T* value = params.values + ((j * B + b) * Hkv + hk) * Dv;
      for (int64_t c = 0; c < Dv; ++c) o[c] += p * value[c];
    }
  });
}

template void run<float>(Backend, const Context&, const mlr::MlrDecodeParams<float>&);
template void run<double>(Backend, const Context&, const mlr::MlrDecodeParams<double>&);

}  // namespace cpu

template <typename T>
void MlrDecoder<T>::append(const Context&, View4<const T> k, View4<const T> v) {
  check_tokens(k, v);
  for (int64_t token = 0; token < k.dim(1); ++token) store(k, v, token);
}

template <typename T>
void MlrDecoder<T>::update(const Context& context, View4<const T> q, View4<const T> k,
                           View4<const T> v, View4<T> out) {
  check_tokens(k, v);
  const int64_t tokens = k.dim(1);
  check_view(q, "q");
  check_view(out, "out");
  check_shape(q, {batch_, tokens, heads_, head_dim_}, "q (expected [B, T, H, D])");
  check_shape(out, {batch_, tokens, heads_, value_dim_}, "out (expected [B, T, H, Dv])");
  // The key slots the first store overwrites: restored when its attend is refused (no
  // backend for the device), so that a refused update leaves the cache as it was.
  std::vector<T> overwritten;
  const auto slot = [&](size_t l, int64_t bk) {
    const int64_t r = offsets_[l + 1] - offsets_[l];
    return keys_[l].data() + (bk * block_sizes_[l] + position_ % block_sizes_[l]) * r;
  };
  for (size_t l = 0; l < keys_.size(); ++l)
    for (int64_t bk = 0; bk < batch_ * kv_heads_; ++bk)
      overwritten.insert(overwritten.end(), slot(l, bk),
                         slot(l, bk) + offsets_[l + 1] - offsets_[l]);
  // Token by token: a token's level caches hold only its current blocks.
  for (int64_t token = 0; token < tokens; ++token) {
    store(k, v, token);
    try {
      attend_newest(context, q, token, out);
    } catch (...) {
      if (token == 0) {
        --position_;
        values_.resize(static_cast<size_t>(batch_ * kv_heads_ * position_ * value_dim_));
        const T* saved = overwritten.data();
        for (size_t l = 0; l < keys_.size(); ++l)
          for (int64_t bk = 0; bk < batch_ * kv_heads_; ++bk) {
            const int64_t r = offsets_[l + 1] - offsets_[l];
            std::copy(saved, saved + r, slot(l, bk));
            saved += r;
          }
      }
      throw;
    }
  }
}

template <typename T>
void MlrDecoder<T>::append(const Context& context, const DecodeTokens<T>& tokens) {
  append(context, tokens.k, tokens.v);
}

template <typename T>
void MlrDecoder<T>::update(const Context& context, const DecodeTokens<T>& tokens, View4<T> out) {
  update(context, tokens.q, tokens.k, tokens.v, out);
}

template <typename T>
void MlrDecoder<T>::truncate(int64_t length) {
  check(length >= 0 && length <= position_, "length: expected a value in [0, ", position_,
        "], got ", length);
  // The finest level's blocks are the shortest: if the newest kept token is in the same
  // finest block as the newest seen one, every level still holds its keys.
  const int64_t finest = block_sizes_.back();
  check(length == 0 || length == position_ || (length - 1) / finest == (position_ - 1) / finest,
        "length: ", length, " rolls back past the start of the current level block (tokens ",
        (position_ - 1) / finest * finest, " .. ", position_ - 1,
        "), whose earlier keys the level caches no longer hold");
  values_.resize(static_cast<size_t>(length * batch_ * kv_heads_ * value_dim_));
  position_ = length;
}

template <typename T>
std::unique_ptr<DecodeCache<T>> MlrDecoder<T>::clone() const {
  return std::make_unique<MlrDecoder<T>>(*this);
}

template class MlrDecoder<float>;
template class MlrDecoder<double>;

}  // namespace subquad
