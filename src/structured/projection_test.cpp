// Bilinear MLR and BTT projections: reference backward against float64 finite differences
// (with the RMS cap active and inactive), fast against reference, the structured bilinear
// matrix against an explicitly built dense one, and bad input.
#include <gtest/gtest.h>

#include <vector>

#include "common/test_support.h"
#include "structured/projection_ref.h"
#include "subquad/error.h"
#include "subquad/structured.h"

namespace subquad {
namespace {

using testing::random_vector;

// ---- bilinear MLR ----------------------------------------------------------------------

struct MlrProblem {
  int64_t B, N, Dm;
  BilinearMlrOptions options;
  double weight_range;  // small ranges leave the RMS cap inactive
  int64_t E() const { return bilinear_mlr_output_dim(options.ranks); }
  int64_t weight_size(size_t l) const {
    return Dm * options.heads * options.ranks[l];  // p_l * (Dm / p_l) * H r_l
  }
};

template <typename T>
struct MlrData {
  std::vector<T> x, dy;
  std::vector<std::vector<T>> w;
  explicit MlrData(const MlrProblem& p)
      : x(random_vector<T>(p.B * p.N * p.Dm, 21, -2, 2)),
        dy(random_vector<T>(p.B * p.N * p.options.heads * p.E(), 22)) {
    for (size_t l = 0; l < p.options.ranks.size(); ++l)
      w.push_back(random_vector<T>(p.weight_size(l), 23 + l, -p.weight_range, p.weight_range));
  }
  std::vector<View3<const T>> weights(const MlrProblem& p) const {
    std::vector<View3<const T>> views;
    for (size_t l = 0; l < w.size(); ++l) {
      const int64_t blocks = int64_t{1} << l;
      views.emplace_back(w[l].data(), std::array<int64_t, 3>{blocks, p.Dm / blocks,
                                                             p.options.heads * p.options.ranks[l]});
    }
    return views;
  }
};

template <typename T>
struct MlrResult {
  std::vector<T> y, dx;
  std::vector<std::vector<T>> dw;
};

template <typename T>
MlrResult<T> run_mlr(const MlrProblem& p, bool fast) {
  const MlrData<T> data(p);
  MlrResult<T> r;
  const int64_t H = p.options.heads;
  r.y.resize(p.B * p.N * H * p.E());
  r.dx.resize(data.x.size());
  std::vector<View3<T>> dviews;
  for (size_t l = 0; l < data.w.size(); ++l) {
    r.dw.emplace_back(data.w[l].size());
  }
  for (size_t l = 0; l < data.w.size(); ++l)
    dviews.emplace_back(r.dw[l].data(), data.weights(p)[l].shape);
  const View3<const T> x(data.x.data(), {p.B, p.N, p.Dm});
  const View4<T> y(r.y.data(), {p.B, p.N, H, p.E()});
  const View4<const T> dy(data.dy.data(), {p.B, p.N, H, p.E()});
  const View3<T> dx(r.dx.data(), {p.B, p.N, p.Dm});
  if (fast) {
    bilinear_mlr_project_forward<T>({}, x, data.weights(p), p.options, y);
    bilinear_mlr_project_backward<T>({}, x, data.weights(p), dy, p.options, dx, dviews);
  } else {
    bilinear_mlr_reference_forward<T>(x, data.weights(p), p.options, y);
    bilinear_mlr_reference_backward<T>(x, data.weights(p), dy, p.options, dx, dviews);
  }
  return r;
}

TEST(BilinearMlr, ReferenceBackwardMatchesFiniteDifferences) {
  for (double range : {1.0, 0.01})  // cap active, cap inactive
    for (bool layer_norm : {true, false}) {
      MlrProblem p{1, 3, 8, {{2, 1, 1}, 2, {0.7, 1.3, 0.5}, layer_norm, true}, range};
      const MlrData<double> data(p);
      const MlrResult<double> ref = run_mlr<double>(p, false);
      // Parameters: x, then each level's weights.
      std::vector<double> theta = data.x;
      for (const auto& w : data.w) theta.insert(theta.end(), w.begin(), w.end());
      auto loss = [&](const std::vector<double>& z) {
        std::vector<std::vector<double>> w;
        size_t at = data.x.size();
        std::vector<View3<const double>> views;
        for (size_t l = 0; l < data.w.size(); ++l) {
          w.emplace_back(z.begin() + at, z.begin() + at + data.w[l].size());
          at += data.w[l].size();
        }
        for (size_t l = 0; l < w.size(); ++l) views.emplace_back(w[l].data(), data.weights(p)[l].shape);
        std::vector<double> y(data.dy.size());
        bilinear_mlr_reference_forward<double>(View3<const double>(z.data(), {p.B, p.N, p.Dm}), views,
                                               p.options,
                                               View4<double>(y.data(), {p.B, p.N, 2, p.E()}));
        double total = 0;
        for (size_t i = 0; i < y.size(); ++i) total += y[i] * data.dy[i];
        return total;
      };
      std::vector<double> analytic = ref.dx;
      for (const auto& g : ref.dw) analytic.insert(analytic.end(), g.begin(), g.end());
      const std::vector<double> numeric = testing::finite_difference_gradient(theta, loss);
      EXPECT_LT(testing::max_abs_diff(numeric, analytic), 2e-6 * std::max(1.0, testing::max_abs(analytic)))
          << "range " << range << " layer_norm " << layer_norm;
    }
}

TEST(BilinearMlr, FastMatchesReference) {
  const std::vector<MlrProblem> problems{
      {2, 5, 12, {{3, 2, 1}, 3, {}, true, true}, 1.0},
      {1, 7, 16, {{4, 2, 1, 1}, 2, {0.5, 0.25, 2.0, 1.0}, true, true}, 0.05},
      {1, 4, 9, {{5}, 1, {}, false, false}, 1.0},
  };
  for (const MlrProblem& p : problems) {
    const MlrResult<float> fast = run_mlr<float>(p, true), ref32 = run_mlr<float>(p, false);
    const MlrResult<double> ref64 = run_mlr<double>(p, false);
    testing::expect_close_to_reference(fast.y, ref32.y, ref64.y);
    testing::expect_close_to_reference(fast.dx, ref32.dx, ref64.dx);
    for (size_t l = 0; l < fast.dw.size(); ++l)
      testing::expect_close_to_reference(fast.dw[l], ref32.dw[l], ref64.dw[l]);
    EXPECT_GT(testing::max_abs(fast.dx), 0.0);
  }
}

// Without LayerNorm, capping and scales, q_h . k_h = x^T M_h x' with
// M_h = sum_l blockdiag_k(Wq_l[k][:, h] Wk_l[k][:, h]^T): a rank up to sum_l r_l p_l.
TEST(BilinearMlr, ScoreEqualsDenseBilinearForm) {
  const int64_t Dm = 8, H = 2, N = 3;
  const BilinearMlrOptions options{{2, 1, 1}, H, {}, false, false};
  const MlrProblem pq{1, N, Dm, options, 1.0};
  const MlrData<double> query(pq);
  MlrData<double> key(pq);
  for (auto& w : key.w) w = random_vector<double>(w.size(), 99 + w.size());
  const int64_t E = pq.E();
  std::vector<double> yq(N * H * E), yk(yq.size());
  bilinear_mlr_project_forward<double>({}, View3<const double>(query.x.data(), {1, N, Dm}),
                                       query.weights(pq), options, View4<double>(yq.data(), {1, N, H, E}));
  bilinear_mlr_project_forward<double>({}, View3<const double>(query.x.data(), {1, N, Dm}),
                                       key.weights(pq), options, View4<double>(yk.data(), {1, N, H, E}));
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> M(Dm * Dm, 0.0);
    for (size_t l = 0; l < options.ranks.size(); ++l) {
      const int64_t p = int64_t{1} << l, m = Dm / p, r = options.ranks[l];
      for (int64_t k = 0; k < p; ++k)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < m; ++j)
            for (int64_t c = 0; c < r; ++c)
              M[(k * m + i) * Dm + k * m + j] += query.w[l][(k * m + i) * H * r + h * r + c] *
                                                 key.w[l][(k * m + j) * H * r + h * r + c];
    }
    for (int64_t t = 0; t < N; ++t)
      for (int64_t u = 0; u < N; ++u) {
        double structured = 0, dense = 0;
        for (int64_t e = 0; e < E; ++e) structured += yq[(t * H + h) * E + e] * yk[(u * H + h) * E + e];
        for (int64_t i = 0; i < Dm; ++i)
          for (int64_t j = 0; j < Dm; ++j) dense += query.x[t * Dm + i] * M[i * Dm + j] * query.x[u * Dm + j];
        EXPECT_NEAR(structured, dense, 1e-12 * std::max(1.0, std::abs(dense)));
      }
  }
}

