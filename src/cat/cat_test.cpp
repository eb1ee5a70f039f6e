// Tests of non-causal CAT and the averaged-key variant: the dense references against float64
// finite differences, the FFT and direct paths against the references over odd and prime N,
// adversarial scores, strided views, determinism and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

const CatConvention kConventions[] = {CatConvention::roll, CatConvention::conv};

TEST(CatReference, BackwardMatchesFiniteDifferences) {
  const CatShape d{2, 5, 2, 3};
  const auto z = random_vector<double>(d.B * d.N * d.H, 1, -2, 2);
  const auto v = random_vector<double>(d.B * d.N * d.H * d.Dv, 2);
  const auto weight = random_vector<double>(v.size(), 3);
  for (CatConvention convention : kConventions) {
    std::vector<double> dz, dv;
    reference::cat_backward(z, v, weight, d, convention, dz, dv);
    const auto fd_z = testing::finite_difference_gradient(z, [&](const std::vector<double>& x) {
      return testing::dot(reference::cat_forward(x, v, d, convention), weight);
    });
    const auto fd_v = testing::finite_difference_gradient(v, [&](const std::vector<double>& x) {
      return testing::dot(reference::cat_forward(z, x, d, convention), weight);
    });
    EXPECT_LT(testing::max_abs_diff(dz, fd_z), 1e-8);
    EXPECT_LT(testing::max_abs_diff(dv, fd_v), 1e-8);
    EXPECT_GT(testing::max_abs(dz), 1e-3);
  }
}

TEST(CatReference, ConventionsAreTheirDenseMatrices) {
  // roll: row i is s rolled right by i; conv: row i is s reversed and rolled.
  const std::vector<double> s{0.1, 0.2, 0.3, 0.4};
  const auto roll = reference::cat_matrix(s, CatConvention::roll);
  const auto conv = reference::cat_matrix(s, CatConvention::conv);
  EXPECT_EQ(roll[1 * 4 + 2], s[1]);  // A[1, 2] = s[2 - 1]
  EXPECT_EQ(conv[1 * 4 + 2], s[3]);  // A[1, 2] = s[(1 - 2) mod 4]
}

struct Sizes {
  int64_t B, N, H, Dv;
};

void expect_fast_matches_reference(const Sizes& size, CatConvention convention, CatPath path,
                                   uint64_t seed, double z_range = 3.0) {
  const CatShape d{size.B, size.N, size.H, size.Dv};
  const auto z64 = random_vector<double>(d.B * d.N * d.H, seed, -z_range, z_range);
  const auto v64 = random_vector<double>(d.B * d.N * d.H * d.Dv, seed + 1);
  const auto g64 = random_vector<double>(v64.size(), seed + 2);
  const auto z = cast_vector<float>(z64), v = cast_vector<float>(v64), g = cast_vector<float>(g64);
  const auto z32 = cast_vector<double>(z), v32 = cast_vector<double>(v),
             g32 = cast_vector<double>(g);
  const CatOptions options{convention, path};
  SCOPED_TRACE(::testing::Message() << "N=" << d.N << " H=" << d.H << " Dv=" << d.Dv
                                    << " convention=" << static_cast<int>(convention)
                                    << " path=" << static_cast<int>(path));

  std::vector<float> out(v.size());
  cat_forward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv), options,
                     view4(out, d.B, d.N, d.H, d.Dv));
  // The truth is the float64 reference on the float32 inputs; the float32 reference's own
  // error sets the tolerance.
  const auto truth = reference::cat_forward(z32, v32, d, convention);
  const auto ref32 = reference::cat_forward(z, v, d, convention);
  testing::expect_close_to_reference(out, ref32, truth, 2.0, 16.0);
  EXPECT_GT(testing::max_abs(out), 0.0);

  std::vector<float> dz(z.size()), dv(v.size());
  cat_backward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv),
                      view4(g, d.B, d.N, d.H, d.Dv), options, view3(dz, d.B, d.N, d.H),
                      view4(dv, d.B, d.N, d.H, d.Dv));
  std::vector<double> dz64, dv64;
  reference::cat_backward(z32, v32, g32, d, convention, dz64, dv64);
  std::vector<float> dz_ref, dv_ref;
  reference::cat_backward(z, v, g, d, convention, dz_ref, dv_ref);
  testing::expect_close_to_reference(dz, dz_ref, dz64, 2.0, 16.0);
  testing::expect_close_to_reference(dv, dv_ref, dv64, 2.0, 16.0);
}

