// Tests of causal CAT: the dense reference against finite differences, the blocked kernel
// against it over sizes and paths, per-row relative accuracy under adversarial scores up to
// N = 65536 (against a float64 O(N)-per-row evaluation), the decoder, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <memory>

#include "cat/cat_causal_plan.h"
#include "cat/cat_ref.h"
#include "cat/cat_test_util.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

using reference::CatShape;
using testing::cast_vector;
using testing::random_vector;
using testing::view3;
using testing::view4;

TEST(CatCausalReference, BackwardMatchesFiniteDifferences) {
  const CatShape d{1, 6, 2, 3};
  const auto z = random_vector<double>(d.N * d.H, 1, -2, 2);
  const auto v = random_vector<double>(d.N * d.H * d.Dv, 2);
  const auto weight = random_vector<double>(v.size(), 3);
  std::vector<double> dz, dv;
  reference::cat_causal_backward(z, v, weight, d, dz, dv);
  const auto fd_z = testing::finite_difference_gradient(z, [&](const std::vector<double>& x) {
    return testing::dot(reference::cat_causal_forward(x, v, d), weight);
  });
  const auto fd_v = testing::finite_difference_gradient(v, [&](const std::vector<double>& x) {
    return testing::dot(reference::cat_causal_forward(z, x, d), weight);
  });
  EXPECT_LT(testing::max_abs_diff(dz, fd_z), 1e-8);
  EXPECT_LT(testing::max_abs_diff(dv, fd_v), 1e-8);
  EXPECT_GT(testing::max_abs(dz), 1e-3);
}

TEST(CatCausalReference, RowsReadOnlyThePastAndSumToOne) {
  const CatShape d{1, 9, 1, 1};
  const auto z = random_vector<double>(d.N, 4, -3, 3);
  const auto P = reference::cat_causal_matrix(z, d, 0, 0);
  for (int64_t i = 0; i < d.N; ++i) {
    double total = 0;
    for (int64_t j = 0; j < d.N; ++j) {
      if (j > i) {
        EXPECT_EQ(P[i * d.N + j], 0.0);
      }
      total += P[i * d.N + j];
    }
    EXPECT_NEAR(total, 1.0, 1e-14);
  }
}

void expect_causal_matches_reference(int64_t B, int64_t N, int64_t H, int64_t Dv, CatPath path,
                                     uint64_t seed, double z_range) {
  const CatShape d{B, N, H, Dv};
  const auto z = cast_vector<float>(random_vector<double>(B * N * H, seed, -z_range, z_range));
  const auto v = cast_vector<float>(random_vector<double>(B * N * H * Dv, seed + 1));
  const auto g = cast_vector<float>(random_vector<double>(v.size(), seed + 2));
  const auto z64 = cast_vector<double>(z), v64 = cast_vector<double>(v),
             g64 = cast_vector<double>(g);
  SCOPED_TRACE(::testing::Message() << "N=" << N << " H=" << H << " Dv=" << Dv
                                    << " path=" << static_cast<int>(path) << " range=" << z_range);
  std::vector<float> out(v.size());
  cat_causal_forward<float>({}, view3(z, B, N, H), view4(v, B, N, H, Dv), {path},
                            view4(out, B, N, H, Dv));
  const auto truth = reference::cat_causal_forward(z64, v64, d);
  testing::expect_close_to_reference(out, reference::cat_causal_forward(z, v, d), truth, 2.0,
                                     16.0);
  EXPECT_GT(testing::max_abs(out), 0.0);

  std::vector<float> dz(z.size()), dv(v.size());
  cat_causal_backward<float>({}, view3(z, B, N, H), view4(v, B, N, H, Dv),
                             view4(out, B, N, H, Dv), view4(g, B, N, H, Dv), {path},
                             view3(dz, B, N, H), view4(dv, B, N, H, Dv));
  std::vector<double> dz64, dv64;
  reference::cat_causal_backward(z64, v64, g64, d, dz64, dv64);
  std::vector<float> dz32, dv32;
  reference::cat_causal_backward(z, v, g, d, dz32, dv32);
  testing::expect_close_to_reference(dz, dz32, dz64, 2.0, 16.0);
  testing::expect_close_to_reference(dv, dv32, dv64, 2.0, 16.0);
}