TEST(BilinearMlr, ScalesAndCapLimit) {
  const std::vector<double> scales = bilinear_mlr_level_scales({4, 2}, false);
  EXPECT_DOUBLE_EQ(scales[0], 0.5);
  EXPECT_DOUBLE_EQ(scales[1], 0.5);
  EXPECT_DOUBLE_EQ(bilinear_mlr_level_scales({4, 2}, true)[1], 2.0);
  EXPECT_EQ(bilinear_mlr_output_dim({32, 8, 6}), 32 + 16 + 24);
  EXPECT_DOUBLE_EQ(rms_cap_limit(64, 16), 4.0 / 64);
}

TEST(BilinearMlr, RejectsBadInput) {
  const MlrProblem p{1, 2, 8, {{2, 1, 1}, 2, {}, true, true}, 1.0};
  const MlrData<float> data(p);
  std::vector<float> y(2 * 2 * p.E());
  const View3<const float> x(data.x.data(), {1, 2, 8});
  const View4<float> yv(y.data(), {1, 2, 2, p.E()});
  std::vector<View3<const float>> weights = data.weights(p);
  EXPECT_NO_THROW(bilinear_mlr_project_forward<float>({}, x, weights, p.options, yv));
  EXPECT_THROW(bilinear_mlr_project_forward<float>({}, View3<const float>(data.x.data(), {1, 2, 6}),
                                                   weights, p.options, yv),
               Error);  // Dm = 6 not divisible by 4
  EXPECT_THROW(bilinear_mlr_project_forward<float>(
                   {}, x, weights, p.options, View4<float>(y.data(), {1, 2, 1, p.E()})),
               Error);  // y heads
  weights[1].shape = {2, 4, 1};
  EXPECT_THROW(bilinear_mlr_project_forward<float>({}, x, weights, p.options, yv), Error);
  weights.pop_back();
  EXPECT_THROW(bilinear_mlr_project_forward<float>({}, x, weights, p.options, yv), Error);
}