TEST(Cat, FastMatchesReferenceOverSizes) {
  uint64_t seed = 10;
  for (int64_t N : {1, 2, 3, 7, 16, 97, 256, 257})
    for (const Sizes& size : {Sizes{1, N, 1, 1}, Sizes{2, N, 3, 5}, Sizes{1, N, 2, 17}})
      for (CatConvention convention : kConventions)
        for (CatPath path : {CatPath::automatic, CatPath::fft, CatPath::direct})
          expect_fast_matches_reference(size, convention, path, seed += 3);
}

TEST(Cat, FastMatchesReferenceOverSeveralColumnPasses) {
  // Dv beyond one pass of the forward (64 columns) and of the backward (32), odd and even, so
  // full, partial and single-column passes and a last pair with a zero partner all run.
  uint64_t seed = 300;
  for (int64_t Dv : {70, 131})
    for (CatConvention convention : kConventions)
      expect_fast_matches_reference(Sizes{2, 100, 2, Dv}, convention, CatPath::fft, seed += 3);
}

TEST(Cat, ColumnTransformPathMatchesReference) {
  // Power-of-two N in float32 runs the column transform on v's own [N, Dv] slices: direct and
  // four-step lengths, several heads (row stride H Dv), partial column groups. Forward only at
  // N = 2048 (the dense backward reference would take a minute); the shapes above cover it.
  uint64_t seed = 500;
  for (const Sizes& size : {Sizes{2, 256, 2, 16}, Sizes{1, 512, 1, 1}})
    for (CatConvention convention : kConventions)
      expect_fast_matches_reference(size, convention, CatPath::automatic, seed += 3);
  const CatShape d{1, 2048, 2, 19};
  const auto z = cast_vector<float>(random_vector<double>(d.B * d.N * d.H, 41, -3.0, 3.0));
  const auto v = cast_vector<float>(random_vector<double>(d.B * d.N * d.H * d.Dv, 42));
  for (CatConvention convention : kConventions) {
    std::vector<float> out(v.size());
    cat_forward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv),
                       {convention, CatPath::automatic}, view4(out, d.B, d.N, d.H, d.Dv));
    const auto truth = reference::cat_forward(cast_vector<double>(z), cast_vector<double>(v), d,
                                              convention);
    const auto ref32 = reference::cat_forward(z, v, d, convention);
    testing::expect_close_to_reference(out, ref32, truth, 2.0, 16.0);
    EXPECT_GT(testing::max_abs(out), 0.0);
  }
}

TEST(Cat, ColumnAndPackedPathsAtAliasingRowStrides) {
  // Rows 4 KiB apart (1024 floats) take the packed rows at N = 1024 .. 4096, other strides the
  // column transform (cat.cpp, kAliasingStrideBytes): both against the reference, v's first Dv
  // columns of [N, stride] buffers, out written with the same stride, the gaps left untouched.
  const int64_t N = 1024, Dv = 7;
  const CatShape d{1, N, 1, Dv};
  const auto z = cast_vector<float>(random_vector<double>(N, 61, -3.0, 3.0));
  const auto v = cast_vector<float>(random_vector<double>(N * Dv, 62));
  for (CatConvention convention : kConventions) {
    const auto truth = reference::cat_forward(cast_vector<double>(z), cast_vector<double>(v), d,
                                              convention);
    const auto ref32 = reference::cat_forward(z, v, d, convention);
    for (const int64_t stride : {int64_t(1024), int64_t(1040)}) {
      SCOPED_TRACE(::testing::Message() << "row stride " << stride);
      std::vector<float> wide(N * stride, -7.0f), out_wide(N * stride, 7.0f);
      for (int64_t n = 0; n < N; ++n) std::copy_n(v.data() + n * Dv, Dv, wide.data() + n * stride);
      const View4<const float> v_view(wide.data(), {1, N, 1, Dv}, {N * stride, stride, Dv, 1});
      const View4<float> out_view(out_wide.data(), {1, N, 1, Dv}, {N * stride, stride, Dv, 1});
      cat_forward<float>({}, view3(z, 1, N, 1), v_view, {convention, CatPath::automatic},
                         out_view);
      std::vector<float> out(N * Dv);
      for (int64_t n = 0; n < N; ++n) {
        std::copy_n(out_wide.data() + n * stride, Dv, out.data() + n * Dv);
        ASSERT_EQ(out_wide[n * stride + Dv], 7.0f);
      }
      testing::expect_close_to_reference(out, ref32, truth, 2.0, 16.0);
      EXPECT_GT(testing::max_abs(out), 0.0);
    }
  }
}

