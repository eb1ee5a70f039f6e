// Tests of 2D circulant attention: the dense reference's backward against float64 finite
// differences, the FFT path against the float64 reference (forward and backward) over grid,
// head and head-dim sweeps, adversarial logits, strided views, determinism and bad input.
#include "subquad/circulant2d.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "circulant2d/circulant2d_ref.h"
#include "common/test_support.h"

namespace subquad {
namespace {

using testing::cast_vector;
using testing::expect_close_to_reference;
using testing::random_vector;

struct Dims {
  int64_t B, Hg, Wg, H, D, Dv;
  std::array<int64_t, 5> qk() const { return {B, Hg, Wg, H, D}; }
  std::array<int64_t, 5> value() const { return {B, Hg, Wg, H, Dv}; }
  int64_t qk_size() const { return B * Hg * Wg * H * D; }
  int64_t value_size() const { return B * Hg * Wg * H * Dv; }
};

// float64 inputs; float32 runs use their rounded copies, so both see the same values.
struct Inputs {
  std::vector<double> q, k, v, dout;
};

Inputs make_inputs(const Dims& d, uint64_t seed, double qk_range = 1.0) {
  return {random_vector<double>(d.qk_size(), seed, -qk_range, qk_range),
          random_vector<double>(d.qk_size(), seed + 1, -qk_range, qk_range),
          random_vector<double>(d.value_size(), seed + 2),
          random_vector<double>(d.value_size(), seed + 3)};
}

template <typename T>
View5<const T> view(const std::vector<T>& x, const std::array<int64_t, 5>& shape) {
  return View5<const T>(x.data(), shape);
}
template <typename T>
View5<T> view(std::vector<T>& x, const std::array<int64_t, 5>& shape) {
  return View5<T>(x.data(), shape);
}

struct Gradients {
  std::vector<double> out, dq, dk, dv;
};

template <typename T>
std::vector<T> reference_forward(const Dims& d, const Inputs& in, double scale) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  std::vector<T> out(d.value_size());
  reference::circulant2d_forward<T>(view(q, d.qk()), view(k, d.qk()), view(v, d.value()),
                                    static_cast<T>(scale), view(out, d.value()), View4<T>());
  return out;
}

template <typename T>
std::array<std::vector<T>, 3> reference_backward(const Dims& d, const Inputs& in,
                                                 double scale) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  const auto g = cast_vector<T>(in.dout);
  std::vector<T> dq(d.qk_size()), dk(d.qk_size()), dv(d.value_size());
  reference::circulant2d_backward<T>(view(q, d.qk()), view(k, d.qk()), view(v, d.value()),
                                     view(g, d.value()), static_cast<T>(scale),
                                     view(dq, d.qk()), view(dk, d.qk()), view(dv, d.value()));
  return {dq, dk, dv};
}

template <typename T>
std::vector<T> fast_forward(const Dims& d, const Inputs& in, const Circulant2dOptions& options,
                            int threads = 1) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  std::vector<T> out(d.value_size());
  circulant2d_forward<T>(Context{Device::cpu, threads}, view(q, d.qk()), view(k, d.qk()),
                         view(v, d.value()), options, view(out, d.value()), View4<T>());
  return out;
}

template <typename T>
std::array<std::vector<T>, 3> fast_backward(const Dims& d, const Inputs& in,
                                            const Circulant2dOptions& options,
                                            int threads = 1) {
  const auto q = cast_vector<T>(in.q), k = cast_vector<T>(in.k), v = cast_vector<T>(in.v);
  const auto g = cast_vector<T>(in.dout);
  std::vector<T> dq(d.qk_size()), dk(d.qk_size()), dv(d.value_size());
  circulant2d_backward<T>(Context{Device::cpu, threads}, view(q, d.qk()), view(k, d.qk()),
                          view(v, d.value()), view(g, d.value()), options, view(dq, d.qk()),
                          view(dk, d.qk()), view(dv, d.value()));
  return {dq, dk, dv};
}

void expect_not_all_zero(const std::vector<float>& x) {
  EXPECT_GT(testing::max_abs(x), 0.0) << "result is all zeros";
}