TEST(CatCausal, FastMatchesReferenceOverSizes) {
  uint64_t seed = 100;
  for (int64_t N : {1, 2, 3, 7, 16, 97, 256, 257})
    for (CatPath path : {CatPath::automatic, CatPath::fft, CatPath::direct}) {
      expect_causal_matches_reference(1, N, 1, 1, path, seed += 3, 3.0);
      expect_causal_matches_reference(2, N, 3, 6, path, seed += 3, 3.0);
    }
  expect_causal_matches_reference(1, 1000, 1, 5, CatPath::automatic, 7, 3.0);
  // Dv beyond one forward pass (64 columns) and one backward pass (32).
  expect_causal_matches_reference(1, 150, 2, 131, CatPath::fft, 9, 3.0);
}

TEST(CatCausal, WideScoreRangesSplitTheFftBlocks) {
  // Scores over a range of 200 make the plan split (checked below), so cross blocks and
  // per-block shifts are exercised against the dense reference.
  for (CatPath path : {CatPath::automatic, CatPath::fft})
    expect_causal_matches_reference(1, 700, 2, 3, path, 11, 100.0);
  std::vector<double> z(700), lse(700);
  for (size_t i = 0; i < z.size(); ++i) z[i] = 200.0 * i / z.size();
  cat_detail::prefix_log_sum_exp(z.data(), 700, lse.data());
  const std::vector<double> value_scale(700, 1.0);
  EXPECT_GT(cat_detail::plan_causal_blocks(z.data(), lse.data(), value_scale.data(), 700, 0, 1 << 20)
                .size(),
            3u);
}

// Row i of causal CAT in float64 by direct summation, O(i Dv).
std::vector<double> causal_row(const std::vector<float>& z, const std::vector<float>& v,
                               int64_t Dv, int64_t i) {
  double high = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k <= i; ++k) high = std::max<double>(high, z[k]);
  double total = 0;
  std::vector<double> row(Dv, 0.0);
  for (int64_t k = 0; k <= i; ++k) {
    const double w = std::exp(z[k] - high);
    total += w;
    for (int64_t c = 0; c < Dv; ++c) row[c] += w * v[(i - k) * Dv + c];
  }
  for (double& x : row) x /= total;
  return row;
}

// Every sampled row within 1e-4 of the float64 row, relative to the row's largest entry.
void expect_rows_accurate(const std::vector<float>& z, int64_t Dv, uint64_t seed,
                          int64_t row_step) {
  const int64_t N = static_cast<int64_t>(z.size());
  const auto v = random_vector<float>(N * Dv, seed);
  std::vector<float> out(v.size());
  cat_causal_forward<float>({}, view3(z, 1, N, 1), view4(v, 1, N, 1, Dv), {},
                            view4(out, 1, N, 1, Dv));
  double worst = 0;
  for (int64_t i = 0; i < N; i += (i < 300 || i > N - 300) ? 1 : row_step) {
    const auto truth = causal_row(z, v, Dv, i);
    double error = 0, scale = 0;
    for (int64_t c = 0; c < Dv; ++c) {
      error = std::max(error, std::abs(out[i * Dv + c] - truth[c]));
      scale = std::max(scale, std::abs(truth[c]));
    }
    worst = std::max(worst, error / scale);
    ASSERT_LE(error, 1e-4 * scale) << "row " << i << " of " << N;
  }
  ::testing::Test::RecordProperty("worst_row_relative_error", std::to_string(worst));
}

TEST(CatCausal, RowsAccurateUnderAdversarialScores) {
  const int64_t N = 5000;
  std::vector<float> constant(N, 3.0f), ramp_up(N), ramp_down(N), steps(N);
  for (int64_t i = 0; i < N; ++i) {
    ramp_up[i] = static_cast<float>(-100 + 200.0 * i / N);
    ramp_down[i] = -ramp_up[i];
    steps[i] = static_cast<float>(-100 + 40 * (i * 5 / N));  // jumps of 40 at the fifths
  }
  const auto uniform = random_vector<float>(N, 5, -100, 100);
  std::vector<float> late_spike(N, 0.0f);
  late_spike[N - 2] = 100.0f;  // underflows every earlier weight under a global shift
  for (const std::vector<float>* z : std::initializer_list<const std::vector<float>*>{&constant, &ramp_up, &ramp_down, &steps, &uniform, &late_spike})
    expect_rows_accurate(*z, 3, 6, 7);
}

