// merge_attention: attention over two disjoint key sets, merged through their lse, equals
// attention over the concatenated keys; empty parts (lse = -inf) contribute nothing. Its
// backward: the float64 reference against finite differences, the fast path against the
// reference (float64 and float32), with and without each incoming gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "exact/exact_test_util.h"

namespace subquad::testing {
namespace {

// Keys [0, split) and [split, M) of `whole`, as two problems over the same queries.
template <typename T>
Inputs<T> key_part(const AttentionShape& whole, const Inputs<T>& x, int64_t begin,
                   int64_t end) {
  Inputs<T> part{x.q, {}, {}, x.dout, x.dlse};
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
  const Forward<double> empty = merged(none, Inputs<double>{x.q, {}, {}, x.dout, x.dlse}, 0, false);
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

// Two parts of one merge and the incoming gradients, [B, N, H, Dv] rows and [B, H, N]
// statistics; some lse_b entries are -inf (a part that saw no key), one row in both parts.
struct MergeProblem {
  int64_t B, N, H, Dv;
  std::vector<double> out_a, lse_a, out_b, lse_b, dout, dlse;

  MergeProblem(int64_t b, int64_t n, int64_t h, int64_t dv, uint64_t seed)
      : B(b), N(n), H(h), Dv(dv),
        out_a(random_vector<double>(b * n * h * dv, seed, -1, 1)),
        lse_a(random_vector<double>(b * h * n, seed + 1, -2, 2)),
        out_b(random_vector<double>(b * n * h * dv, seed + 2, -1, 1)),
        lse_b(random_vector<double>(b * h * n, seed + 3, -2, 2)),
        dout(random_vector<double>(b * n * h * dv, seed + 4, -1, 1)),
        dlse(random_vector<double>(b * h * n, seed + 5, -1, 1)) {
    constexpr double minus_inf = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < lse_b.size(); i += 5) lse_b[i] = minus_inf;
    lse_a[3] = lse_b[3] = minus_inf;
  }
  template <typename T>
  View4<const T> rows(const std::vector<T>& x) const {
    return View4<const T>(x.data(), {B, N, H, Dv});
  }
  template <typename T>
  View3<const T> stats(const std::vector<T>& x) const {
    return View3<const T>(x.data(), {B, H, N});
  }
};

template <typename T>
struct MergeGradients {
  std::vector<T> dout_a, dlse_a, dout_b, dlse_b;
};

// The merge's gradients at precision T from the fast path or the reference.
template <typename T>
MergeGradients<T> merge_gradients(const MergeProblem& p, bool fast, bool with_dout,
                                  bool with_dlse) {
  const std::vector<T> out_a = cast_vector<T>(p.out_a), lse_a = cast_vector<T>(p.lse_a);
  const std::vector<T> out_b = cast_vector<T>(p.out_b), lse_b = cast_vector<T>(p.lse_b);
  const std::vector<T> dout = cast_vector<T>(p.dout), dlse = cast_vector<T>(p.dlse);
  std::vector<T> out(out_a.size()), lse(lse_a.size());
  merge_attention_reference<T>(p.rows(out_a), p.stats(lse_a), p.rows(out_b), p.stats(lse_b),
                               View4<T>(out.data(), {p.B, p.N, p.H, p.Dv}),
                               View3<T>(lse.data(), {p.B, p.H, p.N}));
  MergeGradients<T> g{std::vector<T>(out.size()), std::vector<T>(lse.size()),
                      std::vector<T>(out.size()), std::vector<T>(lse.size())};
  const auto gout = with_dout ? p.rows(dout) : View4<const T>();
  const auto glse = with_dlse ? p.stats(dlse) : View3<const T>();
  const View4<T> dout_a(g.dout_a.data(), {p.B, p.N, p.H, p.Dv});
  const View4<T> dout_b(g.dout_b.data(), {p.B, p.N, p.H, p.Dv});
  const View3<T> dlse_a(g.dlse_a.data(), {p.B, p.H, p.N});
  const View3<T> dlse_b(g.dlse_b.data(), {p.B, p.H, p.N});
  if (fast)
    merge_attention_backward<T>(Context{Device::cpu, 2}, p.rows(out_a), p.stats(lse_a),
                                p.rows(out_b), p.stats(lse_b), p.rows(out), p.stats(lse), gout,
                                glse, dout_a, dlse_a, dout_b, dlse_b);
  else
    merge_attention_reference_backward<T>(p.rows(out_a), p.stats(lse_a), p.rows(out_b),
                                          p.stats(lse_b), p.rows(out), p.stats(lse), gout, glse,
                                          dout_a, dlse_a, dout_b, dlse_b);
  return g;
}

// loss = sum(out * dout) + sum(lse * dlse) over the rows with a finite lse.
double merge_loss(const MergeProblem& p) {
  std::vector<double> out(p.out_a.size()), lse(p.lse_a.size());
  merge_attention_reference<double>(p.rows(p.out_a), p.stats(p.lse_a), p.rows(p.out_b),
                                    p.stats(p.lse_b),
                                    View4<double>(out.data(), {p.B, p.N, p.H, p.Dv}),
                                    View3<double>(lse.data(), {p.B, p.H, p.N}));
  double total = 0;
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * p.dout[i];
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isfinite(lse[i])) total += lse[i] * p.dlse[i];
  return total;
}

TEST(MergeAttentionReferenceBackward, MatchesFiniteDifferences) {
  const MergeProblem p(2, 5, 3, 7, 51);
  const MergeGradients<double> g = merge_gradients<double>(p, false, true, true);
  auto check = [&](std::vector<double> MergeProblem::*member, const std::vector<double>& grad,
                   const char* name) {
    // A -inf lse stays -inf under a finite step: its gradient is 0, not a number to compare.
    std::vector<double> numeric = finite_difference_gradient(
        p.*member, [&](const std::vector<double>& values) {
          MergeProblem q = p;
          q.*member = values;
          return merge_loss(q);
        });
    for (double& x : numeric)
      if (!std::isfinite(x)) x = 0;
    EXPECT_LE(max_abs_diff(grad, numeric), 1e-8 * (1 + max_abs(numeric))) << name;
    EXPECT_GT(max_abs(grad), 0.0) << name;
  };
  check(&MergeProblem::out_a, g.dout_a, "dout_a");
  check(&MergeProblem::lse_a, g.dlse_a, "dlse_a");
  check(&MergeProblem::out_b, g.dout_b, "dout_b");
  check(&MergeProblem::lse_b, g.dlse_b, "dlse_b");
  for (size_t i = 0; i < p.lse_b.size(); i += 5) EXPECT_EQ(g.dlse_b[i], 0.0) << i;
}

TEST(MergeAttentionBackward, MatchesReference) {
  const MergeProblem p(2, 97, 3, 59, 52);
  for (bool with_dout : {false, true})
    for (bool with_dlse : {false, true}) {
      const MergeGradients<double> ref = merge_gradients<double>(p, false, with_dout, with_dlse);
      const MergeGradients<double> fast = merge_gradients<double>(p, true, with_dout, with_dlse);
      // The same arithmetic in the same order: equal to the last bit up to the exp/log calls.
      const double tolerance = 64 * std::numeric_limits<double>::epsilon();
      EXPECT_LE(max_abs_diff(fast.dout_a, ref.dout_a), tolerance);
      EXPECT_LE(max_abs_diff(fast.dout_b, ref.dout_b), tolerance);
      EXPECT_LE(max_abs_diff(fast.dlse_a, ref.dlse_a), tolerance * (1 + max_abs(ref.dlse_a)));
      EXPECT_LE(max_abs_diff(fast.dlse_b, ref.dlse_b), tolerance * (1 + max_abs(ref.dlse_b)));
      if (with_dout || with_dlse) {
        EXPECT_GT(max_abs(fast.dlse_a), 0.0);
      }
      if (with_dout) {
        EXPECT_GT(max_abs(fast.dout_a), 0.0);
      } else {
        EXPECT_EQ(max_abs(fast.dout_a), 0.0);
      }
      const MergeGradients<float> ref32 = merge_gradients<float>(p, false, with_dout, with_dlse);
      const MergeGradients<float> fast32 = merge_gradients<float>(p, true, with_dout, with_dlse);
      expect_close_to_reference(fast32.dout_a, ref32.dout_a, ref.dout_a);
      expect_close_to_reference(fast32.dlse_b, ref32.dlse_b, ref.dlse_b);
    }
}

TEST(MergeAttentionBackward, RejectsMismatchedGradients) {
  const MergeProblem p(1, 4, 2, 3, 53);
  std::vector<double> out(p.out_a.size()), lse(p.lse_a.size()), small(p.lse_a.size() - 1);
  const View4<double> rows(out.data(), {p.B, p.N, p.H, p.Dv});
  const View3<double> stats(lse.data(), {p.B, p.H, p.N});
  auto call = [&](View3<const double> dlse, View3<double> dlse_b) {
    merge_attention_backward<double>(Context{}, p.rows(p.out_a), p.stats(p.lse_a),
                                     p.rows(p.out_b), p.stats(p.lse_b), rows, stats,
                                     p.rows(p.dout), dlse, rows, stats, rows, dlse_b);
  };
  EXPECT_NO_THROW(call(p.stats(p.dlse), stats));
  EXPECT_THROW(call(View3<const double>(small.data(), {p.B, p.H, p.N - 1}), stats), Error);
  EXPECT_THROW(call(p.stats(p.dlse), View3<double>(small.data(), {p.B, p.H, p.N - 1})), Error);
}

}  // namespace
}  // namespace subquad::testing
