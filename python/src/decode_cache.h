// The Python wrapper of a DecodeCache (include/subquad/decode_cache.h), the weighted KV
// cache: the verbs update, append, truncate, clone and the properties seen, memory_bytes,
// batch, with the same names as the Python caches (python/subquad/cache.py). Token arrays
// are keyword arguments (q, k, v).
#pragma once

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "arrays.h"
#include "subquad/decode_cache.h"

namespace subquad::python {

// The token arrays of one call; absent ones are None.
struct TokenArrays {
  std::optional<Array> q, k, v;
};

// Checks that the given arrays have dtype T and returns their views.
template <typename T>
DecodeTokens<T> token_views(const TokenArrays& arrays) {
  std::vector<Named> given;
  if (arrays.q) given.push_back({*arrays.q, "q"});
  if (arrays.k) given.push_back({*arrays.k, "k"});
  if (arrays.v) given.push_back({*arrays.v, "v"});
  check(!given.empty(), "v: expected the tokens' arrays (q, k, v), got none");
  const Scalar expected = sizeof(T) == 4 ? Scalar::f32 : Scalar::f64;
  check(common_scalar(given) == expected, given.front().name, ": expected the cache's dtype ",
        sizeof(T) == 4 ? "float32" : "float64");
  DecodeTokens<T> tokens;
  if (arrays.q) tokens.q = input<T, 4>(*arrays.q, "q");
  if (arrays.k) tokens.k = input<T, 4>(*arrays.k, "k");
  if (arrays.v) tokens.v = input<T, 4>(*arrays.v, "v");
  return tokens;
}

// The number of new tokens T: dimension 1 of any given array.
inline int64_t token_count(const TokenArrays& arrays) {
  for (const std::optional<Array>* a : {&arrays.v, &arrays.k, &arrays.q})
    if (*a && (*a)->ndim() >= 2) return int64_t((*a)->shape(1));
  return 0;
}

template <typename T>
ArrayResult update_cache(DecodeCache<T>& cache, const TokenArrays& arrays, int64_t threads) {
  const Context context = context_for(threads);
  const DecodeTokens<T> tokens = token_views<T>(arrays);
  Output<T, 4> out({cache.batch(), token_count(arrays),
                    tokens.q.empty() ? cache.heads() : tokens.q.dim(2), cache.value_dim()});
  {
    nb::gil_scoped_release release;
    cache.update(context, tokens, out.view());
  }
  return out.release();
}

template <typename T>
void append_cache(DecodeCache<T>& cache, const TokenArrays& arrays, int64_t threads) {
  const Context context = context_for(threads);
  const DecodeTokens<T> tokens = token_views<T>(arrays);
  nb::gil_scoped_release release;
  cache.append(context, tokens);
}

// A cache of one of several C++ types (Decoder<float> or Decoder<double>).
template <typename... Caches>
class CacheVariant {
 public:
  template <typename Cache>
  explicit CacheVariant(Cache cache) : cache_(std::move(cache)) {}

  template <typename F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), cache_);
  }
  template <typename F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), cache_);
  }

 private:
  std::variant<Caches...> cache_;
};

// The C++ cache behind a Python object: the object itself, or the alternative a
// CacheVariant holds.
template <typename Object, typename F>
decltype(auto) with_cache(Object& object, F&& f) {
  if constexpr (requires { object.visit(f); })
    return object.visit(std::forward<F>(f));
  else
    return f(object);
}

// "float32" -> float, "float64" -> double, for the decoders' constructors.
inline bool is_float32(const std::string& dtype) {
  check(dtype == "float32" || dtype == "float64",
        "dtype: expected \"float32\" or \"float64\", got \"", dtype, "\"");
  return dtype == "float32";
}

// Adds the shared verbs to the Python class of `Object` (a cache or a CacheVariant).
template <typename Object>
void bind_decode_verbs(nb::class_<Object>& cls, const char* update_doc) {
  using namespace nb::literals;
  cls.def(
         "update",
         [](Object& object, std::optional<Array> q, std::optional<Array> k,
            std::optional<Array> v, int64_t threads) {
           const TokenArrays arrays{std::move(q), std::move(k), std::move(v)};
           return with_cache(object, [&](auto& cache) {
             return update_cache(cache, arrays, threads);
           });
         },
         nb::kw_only(), "q"_a = nb::none(), "k"_a = nb::none(), "v"_a = nb::none(),
         "threads"_a = 0, update_doc)
      .def(
          "append",
          [](Object& object, std::optional<Array> q, std::optional<Array> k,
             std::optional<Array> v, int64_t threads) {
            const TokenArrays arrays{std::move(q), std::move(k), std::move(v)};
            with_cache(object, [&](auto& cache) { append_cache(cache, arrays, threads); });
          },
          nb::kw_only(), "q"_a = nb::none(), "k"_a = nb::none(), "v"_a = nb::none(),
          "threads"_a = 0,
          "Adds T tokens without outputs (the prefill of a prompt); the arrays as update.")
      .def(
          "truncate",
          [](Object& object, int64_t length) {
            with_cache(object, [&](auto& cache) { cache.truncate(length); });
          },
          "length"_a, "Rolls back to the first `length` tokens seen (ValueError when the cache "
          "no longer holds what that needs).")
      .def(
          "clone", [](const Object& object) { return Object(object); },
          "An independent copy of the cache.")
      .def_prop_ro(
          "seen",
          [](const Object& object) {
            return with_cache(object, [](const auto& cache) { return cache.seen(); });
          },
          "Tokens appended so far: the position of the next token.")
      .def_prop_ro(
          "memory_bytes",
          [](const Object& object) {
            return with_cache(object, [](const auto& cache) { return cache.memory_bytes(); });
          },
          "Bytes of cache state held now.")
      .def_prop_ro("batch", [](const Object& object) {
        return with_cache(object, [](const auto& cache) { return cache.batch(); });
      });
}

}  // namespace subquad::python