// ---- BTT -------------------------------------------------------------------------------

struct BttProblem {
  int64_t B, N, D;
  BttOptions options;
  double weight_range;
};

template <typename T>
struct BttData {
  int64_t a, b;
  std::vector<T> x, w1, w2, dy;
  explicit BttData(const BttProblem& p) : a(btt_factors(p.D).a), b(btt_factors(p.D).b) {
    const int64_t H = p.options.heads, s = p.options.rank;
    x = random_vector<T>(p.B * p.N * p.D, 31, -2, 2);
    w1 = random_vector<T>(a * b * H * b * s, 32, -p.weight_range, p.weight_range);
    w2 = random_vector<T>(H * b * a * a * s, 33, -p.weight_range, p.weight_range);
    dy = random_vector<T>(p.B * p.N * H * p.D, 34);
  }
  View3<const T> w1_view(const BttProblem& p, const T* data) const {
    return View3<const T>(data, {a, b, p.options.heads * b * p.options.rank});
  }
  View3<const T> w2_view(const BttProblem& p, const T* data) const {
    return View3<const T>(data, {p.options.heads * b, a, a * p.options.rank});
  }
};

template <typename T>
struct BttResult {
  std::vector<T> y, dx, dw1, dw2;
};

template <typename T>
BttResult<T> run_btt(const BttProblem& p, bool fast, const Context& context = {}) {
  const BttData<T> d(p);
  const int64_t H = p.options.heads;
  BttResult<T> r{std::vector<T>(p.B * p.N * H * p.D), std::vector<T>(d.x.size()),
                 std::vector<T>(d.w1.size()), std::vector<T>(d.w2.size())};
  const View3<const T> x(d.x.data(), {p.B, p.N, p.D});
  const auto w1 = d.w1_view(p, d.w1.data()), w2 = d.w2_view(p, d.w2.data());
  const View4<T> y(r.y.data(), {p.B, p.N, H, p.D});
  const View4<const T> dy(d.dy.data(), {p.B, p.N, H, p.D});
  const View3<T> dx(r.dx.data(), {p.B, p.N, p.D}), dw1(r.dw1.data(), w1.shape), dw2(r.dw2.data(), w2.shape);
  if (fast) {
    btt_project_forward<T>(context, x, w1, w2, p.options, y);
    btt_project_backward<T>(context, x, w1, w2, dy, p.options, dx, dw1, dw2);
  } else {
    btt_reference_forward<T>(x, w1, w2, p.options, y);
    btt_reference_backward<T>(x, w1, w2, dy, p.options, dx, dw1, dw2);
  }
  return r;
}

