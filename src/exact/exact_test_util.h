// Test helpers for exact attention: problem shapes, seeded inputs and runners of the fast
// path and of the reference (exact_ref.h) returning plain vectors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "common/test_support.h"
#include "exact/exact_ref.h"
#include "subquad/exact.h"

namespace subquad::testing {

struct AttentionShape {
  int64_t B, N, M, H, Hkv, D, Dv;
  bool causal = false;
  int64_t window = 0;

  ExactOptions options() const {
    ExactOptions o;
    o.causal = causal;
    o.window = window;
    return o;
  }
  int64_t q_size() const { return B * N * H * D; }
  int64_t k_size() const { return B * M * Hkv * D; }
  int64_t v_size() const { return B * M * Hkv * Dv; }
  int64_t out_size() const { return B * N * H * Dv; }
  int64_t lse_size() const { return B * H * N; }
};

inline std::ostream& operator<<(std::ostream& os, const AttentionShape& s) {
  return os << "B" << s.B << "_N" << s.N << "_M" << s.M << "_H" << s.H << "_Hkv" << s.Hkv
            << "_D" << s.D << "_Dv" << s.Dv << (s.causal ? "_causal" : "") << "_w"
            << s.window;
}

template <typename T>
struct Inputs {
  std::vector<T> q, k, v, dout;
  std::vector<T> dlse;  // [B, H, N]; empty: no gradient reaches lse
};

// Uniform inputs in [-2, 2) (scores of a few units: a peaked softmax) from a seed.
inline Inputs<double> make_inputs(const AttentionShape& s, uint64_t seed) {
  return {random_vector<double>(s.q_size(), seed, -2, 2),
          random_vector<double>(s.k_size(), seed + 1, -2, 2),
          random_vector<double>(s.v_size(), seed + 2, -2, 2),
          random_vector<double>(s.out_size(), seed + 3, -1, 1),
          random_vector<double>(s.lse_size(), seed + 4, -1, 1)};
}

template <typename T>
Inputs<T> cast_inputs(const Inputs<double>& x) {
  return {cast_vector<T>(x.q), cast_vector<T>(x.k), cast_vector<T>(x.v), cast_vector<T>(x.dout),
          cast_vector<T>(x.dlse)};
}

template <typename T>
struct Forward {
  std::vector<T> out, lse;
};
template <typename T>
struct Backward {
  std::vector<T> dq, dk, dv;
};

template <typename T>
View4<const T> q_view(const AttentionShape& s, const std::vector<T>& q) {
  return View4<const T>(q.data(), {s.B, s.N, s.H, s.D});
}
template <typename T>
View4<const T> k_view(const AttentionShape& s, const std::vector<T>& k) {
  return View4<const T>(k.data(), {s.B, s.M, s.Hkv, s.D});
}
template <typename T>
View4<const T> v_view(const AttentionShape& s, const std::vector<T>& v) {
  return View4<const T>(v.data(), {s.B, s.M, s.Hkv, s.Dv});
}
template <typename T>
View4<const T> out_view(const AttentionShape& s, const std::vector<T>& o) {
  return View4<const T>(o.data(), {s.B, s.N, s.H, s.Dv});
}

// fast = false runs the reference.
template <typename T>
Forward<T> run_forward(const AttentionShape& s, const Inputs<T>& x, bool fast,
                       int threads = 1) {
  Forward<T> f{std::vector<T>(s.out_size()), std::vector<T>(s.lse_size())};
  View4<T> out(f.out.data(), {s.B, s.N, s.H, s.Dv});
  View3<T> lse(f.lse.data(), {s.B, s.H, s.N});
  if (fast)
    exact_attention_forward<T>(Context{Device::cpu, threads}, q_view(s, x.q), k_view(s, x.k),
                               v_view(s, x.v), s.options(), out, lse);
  else
    exact_attention_reference_forward<T>(q_view(s, x.q), k_view(s, x.k), v_view(s, x.v),
                                         s.options(), out, lse);
  return f;
}

template <typename T>
Backward<T> run_backward(const AttentionShape& s, const Inputs<T>& x, const Forward<T>& f,
                         bool fast, int threads = 1) {
  Backward<T> g{std::vector<T>(s.q_size()), std::vector<T>(s.k_size()),
                std::vector<T>(s.v_size())};
  View4<T> dq(g.dq.data(), {s.B, s.N, s.H, s.D});
  View4<T> dk(g.dk.data(), {s.B, s.M, s.Hkv, s.D});
  View4<T> dv(g.dv.data(), {s.B, s.M, s.Hkv, s.Dv});
  View3<const T> lse(f.lse.data(), {s.B, s.H, s.N});
  const View3<const T> dlse =
      x.dlse.empty() ? View3<const T>() : View3<const T>(x.dlse.data(), {s.B, s.H, s.N});
  if (fast)
    exact_attention_backward<T>(Context{Device::cpu, threads}, q_view(s, x.q), k_view(s, x.k),
                                v_view(s, x.v), out_view(s, f.out), lse,
                                out_view(s, x.dout), dlse, s.options(), dq, dk, dv);
  else
    exact_attention_reference_backward<T>(q_view(s, x.q), k_view(s, x.k), v_view(s, x.v),
                                          out_view(s, f.out), lse, out_view(s, x.dout), dlse,
                                          s.options(), dq, dk, dv);
  return g;
}

// lse of fully masked rows is -inf in all three; the finite rest follows the tolerance rule.
inline void expect_lse_close(const std::vector<float>& fast, const std::vector<float>& ref32,
                             const std::vector<double>& ref64) {
  std::vector<float> a = fast, b = ref32;
  std::vector<double> c = ref64;
  for (size_t i = 0; i < c.size(); ++i)
    if (std::isinf(c[i])) {
      EXPECT_EQ(a[i], c[i]) << "lse[" << i << "]";
      a[i] = b[i] = 0;
      c[i] = 0;
    }
  expect_close_to_reference(a, b, c);
}

}  // namespace subquad::testing