// Fast float32 forward and backward against the float64 reference, with the tolerance of
// the float32 reference's own error.
void expect_fast_matches_reference(const Dims& d, const Inputs& in,
                                   const Circulant2dOptions& options) {
  SCOPED_TRACE(::testing::Message() << "grid " << d.Hg << "x" << d.Wg << " B " << d.B << " H "
                                    << d.H << " D " << d.D << " Dv " << d.Dv);
  const double scale = circulant2d_scale(options, d.Hg * d.Wg, d.D);
  const auto out = fast_forward<float>(d, in, options);
  expect_close_to_reference(out, reference_forward<float>(d, in, scale),
                            reference_forward<double>(d, in, scale));
  expect_not_all_zero(out);
  const auto fast = fast_backward<float>(d, in, options);
  const auto ref32 = reference_backward<float>(d, in, scale);
  const auto ref64 = reference_backward<double>(d, in, scale);
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    expect_close_to_reference(fast[i], ref32[i], ref64[i]);
    // dq, dk vanish exactly on a 1 x 1 grid and up to underflow for one-hot weights.
    if (testing::max_abs(ref64[i]) > 1e-6) expect_not_all_zero(fast[i]);
  }
}

TEST(Circulant2dReference, BackwardMatchesFiniteDifferences) {
  const Dims d{2, 2, 3, 2, 2, 3};
  const Inputs in = make_inputs(d, 11, 2.0);
  const double scale = 0.7;  // larger than `paper` so the softmax is far from uniform
  const auto loss = [&](const Inputs& x) {
    const auto out = reference_forward<double>(d, x, scale);
    return std::inner_product(out.begin(), out.end(), x.dout.begin(), 0.0);
  };
  const auto grads = reference_backward<double>(d, in, scale);
  std::vector<double> Inputs::*members[3] = {&Inputs::q, &Inputs::k, &Inputs::v};
  for (int i = 0; i < 3; ++i) {
    const auto numeric = testing::finite_difference_gradient(in.*members[i], [&](auto x) {
      Inputs moved = in;
      moved.*members[i] = x;
      return loss(moved);
    });
    EXPECT_LE(testing::max_abs_diff(grads[i], numeric), 1e-8 * (1 + testing::max_abs(numeric)))
        << "argument " << i;
    EXPECT_GT(testing::max_abs(numeric), 1e-3);
  }
}

TEST(Circulant2dReference, OneTokenGridReturnsValues) {
  const Dims d{1, 1, 1, 2, 3, 4};
  const Inputs in = make_inputs(d, 5);
  EXPECT_EQ(reference_forward<double>(d, in, 1.0), in.v);
}

TEST(Circulant2d, ScaleModes) {
  Circulant2dOptions options;
  EXPECT_DOUBLE_EQ(circulant2d_scale(options, 100, 4), 1.0 / 200.0);
  options.scale_mode = Circulant2dScaleMode::code;
  EXPECT_DOUBLE_EQ(circulant2d_scale(options, 100, 4), 0.1);
  options.scale = 0.25;
  EXPECT_DOUBLE_EQ(circulant2d_scale(options, 100, 4), 0.25);
}

TEST(Circulant2d, GridForTokens) {
  const std::vector<std::array<int64_t, 3>> cases = {
      {4096, 64, 64}, {9216, 96, 96}, {196, 14, 14}, {77, 7, 11}, {13, 1, 13}, {1, 1, 1},
      {24, 4, 6}};
  for (const auto& [tokens, rows, cols] : cases) {
    const Grid grid = circulant2d_grid_for_tokens(tokens);
    EXPECT_EQ(grid.rows, rows) << tokens;
    EXPECT_EQ(grid.cols, cols) << tokens;
  }
}

TEST(Circulant2d, MatchesReferenceOverGrids) {
  const std::vector<std::array<int64_t, 2>> grids = {{1, 1}, {1, 8}, {2, 3}, {7, 11},
                                                     {8, 8}, {5, 16}, {14, 14}};
  uint64_t seed = 100;
  for (const auto& [Hg, Wg] : grids)
    for (const int64_t D : {1, 3}) {
      const Dims d{2, Hg, Wg, 3, D, D == 1 ? 1 : 5};
      // D = 1 under the paper scale gives near-uniform weights; `code` makes them peaked.
      Circulant2dOptions options;
      options.scale_mode = Circulant2dScaleMode::code;
      expect_fast_matches_reference(d, make_inputs(d, seed += 10), options);
    }
}

TEST(Circulant2d, MatchesReferenceWithWideHeads) {
  // 64 and 32: whole 8 x 8 transpose tiles; 70 and 13: more channels than one pass of the
  // plane copies and partial tiles.
  for (const auto& d : {Dims{1, 7, 11, 2, 64, 64}, Dims{1, 14, 14, 1, 64, 32},
                        Dims{1, 5, 9, 1, 70, 13}}) {
    Circulant2dOptions options;  // paper
    expect_fast_matches_reference(d, make_inputs(d, 7, 3.0), options);
    options.scale = 2.0 / (d.Hg * d.Wg);  // sharper than paper, far from one-hot
    expect_fast_matches_reference(d, make_inputs(d, 8), options);
  }
}

