// Tests of causal CAT on sequence-last memory (cat_causal.cpp): z, dz [B, N, H] views of
// [B, H, N] arrays and v, out, dout, dv [B, N, H, Dv] views of [B, H, Dv, N] arrays, and
// mixes of the two layouts, forward and backward, against the float64 dense reference over
// odd and prime sizes, and against the [B, N, H, Dv] layout (the same arithmetic, up to the
// grouping of vectorised sums, which follows the rows' alignment).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

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

// Which views are sequence-last: all; the inputs z, v, dout (outputs standard); the outputs
// out, dz, dv (inputs standard); or v and dv only.
enum class Layouts { all, inputs_only, outputs_only, values_only };

struct Case {
  CatShape d;
  CatPath path;
  Layouts layouts;
  uint64_t seed;
  double z_range = 3.0;
};

void expect_matches(const Case& t) {
  const CatShape& d = t.d;
  SCOPED_TRACE(::testing::Message() << "B=" << d.B << " N=" << d.N << " H=" << d.H << " Dv=" << d.Dv
                                    << " path=" << int(t.path) << " layouts=" << int(t.layouts)
                                    << " range=" << t.z_range);
  const auto z =
      cast_vector<float>(random_vector<double>(d.B * d.N * d.H, t.seed, -t.z_range, t.z_range));
  const auto v = cast_vector<float>(random_vector<double>(d.B * d.N * d.H * d.Dv, t.seed + 1));
  const auto g = cast_vector<float>(random_vector<double>(v.size(), t.seed + 2));
  const bool all = t.layouts == Layouts::all;
  const bool z_last = all || t.layouts == Layouts::inputs_only;
  const bool v_last = t.layouts != Layouts::outputs_only;
  const bool g_last = all || t.layouts == Layouts::inputs_only;
  const bool out_last = all || t.layouts == Layouts::outputs_only;
  const bool dz_last = out_last;
  const bool dv_last = t.layouts != Layouts::inputs_only;

  const SequenceLast zl = SequenceLast::from(z, d.B, d.N, d.H, 1);
  const SequenceLast vl = SequenceLast::from(v, d.B, d.N, d.H, d.Dv);
  const SequenceLast gl = SequenceLast::from(g, d.B, d.N, d.H, d.Dv);
  const View3<const float> z_view = z_last ? scores_view(zl) : view3(z, d.B, d.N, d.H);
  const View4<const float> v_view = v_last ? vl.view() : view4(v, d.B, d.N, d.H, d.Dv);
  const View4<const float> g_view = g_last ? gl.view() : view4(g, d.B, d.N, d.H, d.Dv);
  const CatCausalOptions options{t.path};

  SequenceLast outl(d.B, d.N, d.H, d.Dv, 7.0f), dvl(d.B, d.N, d.H, d.Dv, 7.0f),
      dzl(d.B, d.N, d.H, 1, 7.0f);
  std::vector<float> out(v.size(), 7.0f), dv(v.size(), 7.0f), dz(z.size(), 7.0f);
  const View4<float> out_view = out_last ? outl.view() : view4(out, d.B, d.N, d.H, d.Dv);
  cat_causal_forward<float>({}, z_view, v_view, options, out_view);
  cat_causal_backward<float>({}, z_view, v_view, View4<const float>(out_view), g_view, options,
                             dz_last ? scores_view(dzl) : view3(dz, d.B, d.N, d.H),
                             dv_last ? dvl.view() : view4(dv, d.B, d.N, d.H, d.Dv));
  if (out_last) out = outl.standard();
  if (dv_last) dv = dvl.standard();
  if (dz_last) dz = dzl.standard();

  // The [B, N, H, Dv] layout runs the same arithmetic: equal up to the grouping of the direct
  // blocks' vectorised dot products (it follows the rows' alignment), a few ulps.
  std::vector<float> out_std(v.size()), dz_std(z.size()), dv_std(v.size());
  cat_causal_forward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv), options,
                            view4(out_std, d.B, d.N, d.H, d.Dv));
  cat_causal_backward<float>({}, view3(z, d.B, d.N, d.H), view4(v, d.B, d.N, d.H, d.Dv),
                             view4(std::as_const(out_std), d.B, d.N, d.H, d.Dv),
                             view4(g, d.B, d.N, d.H, d.Dv), options, view3(dz_std, d.B, d.N, d.H),
                             view4(dv_std, d.B, d.N, d.H, d.Dv));
  for (const auto& [fast, standard] : {std::pair{&out, &out_std}, std::pair{&dz, &dz_std},
                                       std::pair{&dv, &dv_std}})
    EXPECT_LE(testing::max_abs_diff(*fast, *standard),
              1e-6 * std::max(1.0, testing::max_abs(*standard)));

  const auto z64 = cast_vector<double>(z), v64 = cast_vector<double>(v),
             g64 = cast_vector<double>(g);
  testing::expect_close_to_reference(out, reference::cat_causal_forward(z, v, d),
                                     reference::cat_causal_forward(z64, v64, d), 2.0, 16.0);
  EXPECT_GT(testing::max_abs(out), 0.0);
  std::vector<double> dz64, dv64;
  reference::cat_causal_backward(z64, v64, g64, d, dz64, dv64);
  std::vector<float> dz32, dv32;
  reference::cat_causal_backward(z, v, g, d, dz32, dv32);
  testing::expect_close_to_reference(dz, dz32, dz64, 2.0, 16.0);
  testing::expect_close_to_reference(dv, dv32, dv64, 2.0, 16.0);
  if (d.N > 1) {
    EXPECT_GT(testing::max_abs(dz), 0.0);
  }
  EXPECT_GT(testing::max_abs(dv), 0.0);
}

TEST(CatCausalSequenceLast, MatchesReferenceOverSizes) {
  uint64_t seed = 1200;
  for (int64_t N : {1, 2, 7, 97, 257})
    for (CatPath path : {CatPath::automatic, CatPath::fft, CatPath::direct})
      for (const CatShape& d : {CatShape{1, N, 1, 2}, CatShape{2, N, 3, 5}})
        expect_matches({d, path, Layouts::all, seed += 3});
  // Dv beyond one forward pass (64 columns) and one backward pass (32); head dim 59.
  expect_matches({CatShape{1, 150, 2, 131}, CatPath::fft, Layouts::all, 1300});
  expect_matches({CatShape{1, 211, 2, 59}, CatPath::automatic, Layouts::all, 1310});
  expect_matches({CatShape{1, 1025, 1, 3}, CatPath::automatic, Layouts::all, 1320});
}

TEST(CatCausalSequenceLast, SplitPlansAndMixedLayouts) {
  // A score range of 200 splits the plan into direct, own and cross blocks (cat_causal_test):
  // the accumulator's rows, the direct blocks' token rows and the FFT columns all meet.
  uint64_t seed = 1400;
  for (Layouts layouts :
       {Layouts::all, Layouts::inputs_only, Layouts::outputs_only, Layouts::values_only})
    for (CatPath path : {CatPath::automatic, CatPath::fft})
      expect_matches({CatShape{1, 700, 2, 3}, path, layouts, seed += 3, 100.0});
  for (Layouts layouts : {Layouts::inputs_only, Layouts::outputs_only, Layouts::values_only})
    for (int64_t N : {7, 97})
      expect_matches({CatShape{2, N, 3, 5}, CatPath::automatic, layouts, seed += 3});
}

}  // namespace
}  // namespace subquad
