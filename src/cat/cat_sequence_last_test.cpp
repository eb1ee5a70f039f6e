// Tests of non-causal CAT on sequence-last memory (cat_sequence_last.cpp): v, out, dout, dv as
// [B, N, H, Dv] views of [B, H, Dv, N] arrays and z, dz as views of [B, H, N], forward and
// backward, FFT and direct paths, against the float64 dense reference over odd and prime
// sizes; mixed layouts; views that are neither layout refused.
#include <gtest/gtest.h>

#include "cat/cat_ref.h"
#include "cat/cat_sequence_last_test_util.h"
#include "cat/cat_test_util.h"
#include "subquad/cat.h"

namespace subquad {
namespace {

using reference::CatShape;
using testing::cast_vector;
using testing::random_vector;
using testing::scores_view;
using testing::SequenceLast;
using testing::view3;
using testing::view4;

// Which of the views are sequence-last: all of them, or v / out only (the others standard).
enum class Layouts { all, values_only, outputs_only };

void expect_matches_reference(const CatShape& d, CatConvention convention, CatPath path,
                              Layouts layouts, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << d.B << " N=" << d.N << " H=" << d.H << " Dv=" << d.Dv
                                    << " convention=" << int(convention) << " path=" << int(path)
                                    << " layouts=" << int(layouts));
  const auto z = cast_vector<float>(random_vector<double>(d.B * d.N * d.H, seed, -3, 3));
  const auto v = cast_vector<float>(random_vector<double>(d.B * d.N * d.H * d.Dv, seed + 1));
  const auto g = cast_vector<float>(random_vector<double>(v.size(), seed + 2));
  const bool inputs_last = layouts != Layouts::outputs_only;
  const bool outputs_last = layouts != Layouts::values_only;
  const SequenceLast zl = SequenceLast::from(z, d.B, d.N, d.H, 1);
  const SequenceLast vl = SequenceLast::from(v, d.B, d.N, d.H, d.Dv);
  const SequenceLast gl = SequenceLast::from(g, d.B, d.N, d.H, d.Dv);
  const View3<const float> z_view =
      layouts == Layouts::all ? scores_view(zl) : view3(z, d.B, d.N, d.H);
  const View4<const float> v_view = inputs_last ? vl.view() : view4(v, d.B, d.N, d.H, d.Dv);
  const View4<const float> g_view = inputs_last ? gl.view() : view4(g, d.B, d.N, d.H, d.Dv);
  const CatOptions options{convention, path};

  SequenceLast outl(d.B, d.N, d.H, d.Dv, 7.0f), dvl(d.B, d.N, d.H, d.Dv, 7.0f),
      dzl(d.B, d.N, d.H, 1, 7.0f);
  std::vector<float> out(v.size(), 7.0f), dv(v.size(), 7.0f), dz(z.size(), 7.0f);
  cat_forward<float>({}, z_view, v_view, options,
                     outputs_last ? outl.view() : view4(out, d.B, d.N, d.H, d.Dv));
  cat_backward<float>({}, z_view, v_view, g_view, options,
                      layouts == Layouts::all ? scores_view(dzl) : view3(dz, d.B, d.N, d.H),
                      outputs_last ? dvl.view() : view4(dv, d.B, d.N, d.H, d.Dv));
  if (outputs_last) {
    out = outl.standard();
    dv = dvl.standard();
  }
  if (layouts == Layouts::all) dz = dzl.standard();