TEST(Cat, FastMatchesReferenceLargeN) {
  for (CatConvention convention : kConventions)
    expect_fast_matches_reference(Sizes{1, 1000, 1, 8}, convention, CatPath::automatic, 77);
}

TEST(Cat, Float64PathsAgreeToRoundOff) {
  const CatShape d{1, 211, 2, 6};
  const auto z = random_vector<double>(d.B * d.N * d.H, 5, -4, 4);
  const auto v = random_vector<double>(d.B * d.N * d.H * d.Dv, 6);
  for (CatConvention convention : kConventions)
    for (CatPath path : {CatPath::fft, CatPath::direct}) {
      std::vector<double> out(v.size());
      cat_forward<double>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv),
                          {convention, path}, view4(out, d.B, d.N, d.H, d.Dv));
      EXPECT_LT(testing::max_abs_diff(out, reference::cat_forward(z, v, d, convention)), 1e-13);
    }
}

TEST(Cat, AdversarialScores) {
  const CatShape d{1, 129, 1, 4};
  const auto v = random_vector<float>(d.N * d.Dv, 9);
  const float big = 1e30f;
  std::vector<std::vector<float>> cases = {
      std::vector<float>(d.N, 0.0f),    // constant: uniform weights
      std::vector<float>(d.N, -big),    // constant and huge negative
      std::vector<float>(d.N, 88.0f)};  // exp would overflow float without the max shift
  std::vector<float> spike(d.N, -big);
  spike[17] = big;  // one-hot: out is v rolled by 17
  cases.push_back(spike);
  std::vector<float> wide = random_vector<float>(d.N, 4, -300, 300);
  cases.push_back(wide);
  for (const auto& z : cases)
    for (CatConvention convention : kConventions)
      for (CatPath path : {CatPath::fft, CatPath::direct}) {
        std::vector<float> out(v.size());
        cat_forward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv),
                           {convention, path}, view4(out, d.B, d.N, d.H, d.Dv));
        const auto truth =
            reference::cat_forward(cast_vector<double>(z), cast_vector<double>(v), d, convention);
        EXPECT_TRUE(testing::all_finite(out));
        EXPECT_LT(testing::max_abs_diff(out, truth), 2e-6);
      }
}

TEST(Cat, ImpliedMatrixRowsSumToOne) {
  // With v = identity (Dv = N) the output is the attention matrix itself.
  const int64_t N = 67;
  const auto z = random_vector<float>(N, 12, -5, 5);
  std::vector<float> identity(N * N, 0.0f);
  for (int64_t i = 0; i < N; ++i) identity[i * N + i] = 1.0f;
  for (CatConvention convention : kConventions) {
    std::vector<float> A(N * N);
    cat_forward<float>({}, view3(z, 1, N, 1), view4(identity, 1, N, 1, N), {convention},
                       view4(A, 1, N, 1, N));
    const auto truth = reference::cat_matrix(
        reference::cat_scores_softmax(cast_vector<double>(z), CatShape{1, N, 1, N}, 0, 0),
        convention);
    EXPECT_LT(testing::max_abs_diff(A, truth), 1e-6);
    for (int64_t i = 0; i < N; ++i) {
      double total = 0;
      for (int64_t j = 0; j < N; ++j) total += A[i * N + j];
      EXPECT_NEAR(total, 1.0, 1e-5);
    }
  }
}

