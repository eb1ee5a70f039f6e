// Token-by-token causal CAT for B sequences (CatCausalDecoder, subquad/cat.h): each new
// token i of a sequence costs O(i Dv) per head, since every output row re-weights all
// cached values (out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]): the
// lag pairs the newest score with the oldest value). Reference: row i of
// cat_causal_forward (cat_ref.h); tested against it in cat_causal_test.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "cat/cat_common.h"
#include "subquad/cat.h"
#include "subquad/parallel.h"

namespace subquad {

template <typename T>
CatCausalDecoder<T>::CatCausalDecoder(int64_t batch, int64_t heads, int64_t value_dim)
    : batch_(batch), heads_(heads), value_dim_(value_dim) {
  check(batch >= 1, "batch: expected at least 1, got ", batch);
  check(heads >= 1, "heads: expected at least 1, got ", heads);
  check(value_dim >= 1, "value_dim: expected at least 1, got ", value_dim);
  sequences_.resize(static_cast<size_t>(batch));
}

template <typename T>
int64_t CatCausalDecoder<T>::memory_bytes() const {
  // Per sequence: z [S, H] in double, v [S, H, Dv] in T.
  return batch_ * seen_ * heads_ *
         (static_cast<int64_t>(sizeof(double)) + value_dim_ * static_cast<int64_t>(sizeof(T)));
}

template <typename T>
void CatCausalDecoder<T>::check_tokens(View3<const T> z, View4<const T> v) const {
  check_view(z, "z");
  check(z.dim(0) == batch_ && z.dim(2) == heads_, "z: expected shape [B, T, H] = [", batch_,
        ", T, ", heads_, "], got ", shape_string(z.shape));
  check_view(v, "v");
  cat_detail::expect_shape(v, {batch_, z.dim(1), heads_, value_dim_}, "v");
  // Scores and values are not scanned: a non-finite one propagates to the rows that see it,
  // as in cat_causal_forward.
}

template <typename T>
void CatCausalDecoder<T>::store(View3<const T> z, View4<const T> v) {
  const int64_t tokens = z.dim(1), H = heads_, Dv = value_dim_;
  for (int64_t b = 0; b < batch_; ++b) {
    Sequence& s = sequences_[static_cast<size_t>(b)];
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < H; ++h) s.z.push_back(z(b, t, h));
      for (int64_t h = 0; h < H; ++h) s.v.insert(s.v.end(), v.row(b, t, h), v.row(b, t, h) + Dv);
    }
  }
}

template <typename T>
void CatCausalDecoder<T>::append(const Context&, View3<const T> z, View4<const T> v) {
  check_tokens(z, v);
  store(z, v);
  seen_ += z.dim(1);
}

template <typename T>
void CatCausalDecoder<T>::update(const Context& context, View3<const T> z, View4<const T> v,
                                 View4<T> out) {
  check_tokens(z, v);
  const int64_t tokens = z.dim(1), first = seen_, H = heads_, Dv = value_dim_;
  check_view(out, "out");
  cat_detail::expect_shape(out, {batch_, tokens, H, Dv}, "out");
  store(z, v);
  seen_ += tokens;
  parallel_for(context, batch_ * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    const Sequence& s = sequences_[static_cast<size_t>(b)];
    std::vector<double> acc(static_cast<size_t>(Dv));
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t i = first + t;
      // The normaliser sum_{k <= i} exp(z[k] - max), relative to the max over k <= i.
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k <= i; ++k) max = std::max(max, s.z[k * H + h]);
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k <= i; ++k) {
        const double w = std::exp(s.z[k * H + h] - max);
        sum += w;
        const T* x = s.v.data() + ((i - k) * H + h) * Dv;
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) acc[c] += w * x[c];
      }
      T* row = out.row(b, t, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[c] / sum);
    }
  });
}

template <typename T>
void CatCausalDecoder<T>::append(const Context& context, const DecodeTokens<T>& tokens) {
  append(context, tokens.z, tokens.v);
}

template <typename T>
void CatCausalDecoder<T>::update(const Context& context, const DecodeTokens<T>& tokens,
                                 View4<T> out) {
  update(context, tokens.z, tokens.v, out);
}

template <typename T>
void CatCausalDecoder<T>::truncate(int64_t length) {
  check(length >= 0 && length <= seen_, "length: expected a value in [0, ", seen_, "], got ",
        length);
  for (Sequence& s : sequences_) {
    s.z.resize(static_cast<size_t>(length * heads_));
    s.v.resize(static_cast<size_t>(length * heads_ * value_dim_));
  }
  seen_ = length;
}

template <typename T>
std::unique_ptr<DecodeCache<T>> CatCausalDecoder<T>::clone() const {
  return std::make_unique<CatCausalDecoder<T>>(*this);
}

template class CatCausalDecoder<float>;
template class CatCausalDecoder<double>;

}  // namespace subquad
