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
#include "cat/cat_ops.h"
#include "common/parallel.h"
#include "subquad/cat.h"

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
        ", T, ", heads_, "], got ", shape_text(z.shape));
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

namespace {

// Rows first .. first + tokens - 1 of every sequence (none when tokens = 0: append) through
// the one dispatch, from the caches (the new tokens stored already).
template <typename T, typename Sequences>
void dispatch_rows(const Context& context, const Sequences& sequences, int64_t first,
                   int64_t tokens, View4<T> out) {
  std::vector<const double*> scores;
  std::vector<const T*> values;
  for (const auto& s : sequences) {
    scores.push_back(s.z.data());
    values.push_back(s.v.data());
  }
  dispatch(context, cat_detail::CatDecodeParams<T>{scores.data(), values.data(), first, tokens,
                                                   out});
}

}  // namespace

// Both verbs store the tokens, then dispatch; whatever fails after the store (no backend
// for the device) rolls the cache back.
template <typename T>
void CatCausalDecoder<T>::append(const Context& context, View3<const T> z, View4<const T> v) {
  check_tokens(z, v);
  const int64_t first = seen_;
  store(z, v);
  seen_ += z.dim(1);
  try {
    dispatch_rows(context, sequences_, first, 0, View4<T>());
  } catch (...) {
    truncate(first);
    throw;
  }
}

template <typename T>
void CatCausalDecoder<T>::update(const Context& context, View3<const T> z, View4<const T> v,
                                 View4<T> out) {
  check_tokens(z, v);
  const int64_t tokens = z.dim(1), first = seen_;
  check_view(out, "out");
  cat_detail::expect_shape(out, {batch_, tokens, heads_, value_dim_}, "out");
  store(z, v);
  seen_ += tokens;
  try {
    dispatch_rows(context, sequences_, first, tokens, out);
  } catch (...) {
    truncate(first);
    throw;
  }
}

namespace cpu {

template <typename T>
void run(Backend, const Context& context, const cat_detail::CatDecodeParams<T>& params) {
  const View4<T> out = params.out;
  const int64_t tokens = params.tokens, first = params.first;
  if (tokens == 0) return;
  const int64_t B = out.dim(0), H = out.dim(2), Dv = out.dim(3);
  WorkspaceFrame frame(context);  // the accumulators: none allocated with a workspace
  cat_detail::ThreadScratch<double> acc_scratch(frame, thread_count(context), Dv);  // [Dv]
  parallel_for(context, B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    const double* z = params.z[b];  // [first + tokens, H]
    const T* v = params.v[b];       // [first + tokens, H, Dv]
    double* acc = acc_scratch.get();
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t i = first + t;
      // The normaliser sum_{k <= i} exp(z[k] - max), relative to the max over k <= i.
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k <= i; ++k) max = std::max(max, z[k * H + h]);
      double sum = 0;
      std::fill(acc, acc + Dv, 0.0);
      for (int64_t k = 0; k <= i; ++k) {
        const double w = std::exp(z[k * H + h] - max);
        sum += w;
        const T* x = v + ((i - k) * H + h) * Dv;
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) acc[c] += w * x[c];
      }
      T* row = out.row(b, t, h);
      for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<T>(acc[c] / sum);
    }
  });
}

template void run<float>(Backend, const Context&, const cat_detail::CatDecodeParams<float>&);
template void run<double>(Backend, const Context&, const cat_detail::CatDecodeParams<double>&);

}  // namespace cpu

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