TEST(Btt, Factors) {
  EXPECT_EQ(btt_factors(64).a, 4);
  EXPECT_EQ(btt_factors(64).b, 16);
  EXPECT_EQ(btt_factors(256).a, 8);
  EXPECT_EQ(btt_factors(256).b, 32);
  EXPECT_EQ(btt_factors(12).b, 4);
  EXPECT_EQ(btt_factors(7).b, 7);
}

TEST(Btt, ReferenceBackwardMatchesFiniteDifferences) {
  for (double range : {1.0, 0.01})
    for (bool layer_norm : {true, false}) {
      const BttProblem p{1, 2, 6, {2, 2, layer_norm, true}, range};
      const BttData<double> d(p);
      const BttResult<double> ref = run_btt<double>(p, false);
      std::vector<double> theta = d.x;
      theta.insert(theta.end(), d.w1.begin(), d.w1.end());
      theta.insert(theta.end(), d.w2.begin(), d.w2.end());
      auto loss = [&](const std::vector<double>& z) {
        std::vector<double> y(d.dy.size());
        const double* w1 = z.data() + d.x.size();
        btt_reference_forward<double>(View3<const double>(z.data(), {p.B, p.N, p.D}),
                                      d.w1_view(p, w1), d.w2_view(p, w1 + d.w1.size()), p.options,
                                      View4<double>(y.data(), {p.B, p.N, 2, p.D}));
        double total = 0;
        for (size_t i = 0; i < y.size(); ++i) total += y[i] * d.dy[i];
        return total;
      };
      std::vector<double> analytic = ref.dx;
      analytic.insert(analytic.end(), ref.dw1.begin(), ref.dw1.end());
      analytic.insert(analytic.end(), ref.dw2.begin(), ref.dw2.end());
      const std::vector<double> numeric = testing::finite_difference_gradient(theta, loss);
      EXPECT_LT(testing::max_abs_diff(numeric, analytic), 2e-6 * std::max(1.0, testing::max_abs(analytic)))
          << "range " << range << " layer_norm " << layer_norm;
    }
}