TEST(Cat, StridedViews) {
  // z and dz are the last H heads of [B, N, 2H] tensors; v, dout, out and dv are the first
  // Dv columns of [B, N, H, 2 Dv] tensors.
  const int64_t B = 2, N = 101, H = 3, Dv = 5;
  const auto zbig = random_vector<float>(B * N * 2 * H, 20, -2, 2);
  const auto vbig = random_vector<float>(B * N * H * 2 * Dv, 21);
  const auto gbig = random_vector<float>(B * N * H * 2 * Dv, 22);
  const View3<const float> z(zbig.data() + H, {B, N, H}, {N * 2 * H, 2 * H, 1});
  const auto strided = [&](const float* data) {
    return View4<const float>(data, {B, N, H, Dv}, {N * H * 2 * Dv, H * 2 * Dv, 2 * Dv, 1});
  };
  std::vector<float> zc(B * N * H), vc(B * N * H * Dv), gc(vc.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        zc[(b * N + n) * H + h] = z(b, n, h);
        for (int64_t c = 0; c < Dv; ++c) {
          vc[((b * N + n) * H + h) * Dv + c] = strided(vbig.data())(b, n, h, c);
          gc[((b * N + n) * H + h) * Dv + c] = strided(gbig.data())(b, n, h, c);
        }
      }
  for (CatPath path : {CatPath::fft, CatPath::direct}) {
    std::vector<float> outbig(vbig.size(), 7.0f), out(vc.size());
    const View4<float> out_view(outbig.data(), {B, N, H, Dv}, {N * H * 2 * Dv, H * 2 * Dv, 2 * Dv, 1});
    cat_forward<float>({}, z, strided(vbig.data()), {CatConvention::roll, path}, out_view);
    cat_forward<float>({}, view3(zc, B, N, H), view4(vc, B, N, H, Dv), {CatConvention::roll, path},
                       view4(out, B, N, H, Dv));
    std::vector<float> dzbig(zbig.size(), 7.0f), dvbig(vbig.size(), 7.0f), dz(zc.size()),
        dv(vc.size());
    const View3<float> dz_view(dzbig.data() + H, {B, N, H}, {N * 2 * H, 2 * H, 1});
    const View4<float> dv_view(dvbig.data(), {B, N, H, Dv}, {N * H * 2 * Dv, H * 2 * Dv, 2 * Dv, 1});
    cat_backward<float>({}, z, strided(vbig.data()), strided(gbig.data()),
                        {CatConvention::roll, path}, dz_view, dv_view);
    cat_backward<float>({}, view3(zc, B, N, H), view4(vc, B, N, H, Dv), view4(gc, B, N, H, Dv),
                        {CatConvention::roll, path}, view3(dz, B, N, H), view4(dv, B, N, H, Dv));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(dz_view(b, n, h), dz[(b * N + n) * H + h]);
          EXPECT_EQ(dzbig[(b * N + n) * 2 * H + h], 7.0f);  // untouched gaps
          for (int64_t c = 0; c < Dv; ++c) {
            EXPECT_EQ(out_view(b, n, h, c), out[((b * N + n) * H + h) * Dv + c]);
            EXPECT_EQ(dv_view(b, n, h, c), dv[((b * N + n) * H + h) * Dv + c]);
            EXPECT_EQ(outbig[((b * N + n) * H + h) * 2 * Dv + Dv + c], 7.0f);
          }
        }
  }
}

TEST(Cat, DeterministicAcrossRunsAndThreads) {
  const int64_t B = 2, N = 300, H = 4, Dv = 9;
  const auto z = random_vector<float>(B * N * H, 30, -3, 3);
  const auto v = random_vector<float>(B * N * H * Dv, 31);
  std::vector<float> first(v.size()), second(v.size());
  cat_forward<float>(Context{Device::cpu, 1}, view3(z, B, N, H), view4(v, B, N, H, Dv), {},
                     view4(first, B, N, H, Dv));
  cat_forward<float>(Context{Device::cpu, 3}, view3(z, B, N, H), view4(v, B, N, H, Dv), {},
                     view4(second, B, N, H, Dv));
  EXPECT_EQ(first, second);
}

TEST(Cat, BadInput) {
  const int64_t B = 1, N = 8, H = 2, Dv = 3;
  auto z = random_vector<float>(B * N * H, 40);
  const auto v = random_vector<float>(B * N * H * Dv, 41);
  std::vector<float> out(v.size()), dz(z.size()), dv(v.size());
  // z with a different N than v.
  EXPECT_THROW(cat_forward<float>({}, view3(z, B, N - 1, H), view4(v, B, N, H, Dv), {},
                                  view4(out, B, N, H, Dv)),
               Error);
  EXPECT_THROW(cat_forward<float>({}, view3(z, B, N, H), view4(v, B, N, H, Dv), {},
                                  view4(out, B, N, H, Dv - 1)),
               Error);
  EXPECT_THROW(cat_backward<float>({}, view3(z, B, N, H), view4(v, B, N, H, Dv),
                                   view4(v, B, N, H, Dv - 1), {}, view3(dz, B, N, H),
                                   view4(dv, B, N, H, Dv)),
               Error);
}

