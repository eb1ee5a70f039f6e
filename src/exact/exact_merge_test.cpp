// merge_attention: attention over two disjoint key sets, merged through their lse, equals
// attention over the concatenated keys; empty parts (lse = -inf) contribute nothing.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "exact/exact_test_util.h"

namespace subquad::testing {
namespace {

// Keys [0, split) and [split, M) of `whole`, as two problems over the same queries.
template <typename T>
Inputs<T> key_part(const AttentionShape& whole, const Inputs<T>& x, int64_t begin,
                   int64_t end) {
  Inputs<T> part{x.q, {}, {}, x.dout};
  for (int64_t b = 0; b < whole.B; ++b)
    for (int64_t j = begin; j < end; ++j) {
      const int64_t row = b * whole.M + j;
      part.k.insert(part.k.end(), x.k.begin() + row * whole.Hkv * whole.D,
                    x.k.begin() + (row + 1) * whole.Hkv * whole.D);
      part.v.insert(part.v.end(), x.v.begin() + row * whole.Hkv * whole.Dv,
                    x.v.begin() + (row + 1) * whole.Hkv * whole.Dv);
    }
  return part;
}

template <typename T>
Forward<T> merged(const AttentionShape& s, const Inputs<T>& x, int64_t split,
                  bool in_place) {
  AttentionShape first = s, second = s;
  first.M = split;
  second.M = s.M - split;
  Forward<T> a = run_forward(first, key_part(s, x, 0, split), true);
  const Forward<T> b = run_forward(second, key_part(s, x, split, s.M), true);
  Forward<T> m{std::vector<T>(s.out_size()), std::vector<T>(s.lse_size())};
  T* out = in_place ? a.out.data() : m.out.data();
  T* lse = in_place ? a.lse.data() : m.lse.data();
  merge_attention<T>(Context{Device::cpu, 2}, out_view(s, a.out),
                     View3<const T>(a.lse.data(), {s.B, s.H, s.N}), out_view(s, b.out),
                     View3<const T>(b.lse.data(), {s.B, s.H, s.N}),
                     View4<T>(out, {s.B, s.N, s.H, s.Dv}), View3<T>(lse, {s.B, s.H, s.N}));
  return in_place ? a : m;
}

TEST(MergeAttention, EqualsAttentionOverConcatenatedKeys) {
  const AttentionShape s{2, 37, 97, 6, 3, 16, 24};
  const Inputs<double> x = make_inputs(s, 41);
  const Forward<double> whole = run_forward(s, x, true);
  for (int64_t split : {1, 40, 96}) {
    for (bool in_place : {false, true}) {
      const Forward<double> m = merged(s, x, split, in_place);
      EXPECT_LE(max_abs_diff(m.out, whole.out), 1e-13) << "split " << split;
      EXPECT_LE(max_abs_diff(m.lse, whole.lse), 1e-13) << "split " << split;
    }
  }
  const Inputs<float> x32 = cast_inputs<float>(x);
  const Forward<float> m32 = merged(s, x32, 40, false);
  EXPECT_LE(max_abs_diff(m32.out, whole.out), 1e-5);
}

TEST(MergeAttention, EmptyPartContributesNothing) {
  const AttentionShape s{1, 9, 13, 2, 1, 8, 8};
  const Inputs<double> x = make_inputs(s, 42);
  const Forward<double> whole = run_forward(s, x, true);
  const Forward<double> m = merged(s, x, 0, false);  // first part has no keys
  EXPECT_EQ(m.out, whole.out);
  EXPECT_EQ(m.lse, whole.lse);
  // Both parts empty: zeros and -inf.
  AttentionShape none = s;
  none.M = 0;
  const Forward<double> empty = merged(none, Inputs<double>{x.q, {}, {}, x.dout}, 0, false);
  for (double o : empty.out) EXPECT_EQ(o, 0.0);
  for (double l : empty.lse) EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
}

TEST(MergeAttention, RejectsMismatchedShapes) {
  std::vector<float> a(2 * 3 * 4 * 5), l(2 * 4 * 3), bad(2 * 4 * 4);
  const View4<const float> out(a.data(), {2, 3, 4, 5});
  const View3<const float> lse(l.data(), {2, 4, 3});
  EXPECT_THROW(merge_attention<float>(Context{}, out, lse, out, View3<const float>(bad.data(), {2, 4, 4}),
                                      View4<float>(a.data(), {2, 3, 4, 5}),
                                      View3<float>(l.data(), {2, 4, 3})),
               Error);
  EXPECT_THROW(merge_attention<float>(Context{}, out, lse, View4<const float>(a.data(), {2, 3, 4, 4}),
                                      lse, View4<float>(a.data(), {2, 3, 4, 5}),
                                      View3<float>(l.data(), {2, 4, 3})),
               Error);
}

}  // namespace
}  // namespace subquad::testing