TEST(Btt, FastMatchesReference) {
  const std::vector<BttProblem> problems{{2, 5, 16, {3, 1, true, true}, 1.0},
                                         {1, 7, 12, {2, 2, true, true}, 0.05},
                                         {1, 3, 64, {2, 1, false, false}, 1.0},
                                         // the in-context regression layer: D = 32, 8 heads
                                         {3, 11, 32, {8, 1, true, true}, 1.0},
                                         {1, 5, 18, {1, 3, true, false}, 0.3}};
  for (const BttProblem& p : problems) {
    const BttResult<float> fast = run_btt<float>(p, true), ref32 = run_btt<float>(p, false);
    const BttResult<double> ref64 = run_btt<double>(p, false);
    testing::expect_close_to_reference(fast.y, ref32.y, ref64.y);
    testing::expect_close_to_reference(fast.dx, ref32.dx, ref64.dx);
    testing::expect_close_to_reference(fast.dw1, ref32.dw1, ref64.dw1);
    testing::expect_close_to_reference(fast.dw2, ref32.dw2, ref64.dw2);
    EXPECT_GT(testing::max_abs(fast.dw1), 0.0);
  }
}

// Stage 2 splits the tokens over threads and the W2 gradient over (i, sigma) rows, each
// summed in token order: the thread count must not change a bit.
TEST(Btt, ThreadCountDoesNotChangeTheResult) {
  const BttProblem p{2, 9, 32, {4, 2, true, true}, 1.0};
  const BttResult<float> one = run_btt<float>(p, true, Context{Device::cpu, 1});
  const BttResult<float> two = run_btt<float>(p, true, Context{Device::cpu, 2});
  EXPECT_EQ(one.y, two.y);
  EXPECT_EQ(one.dx, two.dx);
  EXPECT_EQ(one.dw1, two.dw1);
  EXPECT_EQ(one.dw2, two.dw2);
  EXPECT_GT(testing::max_abs(one.dw2), 0.0f);
}

// Without LayerNorm and capping, y_h = M_h x with
// M_h[alpha b + beta, i b + j] = sum_sigma W2[(h, beta), alpha, (i, sigma)] W1[i, j, (h, beta, sigma)].
TEST(Btt, EqualsDenseMatrix) {
  const BttProblem p{1, 4, 12, {2, 2, false, false}, 1.0};
  const BttData<double> d(p);
  const BttResult<double> fast = run_btt<double>(p, true);
  const int64_t a = d.a, b = d.b, s = 2, H = 2, D = p.D, width = H * b * s;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < p.N; ++t)
      for (int64_t alpha = 0; alpha < a; ++alpha)
        for (int64_t beta = 0; beta < b; ++beta) {
          double dense = 0;
          for (int64_t i = 0; i < a; ++i)
            for (int64_t j = 0; j < b; ++j)
              for (int64_t sigma = 0; sigma < s; ++sigma)
                dense += d.w2[((h * b + beta) * a + alpha) * a * s + i * s + sigma] *
                         d.w1[(i * b + j) * width + (h * b + beta) * s + sigma] * d.x[t * D + i * b + j];
          EXPECT_NEAR(fast.y[(t * H + h) * D + alpha * b + beta], dense, 1e-12);
        }
}

TEST(Btt, RejectsBadInput) {
  const BttProblem p{1, 2, 16, {2, 1, true, true}, 1.0};
  const BttData<float> d(p);
  std::vector<float> y(2 * 2 * 16);
  const View3<const float> x(d.x.data(), {1, 2, 16});
  const View4<float> yv(y.data(), {1, 2, 2, 16});
  EXPECT_NO_THROW(btt_project_forward<float>({}, x, d.w1_view(p, d.w1.data()), d.w2_view(p, d.w2.data()),
                                             p.options, yv));
  EXPECT_THROW(btt_project_forward<float>({}, x, d.w2_view(p, d.w2.data()), d.w1_view(p, d.w1.data()),
                                          p.options, yv),
               Error);  // weights swapped
  BttOptions three_heads = p.options;
  three_heads.heads = 3;
  EXPECT_THROW(btt_project_forward<float>({}, x, d.w1_view(p, d.w1.data()), d.w2_view(p, d.w2.data()),
                                          three_heads, yv),
               Error);
}

}  // namespace
}  // namespace subquad