TEST(Circulant2d, WeightsSumToOneAndMatchReference) {
  const Dims d{2, 5, 6, 3, 4, 2};
  const Inputs in = make_inputs(d, 21, 2.0);
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  const auto q = cast_vector<float>(in.q), k = cast_vector<float>(in.k);
  const std::vector<float> v(d.value_size(), 1.0f);
  std::vector<float> out(d.value_size()), weights(d.B * d.H * d.Hg * d.Wg);
  const View4<float> weights_view(weights.data(), {d.B, d.H, d.Hg, d.Wg});
  circulant2d_forward<float>(Context{}, view(q, d.qk()), view(k, d.qk()), view(v, d.value()),
                             options, view(out, d.value()), weights_view);
  // Each row of A is a permutation of s: a constant v is reproduced.
  for (float x : out) EXPECT_NEAR(x, 1.0f, 1e-6f);
  const double scale = circulant2d_scale(options, d.Hg * d.Wg, d.D);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const auto s = reference::circulant2d_weights<double>(
          view(in.q, d.qk()), view(in.k, d.qk()), b, h, scale);
      double sum = 0;
      for (int64_t n = 0; n < d.Hg * d.Wg; ++n) {
        const float w = weights_view(b, h, n / d.Wg, n % d.Wg);
        sum += w;
        EXPECT_NEAR(w, s[n], 1e-6);
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(Circulant2d, LargeLogitsGiveOneHotWeights) {
  // Logits spread over hundreds: the softmax is one-hot up to round-off and must not
  // overflow; each output row is then a shifted copy of v.
  const Dims d{1, 6, 7, 2, 3, 4};
  const Inputs in = make_inputs(d, 31, 30.0);
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  expect_fast_matches_reference(d, in, options);
}

TEST(Circulant2d, ConstantLogitsAverageValues) {
  // Constant q and k: every logit is equal (also large and negative), s is uniform and
  // every output is the mean of v over the grid.
  const Dims d{1, 4, 5, 2, 3, 2};
  Inputs in = make_inputs(d, 41);
  std::fill(in.q.begin(), in.q.end(), 50.0);
  std::fill(in.k.begin(), in.k.end(), -50.0);
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  const auto out = fast_forward<float>(d, in, options);
  const int64_t N = d.Hg * d.Wg;
  for (int64_t h = 0; h < d.H; ++h)
    for (int64_t c = 0; c < d.Dv; ++c) {
      double mean = 0;
      for (int64_t n = 0; n < N; ++n) mean += in.v[(n * d.H + h) * d.Dv + c] / N;
      for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(out[(n * d.H + h) * d.Dv + c], mean, 1e-5);
    }
  const auto grads = fast_backward<float>(d, in, options);
  for (const auto& g : grads) EXPECT_TRUE(testing::all_finite(g));
}

TEST(Circulant2d, StridedViewsGiveTheSameBits) {
  // q, k, v, out as the odd heads of wider padded buffers [B, Hg, Wg, 2H, D + 3].
  const Dims d{2, 3, 5, 2, 4, 3};
  const Inputs in = make_inputs(d, 51, 2.0);
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  const auto dense = fast_forward<float>(d, in, options);
  const auto dense_grads = fast_backward<float>(d, in, options);

  const auto embed = [&](const std::vector<double>& x, int64_t C) {
    std::vector<float> wide(d.B * d.Hg * d.Wg * 2 * d.H * (C + 3), -7.0f);
    for (int64_t t = 0; t < d.B * d.Hg * d.Wg; ++t)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t c = 0; c < C; ++c)
          wide[(t * 2 * d.H + 2 * h + 1) * (C + 3) + c] = static_cast<float>(x[(t * d.H + h) * C + c]);
    return wide;
  };
  const auto strided = [&](auto* data, int64_t C) {
    using T = std::remove_pointer_t<decltype(data)>;
    const int64_t row = C + 3;
    return View5<T>(data + row, {d.B, d.Hg, d.Wg, d.H, C},
                    {d.Hg * d.Wg * 2 * d.H * row, d.Wg * 2 * d.H * row, 2 * d.H * row, 2 * row, 1});
  };
  const auto q = embed(in.q, d.D), k = embed(in.k, d.D), v = embed(in.v, d.Dv);
  const auto g = embed(in.dout, d.Dv);
  auto out = embed(std::vector<double>(d.value_size()), d.Dv);
  auto dq = embed(std::vector<double>(d.qk_size()), d.D);
  auto dk = dq;
  auto dv = out;
  circulant2d_forward<float>(Context{Device::cpu, 1}, strided(q.data(), d.D),
                             strided(k.data(), d.D), strided(v.data(), d.Dv), options,
                             strided(out.data(), d.Dv), View4<float>());
  circulant2d_backward<float>(Context{Device::cpu, 1}, strided(q.data(), d.D),
                              strided(k.data(), d.D), strided(v.data(), d.Dv),
                              strided(g.data(), d.Dv), options, strided(dq.data(), d.D),
                              strided(dk.data(), d.D), strided(dv.data(), d.Dv));
  const auto compact = [&](const std::vector<float>& wide, int64_t C) {
    std::vector<float> x(d.B * d.Hg * d.Wg * d.H * C);
    const auto w = strided(wide.data(), C);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t i = 0; i < d.Hg; ++i)
        for (int64_t j = 0; j < d.Wg; ++j)
          for (int64_t h = 0; h < d.H; ++h)
            for (int64_t c = 0; c < C; ++c)
              x[(((b * d.Hg + i) * d.Wg + j) * d.H + h) * C + c] = w(b, i, j, h, c);
    return x;
  };
  EXPECT_EQ(compact(out, d.Dv), dense);
  EXPECT_EQ(compact(dq, d.D), dense_grads[0]);
  EXPECT_EQ(compact(dk, d.D), dense_grads[1]);
  EXPECT_EQ(compact(dv, d.Dv), dense_grads[2]);
  // Padding and the untouched heads keep their fill value.
  for (size_t i = 0; i < out.size(); ++i)
    if ((i / (d.Dv + 3)) % 2 == 0 || i % (d.Dv + 3) >= static_cast<size_t>(d.Dv)) {
      ASSERT_EQ(out[i], -7.0f) << i;
    }
}

