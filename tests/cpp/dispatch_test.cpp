// Every public operator goes through the one dispatch on Context::device
// (src/common/dispatch.h): with a device no backend is built for, each one passes its
// boundary checks and then refuses with an Error naming context.device, writing nothing.
// The families' own tests prove what the CPU backend computes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cat/cat_fft_lower_bound.h"
#include "subquad/cat.h"
#include "subquad/circulant2d.h"
#include "subquad/exact.h"
#include "subquad/structured.h"
#include "subquad/wildcat.h"

namespace subquad {
namespace {

// A Device value past the last one built: what a context for a backend this build lacks
// holds.
Context unknown_device() {
  Context context;
  context.device = static_cast<Device>(static_cast<int>(Device::cpu) + 1);
  return context;
}

// Runs `op`, expects an Error naming context.device and `out` untouched (all 7s).
void expect_refused(const char* name, const std::function<void()>& op,
                    const std::vector<double>& out) {
  SCOPED_TRACE(name);
  try {
    op();
    ADD_FAILURE() << name << " ran without a backend";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("context.device"), std::string::npos) << error.what();
  }
  for (double x : out) ASSERT_EQ(x, 7.0) << name << " wrote its output";
}

constexpr int64_t B = 1, N = 4, H = 2, D = 4, Dv = 3;

TEST(Dispatch, EveryOperatorRefusesAnUnknownDevice) {
  const Context context = unknown_device();
  std::vector<double> q(B * N * H * D, 0.25), k = q, v(B * N * H * Dv, 0.5), z(B * N * H, 0.1);
  std::vector<double> out(B * N * H * Dv, 7.0), lse(B * H * N, 0.0), grad_q(q.size(), 7.0),
      grad_k(q.size(), 7.0), grad_v(v.size(), 7.0), grad_z(z.size(), 7.0);
  const View4<const double> q4(q.data(), {B, N, H, D}), k4(k.data(), {B, N, H, D}),
      v4(v.data(), {B, N, H, Dv}), dout4 = v4, out_in(out.data(), {B, N, H, Dv});
  const View3<const double> z3(z.data(), {B, N, H}), lse_in(lse.data(), {B, H, N});
  const View4<double> out4(out.data(), {B, N, H, Dv}), dq4(grad_q.data(), {B, N, H, D}),
      dk4(grad_k.data(), {B, N, H, D}), dv4(grad_v.data(), {B, N, H, Dv});
  const View3<double> lse3(lse.data(), {B, H, N}), dz3(grad_z.data(), {B, H, N});
  const View3<double> dz(grad_z.data(), {B, N, H});

  expect_refused(
      "exact_attention_forward",
      [&] { exact_attention_forward<double>(context, q4, k4, v4, {}, out4, lse3); }, out);
  expect_refused(
      "exact_attention_backward",
      [&] {
        exact_attention_backward<double>(context, q4, k4, v4, out_in, lse_in, dout4, {}, {}, dq4,
                                         dk4, dv4);
      },
      grad_q);
  expect_refused(
      "merge_attention",
      [&] { merge_attention<double>(context, v4, lse_in, v4, lse_in, out4, lse3); }, out);
  expect_refused(
      "merge_attention_backward",
      [&] {
        merge_attention_backward<double>(context, v4, lse_in, v4, lse_in, v4, lse_in, dout4, {},
                                         dv4, lse3, dv4, lse3);
      },
      grad_v);
  expect_refused(
      "cat_forward", [&] { cat_forward<double>(context, z3, v4, {}, out4); }, out);
  expect_refused(
      "cat_backward", [&] { cat_backward<double>(context, z3, v4, dout4, {}, dz, dv4); }, grad_v);
  expect_refused(
      "cat_causal_forward", [&] { cat_causal_forward<double>(context, z3, v4, {}, out4); }, out);
  expect_refused(
      "cat_causal_backward",
      [&] { cat_causal_backward<double>(context, z3, v4, out_in, dout4, {}, dz, dv4); }, grad_v);
  expect_refused(
      "cat_avgkey_forward", [&] { cat_avgkey_forward<double>(context, q4, k4, v4, {}, out4); },
      out);
  expect_refused(
      "cat_avgkey_backward",
      [&] { cat_avgkey_backward<double>(context, q4, k4, v4, dout4, {}, dq4, dk4, dv4); }, grad_q);

  // 2D circulant on a 2 x 2 grid: the same buffers as [B, Hg, Wg, H, ...].
  const View5<const double> q5(q.data(), {B, 2, 2, H, D}), v5(v.data(), {B, 2, 2, H, Dv});
  const View5<double> out5(out.data(), {B, 2, 2, H, Dv}), dq5(grad_q.data(), {B, 2, 2, H, D}),
      dk5(grad_k.data(), {B, 2, 2, H, D}), dv5(grad_v.data(), {B, 2, 2, H, Dv});
  expect_refused(
      "circulant2d_forward",
      [&] { circulant2d_forward<double>(context, q5, q5, v5, {}, out5, {}); }, out);
  expect_refused(
      "circulant2d_backward",
      [&] { circulant2d_backward<double>(context, q5, q5, v5, v5, {}, dq5, dk5, dv5); }, grad_q);

  MlrOptions mlr;
  mlr.ranks = {2, 2};
  expect_refused(
      "mlr_attention_forward",
      [&] { mlr_attention_forward<double>(context, q4, k4, v4, mlr, out4, lse3); }, out);
  expect_refused(
      "mlr_attention_backward",
      [&] {
        mlr_attention_backward<double>(context, q4, k4, v4, out_in, lse_in, dout4, mlr, dq4, dk4,
                                       dv4);
      },
      grad_q);

  // Projections of x [B, N, Dm = 4].
  const View3<const double> x(q.data(), {B, N, D});
  const View3<double> dx(grad_q.data(), {B, N, D});
  BilinearMlrOptions bilinear;
  bilinear.ranks = {1, 1};
  std::vector<double> w1(D * 1, 0.5), w2(2 * (D / 2) * 1, 0.5), dw1(w1.size()), dw2(w2.size());
  const std::vector<View3<const double>> weights{View3<const double>(w1.data(), {1, D, 1}),
                                                 View3<const double>(w2.data(), {2, D / 2, 1})};
  const std::vector<View3<double>> dweights{View3<double>(dw1.data(), {1, D, 1}),
                                            View3<double>(dw2.data(), {2, D / 2, 1})};
  const int64_t width = bilinear_mlr_output_dim(bilinear.ranks);
  std::vector<double> y(B * N * width, 7.0);
  expect_refused(
      "bilinear_mlr_project_forward",
      [&] {
        bilinear_mlr_project_forward<double>(context, x, weights, bilinear,
                                             View4<double>(y.data(), {B, N, 1, width}));
      },
      y);
  expect_refused(
      "bilinear_mlr_project_backward",
      [&] {
        bilinear_mlr_project_backward<double>(context, x, weights,
                                              View4<const double>(y.data(), {B, N, 1, width}),
                                              bilinear, dx, dweights);
      },
      grad_q);
  const BttFactors f = btt_factors(D);
  std::vector<double> b1(f.a * f.b * f.b, 0.5), b2(f.b * f.a * f.a, 0.5), db1(b1.size()),
      db2(b2.size()), by(B * N * D, 7.0);
  const View3<const double> bw1(b1.data(), {f.a, f.b, f.b}), bw2(b2.data(), {f.b, f.a, f.a});
  expect_refused(
      "btt_project_forward",
      [&] {
        btt_project_forward<double>(context, x, bw1, bw2, {},
                                    View4<double>(by.data(), {B, N, 1, D}));
      },
      by);
  expect_refused(
      "btt_project_backward",
      [&] {
        btt_project_backward<double>(
            context, x, bw1, bw2, View4<const double>(by.data(), {B, N, 1, D}), {}, dx,
            View3<double>(db1.data(), bw1.shape), View3<double>(db2.data(), bw2.shape));
      },
      grad_q);

  // WildCat and weighted KV attention (float only).
  std::vector<float> qf(q.begin(), q.end()), vf(v.begin(), v.end()), outf(out.size(), 7.0f);
  const View4<const float> qf4(qf.data(), {B, N, H, D}), vf4(vf.data(), {B, N, H, Dv});
  const View4<float> outf4(outf.data(), {B, N, H, Dv});
  const std::vector<double> outf_copy(outf.begin(), outf.end());
  expect_refused(
      "wildcat_attention",
      [&] {
        WildcatOptions options;
        options.rank = 2;
        wildcat_attention(context, qf4, qf4, vf4, options, outf4);
      },
      outf_copy);
  const WeightedKVEntries entries =
      weighted_kv_entries(qf4, vf4, streaming_llm_select(qf4, vf4, N, 0));
  expect_refused(
      "weighted_kv_attention",
      [&] { weighted_kv_attention(context, qf4, entries.view(), outf4); },
      std::vector<double>(outf.begin(), outf.end()));
  expect_refused("CompressKV::select", [&] { CompressKV({}).select(context, qf4, vf4); }, {});
  expect_refused("snapkv_select", [&] { snapkv_select(context, qf4, qf4, vf4, {}); }, {});
}

// Decoding and the FFT lower bound go through the same dispatch: refused after their checks.
TEST(Dispatch, DecodeAndLowerBoundRefuseAnUnknownDevice) {
  const Context context = unknown_device();
  const std::vector<double> z(B * N * H, 0.1), v(B * N * H * Dv, 0.5);
  std::vector<double> out(B * N * H * Dv, 7.0);
  const View3<const double> z3(z.data(), {B, N, H});
  const View4<const double> v4(v.data(), {B, N, H, Dv});
  const View4<double> out4(out.data(), {B, N, H, Dv});
  expect_refused("cat_causal_decode", [&] { cat_causal_decode<double>(context, z3, v4, out4); },
                 out);
  for (const CatFftPacking packing : {CatFftPacking::real_columns, CatFftPacking::packed_pairs}) {
    CatFftLowerBound<double> bound(v4, packing);
    expect_refused("CatFftLowerBound::run", [&] { bound.run(context); }, {});
  }
}

// mlr_decode and MlbtcMap::apply: refused after their checks.
TEST(Dispatch, MlrDecodeAndMlbtcRefuseAnUnknownDevice) {
  const Context context = unknown_device();
  const std::vector<double> keys(B * H * 16 * 2, 0.5), v(B * 3 * H * Dv, 3.0), q1(B * H * D, 0.5);
  std::vector<double> out(B * H * Dv, 7.0);
  const std::vector<View4<const double>> levels{
      View4<const double>(keys.data(), {B, H, 16, 2}), View4<const double>(keys.data(), {B, H, 8, 2})};
  expect_refused(
      "mlr_decode",
      [&] {
        mlr_decode<double>(context, View4<const double>(q1.data(), {B, 1, H, D}), levels,
                           View4<const double>(v.data(), {B, 3, H, Dv}),
                           MlrOptions{{2, 2}, true, false}, 16,
                           View4<double>(out.data(), {B, 1, H, Dv}));
      },
      out);

  MlbtcLevel level;
  level.right.assign(4 * 2, 0.5);  // R [1, 4, 2]
  level.right_cols = 2;
  level.left.assign(3 * 2, 0.25);  // L [1, 3, 2]
  const MlbtcMap map(4, 3, {level});
  const std::vector<double> x(4, 1.0);
  std::vector<double> y(3, 7.0);
  expect_refused("MlbtcMap::apply", [&] { map.apply(context, x.data(), y.data()); }, y);
  map.apply(Context{}, x.data(), y.data());
  for (double value : y) EXPECT_DOUBLE_EQ(value, 0.25 * 2 * 4 * 0.5);
}

}  // namespace
}  // namespace subquad