TEST(CatAvgKey, ReferenceBackwardMatchesFiniteDifferences) {
  const CatShape d{1, 6, 2, 3};
  const int64_t D = 4;
  const double scale = 0.7;
  const auto q = random_vector<double>(d.B * d.N * d.H * D, 50);
  const auto k = random_vector<double>(q.size(), 51);
  const auto v = random_vector<double>(d.B * d.N * d.H * d.Dv, 52);
  const auto weight = random_vector<double>(v.size(), 53);
  std::vector<double> dq, dk, dv;
  reference::cat_avgkey_backward(q, k, v, weight, d, D, scale, CatConvention::roll, dq, dk, dv);
  const auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk) {
    return testing::dot(reference::cat_forward(reference::cat_avgkey_scores(qq, kk, d, D, scale),
                                               v, d, CatConvention::roll),
                        weight);
  };
  const auto fd_q = testing::finite_difference_gradient(
      q, [&](const std::vector<double>& x) { return loss(x, k); });
  const auto fd_k = testing::finite_difference_gradient(
      k, [&](const std::vector<double>& x) { return loss(q, x); });
  EXPECT_LT(testing::max_abs_diff(dq, fd_q), 1e-8);
  EXPECT_LT(testing::max_abs_diff(dk, fd_k), 1e-8);
  EXPECT_GT(testing::max_abs(dk), 1e-4);
}

TEST(CatAvgKey, FastMatchesReference) {
  for (int64_t N : {1, 7, 97, 300}) {
    const CatShape d{2, N, 3, 5};
    const int64_t D = 8;
    const auto q64 = random_vector<double>(d.B * d.N * d.H * D, 60 + N, -2, 2);
    const auto k64 = random_vector<double>(q64.size(), 61 + N, -2, 2);
    const auto v64 = random_vector<double>(d.B * d.N * d.H * d.Dv, 62 + N);
    const auto g64 = random_vector<double>(v64.size(), 63 + N);
    const auto q = cast_vector<float>(q64), k = cast_vector<float>(k64),
               v = cast_vector<float>(v64), g = cast_vector<float>(g64);
    const double scale = 1 / std::sqrt(static_cast<double>(D));  // the default
    std::vector<float> out(v.size()), dq(q.size()), dk(k.size()), dv(v.size());
    cat_avgkey_forward<float>({}, view4(q, d.B, N, d.H, D), view4(k, d.B, N, d.H, D),
                              view4(v, d.B, N, d.H, d.Dv), {}, view4(out, d.B, N, d.H, d.Dv));
    cat_avgkey_backward<float>({}, view4(q, d.B, N, d.H, D), view4(k, d.B, N, d.H, D),
                               view4(v, d.B, N, d.H, d.Dv), view4(g, d.B, N, d.H, d.Dv), {},
                               view4(dq, d.B, N, d.H, D), view4(dk, d.B, N, d.H, D),
                               view4(dv, d.B, N, d.H, d.Dv));
    const auto q32 = cast_vector<double>(q), k32 = cast_vector<double>(k),
               v32 = cast_vector<double>(v), g32 = cast_vector<double>(g);
    const auto truth = reference::cat_forward(reference::cat_avgkey_scores(q32, k32, d, D, scale),
                                              v32, d, CatConvention::roll);
    const auto ref32 = reference::cat_forward(
        reference::cat_avgkey_scores(q, k, d, D, static_cast<float>(scale)), v, d,
        CatConvention::roll);
    testing::expect_close_to_reference(out, ref32, truth, 2.0, 16.0);
    std::vector<double> dq64, dk64, dv64;
    reference::cat_avgkey_backward(q32, k32, v32, g32, d, D, scale, CatConvention::roll, dq64,
                                   dk64, dv64);
    std::vector<float> dq32, dk32, dv32;
    reference::cat_avgkey_backward(q, k, v, g, d, D, static_cast<float>(scale),
                                   CatConvention::roll, dq32, dk32, dv32);
    testing::expect_close_to_reference(dq, dq32, dq64, 2.0, 16.0);
    testing::expect_close_to_reference(dk, dk32, dk64, 2.0, 16.0);
    testing::expect_close_to_reference(dv, dv32, dv64, 2.0, 16.0);
  }
}

TEST(CatAvgKey, BadInput) {
  const auto q = random_vector<float>(2 * 5 * 3, 70);
  const auto v = random_vector<float>(2 * 5 * 4, 71);
  std::vector<float> out(v.size());
  EXPECT_THROW(cat_avgkey_forward<float>({}, view4(q, 1, 2, 5, 3), view4(q, 1, 2, 5, 2),
                                         view4(v, 1, 2, 5, 4), {}, view4(out, 1, 2, 5, 4)),
               Error);
  EXPECT_THROW(cat_avgkey_forward<float>({}, view4(q, 1, 2, 5, 3), view4(q, 1, 2, 5, 3),
                                         view4(v, 1, 2, 5, 4),
                                         {std::numeric_limits<double>::infinity()},
                                         view4(out, 1, 2, 5, 4)),
               Error);
}

}  // namespace
}  // namespace subquad