TEST(Circulant2d, DeterministicAcrossRunsAndThreads) {
  const Dims d{2, 7, 9, 3, 5, 4};
  const Inputs in = make_inputs(d, 61, 2.0);
  const Circulant2dOptions options;
  const auto once = fast_forward<float>(d, in, options, 1);
  EXPECT_EQ(fast_forward<float>(d, in, options, 1), once);
  EXPECT_EQ(fast_forward<float>(d, in, options, 2), once);
  const auto grads = fast_backward<float>(d, in, options, 1);
  EXPECT_EQ(fast_backward<float>(d, in, options, 2), grads);
}

TEST(Circulant2d, DoubleMatchesReferenceClosely) {
  const Dims d{1, 5, 7, 2, 3, 2};
  const Inputs in = make_inputs(d, 71, 2.0);
  Circulant2dOptions options;
  options.scale_mode = Circulant2dScaleMode::code;
  const double scale = circulant2d_scale(options, d.Hg * d.Wg, d.D);
  EXPECT_LE(testing::max_abs_diff(fast_forward<double>(d, in, options),
                                  reference_forward<double>(d, in, scale)),
            1e-13);
  const auto fast = fast_backward<double>(d, in, options);
  const auto ref = reference_backward<double>(d, in, scale);
  for (int i = 0; i < 3; ++i) EXPECT_LE(testing::max_abs_diff(fast[i], ref[i]), 1e-13);
}

