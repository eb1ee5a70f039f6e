// Level bookkeeping shared by the MLR reference, fast kernel and decoder: rank offsets,
// block sizes, the per-column 1/r_l scale, and the validation of the public arguments.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad::mlr {

// At most 62 levels (2^(L-1) must be a size); fixed arrays, so that building the levels on
// every call allocates nothing (tests/cpp/workspace_attention_test.cpp).
inline constexpr int64_t kMaxLevels = 62;

struct Levels {
  int64_t count = 0;                                   // L
  std::array<int64_t, kMaxLevels> ranks{};             // r_l, l < L
  std::array<int64_t, kMaxLevels + 1> offsets{};       // first column of level l; offsets[L] = D
  std::array<int64_t, kMaxLevels> block_sizes{};       // T / 2^(l-1), l < L

  // Index of the level whose columns contain column c.
  int64_t level_of_column(int64_t c) const {
    int64_t l = 0;
    while (offsets[l + 1] <= c) ++l;
    return l;
  }
  // Number of levels whose block contains both positions i and j (>= 1: level 1 is global).
  int64_t shared_levels(int64_t i, int64_t j) const {
    int64_t m = 0;
    while (m < count && i / block_sizes[m] == j / block_sizes[m]) ++m;
    return m;
  }
};

// Validates ranks against head dim D and sequence length T (throws Error), returns the levels.
Levels make_levels(const std::vector<int64_t>& ranks, int64_t head_dim, int64_t tokens);

// Checks q, k, v (and out/lse when given) of MLR attention; throws Error naming the argument.
template <typename T>
void check_attention_arguments(View4<const T> q, View4<const T> k, View4<const T> v,
                               const MlrOptions& options);

// Output views: usable and of the given shape.
template <typename T, int Rank>
void check_output(const View<T, Rank>& view, const typename View<T, Rank>::Shape& expected,
                  const char* name) {
  check_view(view, name);
  check_shape(view, expected, name);
}

}  // namespace subquad::mlr
