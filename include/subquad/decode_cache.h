// The decoding-cache concept of WeightedKVCache (exact, sliding and compressed KV caches,
// subquad/wildcat.h). Causal CAT and MLR decode statelessly over caller-owned state
// (cat_causal_decode, mlr_decode). What an LLM decode loop needs, with the verbs of the Python caches (python/subquad/cache.py):
//   append    add tokens to the cache without outputs (the prefill of a prompt)
//   update    append tokens, then return their outputs: out [B, T, H, Dv] are the rows of
//             the operator's causal forward over everything seen at the T new positions
//   truncate  roll back to the first `length` tokens seen
//   clone     an independent copy (branching, speculative decoding)
//   seen, memory_bytes, batch
// Compression is a verb of the caches that support it (WeightedKVCache: push, keep).
// Tokens are [B, T, ...] for B sequences decoded in lock step; every verb takes the
// Context its operator runs on.
#pragma once

#include <cstdint>
#include <memory>

#include "subquad/context.h"
#include "subquad/view.h"

namespace subquad {

// The tensors of T new tokens of B sequences: a KV cache reads k and v (append) and q
// (update).
template <typename T>
struct DecodeTokens {
  View4<const T> q;  // [B, T, H, D]   queries
  View4<const T> k;  // [B, T, Hkv, D] keys
  View4<const T> v;  // [B, T, Hkv, Dv] values
};

template <typename T>
class DecodeCache {
 public:
  using value_type = T;
  virtual ~DecodeCache() = default;

  virtual int64_t batch() const = 0;
  virtual int64_t heads() const = 0;      // H of the outputs
  virtual int64_t value_dim() const = 0;  // Dv of the outputs
  // Tokens appended so far per sequence: the position of the next token.
  virtual int64_t seen() const = 0;
  // Bytes of cache state held now (keys, values, scores, statistics; not the object).
  virtual int64_t memory_bytes() const = 0;

  virtual void append(const Context& context, const DecodeTokens<T>& tokens) = 0;
  virtual void update(const Context& context, const DecodeTokens<T>& tokens, View4<T> out) = 0;
  // Throws Error (naming `length`) when length is outside [0, seen()] or the cache no
  // longer holds what rolling back needs (a compressed cache, keys of finished blocks).
  virtual void truncate(int64_t length) = 0;
  virtual std::unique_ptr<DecodeCache<T>> clone() const = 0;
};

}  // namespace subquad