// Runs `body`, expects an Error whose message contains `needle`.
template <typename F>
void expect_error_mentioning(F&& body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Circulant2d, RejectsBadShapes) {
  const Dims d{1, 3, 4, 2, 3, 2};
  const auto q = cast_vector<float>(make_inputs(d, 81).q);
  std::vector<float> v(d.value_size()), out(d.value_size()), big(1000);
  const Circulant2dOptions options;
  const Context context;
  const auto forward = [&](View5<const float> k, View5<const float> vv, View5<float> o,
                           View4<float> w) {
    circulant2d_forward<float>(context, view(q, d.qk()), k, vv, options, o, w);
  };
  expect_error_mentioning([&] { forward(View5<const float>(big.data(), {1, 3, 4, 2, 4}),
                                        view(v, d.value()), view(out, d.value()), {}); }, "k:");
  expect_error_mentioning([&] { forward(view(q, d.qk()), View5<const float>(big.data(), {1, 4, 3, 2, 2}),
                                        view(out, d.value()), {}); }, "v:");
  expect_error_mentioning([&] { forward(view(q, d.qk()), view(v, d.value()),
                                        View5<float>(big.data(), {1, 3, 4, 2, 3}), {}); }, "out:");
  expect_error_mentioning([&] { forward(view(q, d.qk()), view(v, d.value()), view(out, d.value()),
                                        View4<float>(big.data(), {1, 2, 4, 3})); }, "weights:");
  expect_error_mentioning([&] {
    circulant2d_forward<float>(context, View5<const float>(big.data(), {1, 0, 4, 2, 3}),
                               View5<const float>(big.data(), {1, 0, 4, 2, 3}),
                               View5<const float>(big.data(), {1, 0, 4, 2, 2}), options,
                               View5<float>(big.data(), {1, 0, 4, 2, 2}), {});
  }, "grid");
  std::vector<float> dq(d.qk_size());
  expect_error_mentioning([&] {
    circulant2d_backward<float>(context, view(q, d.qk()), view(q, d.qk()), view(v, d.value()),
                                view(v, d.value()), options, view(dq, d.qk()),
                                view(dq, d.qk()), View5<float>(big.data(), {1, 3, 4, 2, 3}));
  }, "dv:");
  Circulant2dOptions bad_scale;
  bad_scale.scale = std::numeric_limits<double>::infinity();
  expect_error_mentioning([&] {
    circulant2d_forward<float>(context, view(q, d.qk()), view(q, d.qk()), view(v, d.value()),
                               bad_scale, view(out, d.value()), {});
  }, "scale:");
  // A token sequence whose length does not match the grid.
  const View4<const float> tokens(q.data(), {1, 12, 2, 3});
  expect_error_mentioning([&] { as_grid(tokens, Grid{5, 2}, "q"); }, "q: grid 5 x 2");
  EXPECT_EQ(as_grid(tokens, Grid{3, 4}, "q").shape, d.qk());
}

// Every output of head (b, h) of x [B, Hg, Wg, H, C] NaN, and every other equal to clean.
void expect_head_nan(const Dims& d, int64_t C, const std::vector<float>& got,
                     const std::vector<float>& clean, int64_t b, int64_t h) {
  for (int64_t t = 0; t < d.B * d.Hg * d.Wg; ++t)
    for (int64_t g = 0; g < d.H; ++g)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t at = (t * d.H + g) * C + c;
        if (t / (d.Hg * d.Wg) == b && g == h)
          ASSERT_TRUE(std::isnan(got[at])) << "token " << t << " head " << g;
        else
          ASSERT_EQ(got[at], clean[at]) << "token " << t << " head " << g;
      }
}

// Non-finite inputs propagate (they were refused with an Error): a NaN or inf in q, k, v or
// dout of one head, or logits that overflow there, make that head's outputs NaN and leave
// every other head as it was.
TEST(Circulant2d, NonFiniteInputsMakeTheirHeadNaN) {
  const Dims d{2, 3, 4, 2, 3, 2};
  const Circulant2dOptions options;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Inputs clean = make_inputs(d, 91);
  const auto out = fast_forward<float>(d, clean, options);
  const auto grads = fast_backward<float>(d, clean, options);
  for (int which = 0; which < 4; ++which) {
    Inputs in = clean;
    std::vector<double>* target[4] = {&in.q, &in.k, &in.v, &in.dout};
    (*target[which])[target[which]->size() - 2] = which % 2 ? nan : inf;  // batch 1, head 1
    SCOPED_TRACE(which);
    if (which < 3) expect_head_nan(d, d.Dv, fast_forward<float>(d, in, options), out, 1, 1);
    const auto poisoned = fast_backward<float>(d, in, options);
    for (int i = 0; i < 3; ++i) expect_head_nan(d, i < 2 ? d.D : d.Dv, poisoned[i], grads[i], 1, 1);
  }
  // Finite inputs whose logits overflow float32, in batch 0 head 0 only.
  Inputs in = clean;
  for (int64_t t = 0; t < d.Hg * d.Wg; ++t)
    for (int64_t c = 0; c < d.D; ++c) {
      in.q[(t * d.H + 0) * d.D + c] *= 1e20;
      in.k[(t * d.H + 0) * d.D + c] *= 1e20;
    }
  expect_head_nan(d, d.Dv, fast_forward<float>(d, in, options), out, 0, 0);
}

}  // namespace
}  // namespace subquad