  const auto z32 = cast_vector<double>(z), v32 = cast_vector<double>(v),
             g32 = cast_vector<double>(g);
  testing::expect_close_to_reference(out, reference::cat_forward(z, v, d, convention),
                                     reference::cat_forward(z32, v32, d, convention), 2.0, 16.0);
  EXPECT_GT(testing::max_abs(out), 0.0);
  std::vector<double> dz64, dv64;
  reference::cat_backward(z32, v32, g32, d, convention, dz64, dv64);
  std::vector<float> dz32, dv32;
  reference::cat_backward(z, v, g, d, convention, dz32, dv32);
  testing::expect_close_to_reference(dz, dz32, dz64, 2.0, 16.0);
  testing::expect_close_to_reference(dv, dv32, dv64, 2.0, 16.0);
  if (d.N > 1) {
    EXPECT_GT(testing::max_abs(dz), 0.0);
  }
  EXPECT_GT(testing::max_abs(dv), 0.0);
}

const CatConvention kConventions[] = {CatConvention::roll, CatConvention::conv};

TEST(CatSequenceLast, MatchesReferenceOverSizes) {
  uint64_t seed = 500;
  for (int64_t N : {1, 2, 7, 24, 25, 97, 257})
    for (const CatShape& d : {CatShape{1, N, 1, 2}, CatShape{2, N, 3, 5}, CatShape{1, N, 2, 17}})
      for (CatConvention convention : kConventions)
        for (CatPath path : {CatPath::automatic, CatPath::fft, CatPath::direct})
          expect_matches_reference(d, convention, path, Layouts::all, seed += 3);
}

TEST(CatSequenceLast, HeadDim59AndLongerSequences) {
  for (CatConvention convention : kConventions) {
    expect_matches_reference(CatShape{1, 211, 2, 59}, convention, CatPath::automatic, Layouts::all,
                             700);
    for (int64_t N : {1024, 1025})  // the dense reference is O(N^2) per column
      expect_matches_reference(CatShape{1, N, 1, 3}, convention, CatPath::automatic, Layouts::all,
                               710 + N);
  }
}

TEST(CatSequenceLast, MixedLayouts) {
  uint64_t seed = 800;
  for (Layouts layouts : {Layouts::values_only, Layouts::outputs_only})
    for (int64_t N : {7, 97})
      for (CatPath path : {CatPath::fft, CatPath::direct})
        for (CatConvention convention : kConventions)
          expect_matches_reference(CatShape{2, N, 3, 5}, convention, path, layouts, seed += 3);
}

TEST(CatSequenceLast, DeterministicAcrossThreads) {
  const int64_t B = 2, N = 300, H = 4, Dv = 9;
  const auto z = random_vector<float>(B * N * H, 30, -3, 3);
  const SequenceLast v = SequenceLast::from(random_vector<float>(B * N * H * Dv, 31), B, N, H, Dv);
  SequenceLast first(B, N, H, Dv), second(B, N, H, Dv);
  cat_forward<float>(Context{Device::cpu, 1}, view3(z, B, N, H), v.view(), {}, first.view());
  cat_forward<float>(Context{Device::cpu, 3}, view3(z, B, N, H), v.view(), {}, second.view());
  EXPECT_EQ(first.data, second.data);
}

// Non-causal and causal CAT share the layout checks; both must refuse such a view.
TEST(CatSequenceLast, NeitherAxisContiguousIsRefused) {
  const int64_t B = 1, N = 8, H = 2, Dv = 3;
  const auto z = random_vector<float>(B * N * H, 40);
  const auto big = random_vector<float>(2 * B * N * H * Dv, 41);
  std::vector<float> out(B * N * H * Dv);
  // Every other element along both the sequence and the channels.
  const View4<const float> v(big.data(), {B, N, H, Dv}, {2 * N * H * Dv, 2, 2 * N * Dv, 2 * N});
  const auto expect_refused = [](const auto& call) {
    try {
      call();
      FAIL() << "expected an Error";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("v: the last dimension"), std::string::npos)
          << error.what();
    }
  };
  expect_refused([&] { cat_forward<float>({}, view3(z, B, N, H), v, {}, view4(out, B, N, H, Dv)); });
  expect_refused(
      [&] { cat_causal_forward<float>({}, view3(z, B, N, H), v, {}, view4(out, B, N, H, Dv)); });
}

}  // namespace
}  // namespace subquad