TEST(CatCausal, RowsAccurateAt65536) {
  const int64_t N = 65536;
  std::vector<float> constant(N, 0.0f), ramp(N);
  for (int64_t i = 0; i < N; ++i) ramp[i] = static_cast<float>(-100 + 200.0 * i / N);
  const auto uniform = random_vector<float>(N, 8, -100, 100);
  for (const std::vector<float>* z : std::initializer_list<const std::vector<float>*>{&constant, &ramp, &uniform}) expect_rows_accurate(*z, 2, 9, 997);
}

// Decodes B = 2 sequences in chunks of 1, 5 and 1 tokens (a prefill and single steps) from
// growing prefixes of z and v (strided views, as a caller's buffers are), and compares every
// row with the full forward; then decodes the last 40 rows again in one call.
TEST(CatCausal, DecodeMatchesFullForward) {
  const int64_t B = 2, N = 150, H = 3, Dv = 7;
  const auto z = random_vector<float>(B * N * H, 80, -30, 30);
  const auto v = random_vector<float>(B * N * H * Dv, 81);
  std::vector<float> full(v.size());
  cat_causal_forward<float>({}, view3(z, B, N, H), view4(v, B, N, H, Dv), {},
                            view4(full, B, N, H, Dv));
  // The first `seen` tokens of both sequences.
  auto z_upto = [&](int64_t seen) {
    return View3<const float>(z.data(), {B, seen, H}, {N * H, H, 1});
  };
  auto v_upto = [&](int64_t seen) {
    return View4<const float>(v.data(), {B, seen, H, Dv}, {N * H * Dv, H * Dv, Dv, 1});
  };
  std::vector<float> out;
  // Rows i .. i + count - 1, decoded once tokens 0 .. i + count - 1 are held.
  auto decode = [&](int64_t i, int64_t count) {
    out.assign(B * count * H * Dv, 0.0f);
    cat_causal_decode<float>(Context{Device::cpu, 2}, z_upto(i + count), v_upto(i + count),
                             View4<float>(out.data(), {B, count, H, Dv}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < count; ++t)
        for (int64_t e = 0; e < H * Dv; ++e)
          ASSERT_NEAR(out[(b * count + t) * H * Dv + e], full[(b * N + i + t) * H * Dv + e], 2e-6)
              << b << " " << i + t;
  };
  decode(0, 1);
  decode(1, 5);
  for (int64_t i = 6; i < N; ++i) decode(i, 1);
  decode(N - 40, 40);
  decode(N, 0);  // no new token: nothing to write
}

TEST(CatCausal, DeterministicAcrossThreads) {
  const int64_t B = 2, N = 600, H = 3, Dv = 5;
  const auto z = random_vector<float>(B * N * H, 90, -50, 50);
  const auto v = random_vector<float>(B * N * H * Dv, 91);
  std::vector<float> first(v.size()), second(v.size());
  cat_causal_forward<float>(Context{Device::cpu, 1}, view3(z, B, N, H), view4(v, B, N, H, Dv),
                            {}, view4(first, B, N, H, Dv));
  cat_causal_forward<float>(Context{Device::cpu, 3}, view3(z, B, N, H), view4(v, B, N, H, Dv),
                            {}, view4(second, B, N, H, Dv));
  EXPECT_EQ(first, second);
}

TEST(CatCausal, BadInput) {
  const int64_t N = 8, H = 2, Dv = 3;
  auto z = random_vector<float>(N * H, 95);
  const auto v = random_vector<float>(N * H * Dv, 96);
  std::vector<float> out(v.size());
  EXPECT_THROW(cat_causal_forward<float>({}, view3(z, 1, N, H - 1), view4(v, 1, N, H, Dv), {},
                                         view4(out, 1, N, H, Dv)),
               Error);
  std::vector<float> step(2 * H * Dv);
  EXPECT_THROW(cat_causal_decode<float>({}, View3<const float>(z.data(), {1, 1, H + 1}),
                                        View4<const float>(v.data(), {1, 1, H, Dv}),
                                        View4<float>(step.data(), {1, 1, H, Dv})),
               Error);
  // More new tokens than z holds.
  EXPECT_THROW(cat_causal_decode<float>({}, View3<const float>(z.data(), {1, 1, H}),
                                        View4<const float>(v.data(), {1, 1, H, Dv}),
                                        View4<float>(step.data(), {1, 2, H, Dv})),
               Error);
}

}  // namespace
}  // namespace subquad
