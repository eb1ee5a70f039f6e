// Bindings of structured-matrix attention (include/subquad/structured.h): MLR attention and
// its decoding, the bilinear MLR and BTT score projections, and MLBTC maps.
#include "subquad/structured.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

// ---------------------------------------------------------------------------------------
// MLR attention

MlrOptions mlr_options(std::vector<int64_t> ranks, bool causal, bool block_divide) {
  MlrOptions options;
  options.ranks = std::move(ranks);
  options.causal = causal;
  options.block_divide = block_divide;
  return options;
}

ArrayPair mlr_forward(const Array& q, const Array& k, const Array& v, std::vector<int64_t> ranks,
                      bool causal, bool block_divide, int64_t threads) {
  const Context context = context_for(threads);
  const MlrOptions options = mlr_options(std::move(ranks), causal, block_divide);
  return attention_forward(
      q, k, v, [&](auto q_view, auto k_view, auto v_view, auto out_view, auto lse_view) {
        mlr_attention_forward(context, q_view, k_view, v_view, options, out_view, lse_view);
      });
}

ArrayTriple mlr_backward(const Array& q, const Array& k, const Array& v, const Array& out,
                         const Array& lse, const Array& dout, std::vector<int64_t> ranks,
                         bool causal, bool block_divide, int64_t threads) {
  const Context context = context_for(threads);
  const MlrOptions options = mlr_options(std::move(ranks), causal, block_divide);
  return attention_backward(
      q, k, v, out, lse, dout,
      [&](auto q_view, auto k_view, auto v_view, auto out_view, auto lse_view, auto dout_view,
          auto dq, auto dk, auto dv) {
        mlr_attention_backward(context, q_view, k_view, v_view, out_view, lse_view, dout_view,
                               options, dq, dk, dv);
      });
}

ArrayResult mlr_decode_rows(const Array& q, const std::vector<Array>& level_keys, const Array& v,
                            std::vector<int64_t> ranks, bool block_divide, int64_t context_length,
                            int64_t threads) {
  const Context context = context_for(threads);
  const MlrOptions options = mlr_options(std::move(ranks), true, block_divide);
  std::vector<std::string> names;
  for (size_t l = 0; l < level_keys.size(); ++l)
    names.push_back("level_keys[" + std::to_string(l) + "]");
  std::vector<Named> arrays{{q, "q"}, {v, "v"}};
  for (size_t l = 0; l < level_keys.size(); ++l) arrays.push_back({level_keys[l], names[l].c_str()});
  return dispatch(common_scalar(arrays), [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto v_view = input<T, 4>(v, "v");
    std::vector<View4<const T>> levels;
    for (size_t l = 0; l < level_keys.size(); ++l)
      levels.push_back(input<T, 4>(level_keys[l], names[l].c_str()));
    Output<T, 4> out({q_view.dim(0), q_view.dim(1), q_view.dim(2), v_view.dim(3)});
    {
      nb::gil_scoped_release release;
      mlr_decode<T>(context, q_view, levels, v_view, options, context_length, out.view());
    }
    return out.release();
  });
}

// ---------------------------------------------------------------------------------------
// Bilinear MLR and BTT projections

BilinearMlrOptions bilinear_options(std::vector<int64_t> ranks, int64_t heads,
                                    std::vector<double> level_scale, bool layer_norm,
                                    bool rms_cap) {
  BilinearMlrOptions options;
  options.ranks = std::move(ranks);
  options.heads = heads;
  options.level_scale = std::move(level_scale);
  options.layer_norm = layer_norm;
  options.rms_cap = rms_cap;
  return options;
}

// The named arrays of a call: x, the weights (as "weights[l]") and any extra ones.
struct WeightNames {
  explicit WeightNames(size_t count) {
    for (size_t l = 0; l < count; ++l) names.push_back("weights[" + std::to_string(l) + "]");
  }
  std::vector<std::string> names;
};

template <typename T>
std::vector<View3<const T>> weight_views(const std::vector<Array>& weights,
                                         const WeightNames& names) {
  std::vector<View3<const T>> views;
  for (size_t l = 0; l < weights.size(); ++l)
    views.push_back(input<T, 3>(weights[l], names.names[l].c_str()));
  return views;
}

Scalar weights_scalar(const Array& x, const std::vector<Array>& weights, const WeightNames& names,
                      const Array* dy) {
  std::vector<Named> arrays{{x, "x"}};
  for (size_t l = 0; l < weights.size(); ++l)
    arrays.push_back({weights[l], names.names[l].c_str()});
  if (dy != nullptr) arrays.push_back({*dy, "dy"});
  return common_scalar(arrays);
}

ArrayResult bilinear_forward(const Array& x, const std::vector<Array>& weights,
                             std::vector<int64_t> ranks, int64_t heads,
                             std::vector<double> level_scale, bool layer_norm, bool rms_cap,
                             int64_t threads) {
  const Context context = context_for(threads);
  const BilinearMlrOptions options =
      bilinear_options(std::move(ranks), heads, std::move(level_scale), layer_norm, rms_cap);
  const WeightNames names(weights.size());
  return dispatch(weights_scalar(x, weights, names, nullptr), [&]<typename T>() {
    const auto x_view = input<T, 3>(x, "x");
    const auto weight_list = weight_views<T>(weights, names);
    check(options.heads >= 1, "heads: expected >= 1, got ", options.heads);
    for (int64_t rank : options.ranks)
      check(rank >= 1, "ranks: expected every rank >= 1, got ", shape_string(options.ranks));
    Output<T, 4> y(
        {x_view.dim(0), x_view.dim(1), options.heads, bilinear_mlr_output_dim(options.ranks)});
    {
      nb::gil_scoped_release release;
      bilinear_mlr_project_forward<T>(context, x_view, weight_list, options, y.view());
    }
    return y.release();
  });
}

TupleResult<NumpyArray, nb::typed<nb::list, NumpyArray>> bilinear_backward(
    const Array& x, const std::vector<Array>& weights, const Array& dy, std::vector<int64_t> ranks,
    int64_t heads, std::vector<double> level_scale, bool layer_norm, bool rms_cap,
    int64_t threads) {
  const Context context = context_for(threads);
  const BilinearMlrOptions options =
      bilinear_options(std::move(ranks), heads, std::move(level_scale), layer_norm, rms_cap);
  const WeightNames names(weights.size());
  return dispatch(weights_scalar(x, weights, names, &dy), [&]<typename T>() {
    const auto x_view = input<T, 3>(x, "x");
    const auto weight_list = weight_views<T>(weights, names);
    Output<T, 3> dx(x_view.shape);
    std::vector<Output<T, 3>> dweights;
    std::vector<View3<T>> dweight_views;
    for (const auto& weight : weight_list) dweights.emplace_back(weight.shape);
    for (const auto& dweight : dweights) dweight_views.push_back(dweight.view());
    {
      nb::gil_scoped_release release;
      bilinear_mlr_project_backward<T>(context, x_view, weight_list, input<T, 4>(dy, "dy"), options,
                                       dx.view(), dweight_views);
    }
    nb::list dweight_arrays;
    for (auto& dweight : dweights) dweight_arrays.append(dweight.release());
    return nb::make_tuple(dx.release(), dweight_arrays);
  });
}

BttOptions btt_options(int64_t heads, int64_t rank, bool layer_norm, bool rms_cap) {
  BttOptions options;
  options.heads = heads;
  options.rank = rank;
  options.layer_norm = layer_norm;
  options.rms_cap = rms_cap;
  return options;
}

ArrayResult btt_forward(const Array& x, const Array& w1, const Array& w2, int64_t heads,
                        int64_t rank, bool layer_norm, bool rms_cap, int64_t threads) {
  const Context context = context_for(threads);
  const BttOptions options = btt_options(heads, rank, layer_norm, rms_cap);
  return dispatch(common_scalar({{x, "x"}, {w1, "w1"}, {w2, "w2"}}), [&]<typename T>() {
    const auto x_view = input<T, 3>(x, "x");
    check(heads >= 1, "heads: expected >= 1, got ", heads);
    Output<T, 4> y({x_view.dim(0), x_view.dim(1), heads, x_view.dim(2)});
    {
      nb::gil_scoped_release release;
      btt_project_forward<T>(context, x_view, input<T, 3>(w1, "w1"), input<T, 3>(w2, "w2"), options,
                             y.view());
    }
    return y.release();
  });
}

ArrayTriple btt_backward(const Array& x, const Array& w1, const Array& w2, const Array& dy,
                         int64_t heads, int64_t rank, bool layer_norm, bool rms_cap,
                         int64_t threads) {
  const Context context = context_for(threads);
  const BttOptions options = btt_options(heads, rank, layer_norm, rms_cap);
  const Scalar scalar = common_scalar({{x, "x"}, {w1, "w1"}, {w2, "w2"}, {dy, "dy"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto x_view = input<T, 3>(x, "x");
    const auto w1_view = input<T, 3>(w1, "w1");
    const auto w2_view = input<T, 3>(w2, "w2");
    Output<T, 3> dx(x_view.shape);
    Output<T, 3> dw1(w1_view.shape);
    Output<T, 3> dw2(w2_view.shape);
    {
      nb::gil_scoped_release release;
      btt_project_backward<T>(context, x_view, w1_view, w2_view, input<T, 4>(dy, "dy"), options,
                              dx.view(), dw1.view(), dw2.view());
    }
    return nb::make_tuple(dx.release(), dw1.release(), dw2.release());
  });
}

// ---------------------------------------------------------------------------------------
// MLBTC maps (float64 vectors, as the C++ API)

ArrayResult mlbtc_apply(const MlbtcMap& map, const Array& x) {
  check(common_scalar({{x, "x"}}) == Scalar::f64, "x: expected dtype float64, got float32");
  const auto x_view = input<double, 1>(x, "x");
  check(x_view.dim(0) == map.in_dim(), "x: expected shape [", map.in_dim(), "], got [",
        x_view.dim(0), "]");
  Output<double, 1> y({map.out_dim()});
  {
    nb::gil_scoped_release release;
    map.apply(x_view.data, y.view().data);
  }
  return y.release();
}

ArrayResult mlbtc_dense(const MlbtcMap& map) {
  const std::vector<double> dense = map.dense();
  Output<double, 2> matrix({map.out_dim(), map.in_dim()});
  std::copy(dense.begin(), dense.end(), matrix.view().data);
  return matrix.release();
}

}  // namespace

void bind_structured(nb::module_& m) {
  m.def("mlr_attention_forward", &mlr_forward, "q"_a, "k"_a, "v"_a, nb::kw_only(), "ranks"_a,
        "causal"_a = false, "block_divide"_a = false, "threads"_a = 0,
        R"(MLR attention (multi-level low-rank score matrix), forward.

q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv] -> (out [B, T, H, Dv], lse [B, H, T]).
ranks [r_1, ..., r_L] split D (sum = D); level l splits the sequence into 2^(l-1) blocks
and adds <q_l[i], k_l[j]> / r_l when i and j share a level-l block; block_divide divides
each score by the number of such levels. T must be divisible by 2^(L-1).)");

  m.def("mlr_attention_backward", &mlr_backward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a,
        nb::kw_only(), "ranks"_a, "causal"_a = false, "block_divide"_a = false, "threads"_a = 0,
        R"(MLR attention, backward from the forward's out and lse.

-> (dq [B, T, H, D], dk [B, T, Hkv, D], dv [B, T, Hkv, Dv]). Options as the forward.)");

  m.def("mlr_score_macs", &mlr_score_macs, "tokens"_a, "ranks"_a,
        "Multiply-adds of forming one head's scores, non-causal: T^2 sum_l r_l / 2^(l-1).");
  m.def("mlr_key_cache_prediction", &mlr_key_cache_prediction, "context"_a, "ranks"_a,
        "Level-cache floats of one kv head after `context` tokens: context sum_l r_l / 2^(l-1).");

  m.def("mlr_decode", &mlr_decode_rows, "q"_a, "level_keys"_a, "v"_a, nb::kw_only(), "ranks"_a,
        "block_divide"_a = false, "context"_a, "threads"_a = 0,
        R"(Causal decoding of MLR attention over caller-owned state (blocks on the absolute
positions 0 .. context-1, context divisible by 2^(L-1)).

q [B, T, H, D]: the queries of positions S - T .. S - 1, in one block of the finest level;
level_keys[l] [B, Hkv, s_l, r_l] (s_l = mlr_level_block_sizes(ranks, context)[l]): level l's
columns of position p's key in slot p mod s_l, the T new keys stored; v [B, S, Hkv, Dv]: every
value seen -> out [B, T, H, Dv], rows S - T .. S - 1 of the causal mlr_attention_forward.)");
  m.def("mlr_level_block_sizes", &mlr_level_block_sizes, "ranks"_a, "context"_a,
        "The block sizes context / 2^(l-1) of MLR decoding's level caches.");

  m.def("rms_cap_limit", &rms_cap_limit, "fan_in"_a, "fan_out"_a,
        "The RMS cap c = sqrt(min(fan_in, fan_out)) / fan_in of a weight block.");

  m.def("bilinear_mlr_project_forward", &bilinear_forward, "x"_a, "weights"_a, nb::kw_only(),
        "ranks"_a, "heads"_a = 1, "level_scale"_a = std::vector<double>(), "layer_norm"_a = true,
        "rms_cap"_a = true, "threads"_a = 0,
        R"(Bilinear MLR projection (one side of the bilinear MLR score).

x [B, N, Dm], weights[l] [p_l, Dm / p_l, heads * r_l] (p_l = 2^(l-1)) -> y [B, N, heads, E],
E = sum_l r_l p_l (bilinear_mlr_output_dim). Level l: per feature block a projection to r_l
features per head, LayerNorm over the level's r_l p_l features (layer_norm), times
level_scale[l] (empty: 1). rms_cap caps each level's weight RMS inside the forward.)");

  m.def("bilinear_mlr_project_backward", &bilinear_backward, "x"_a, "weights"_a, "dy"_a,
        nb::kw_only(), "ranks"_a, "heads"_a = 1, "level_scale"_a = std::vector<double>(),
        "layer_norm"_a = true, "rms_cap"_a = true, "threads"_a = 0,
        R"(Bilinear MLR projection, backward: dy [B, N, heads, E] -> (dx [B, N, Dm],
[dweights[l] of the shapes of weights[l]]). Options as the forward.)");

  m.def("bilinear_mlr_level_scales", &bilinear_mlr_level_scales, "ranks"_a, "mup"_a = false,
        "Level scales c_l = 1/sqrt(r_l p_l), or 8/(r_l p_l) under muP.");
  m.def("bilinear_mlr_output_dim", &bilinear_mlr_output_dim, "ranks"_a, "E = sum_l r_l 2^(l-1).");

  m.def("btt_project_forward", &btt_forward, "x"_a, "w1"_a, "w2"_a, nb::kw_only(), "heads"_a = 1,
        "rank"_a = 1, "layer_norm"_a = true, "rms_cap"_a = true, "threads"_a = 0,
        R"(BTT projection (key side of the bilinear BTT score).

x [B, N, D], w1 [a, b, heads b rank], w2 [heads b, a, a rank] -> y [B, N, heads, D] with
(a, b) = btt_factors(D); LayerNorm over D (layer_norm), RMS-capped weights (rms_cap).)");

  m.def("btt_project_backward", &btt_backward, "x"_a, "w1"_a, "w2"_a, "dy"_a, nb::kw_only(),
        "heads"_a = 1, "rank"_a = 1, "layer_norm"_a = true, "rms_cap"_a = true, "threads"_a = 0,
        R"(BTT projection, backward: dy [B, N, heads, D] -> (dx [B, N, D], dw1, dw2).)");

  m.def(
      "btt_factors",
      [](int64_t dim) -> IntPair {
        const BttFactors factors = btt_factors(dim);
        return nb::make_tuple(factors.a, factors.b);
      },
      "dim"_a, "D = a * b with b the smallest divisor of D greater than sqrt(D): (a, b).");

  nb::class_<MlbtcLevel>(m, "MlbtcLevel",
                         R"(One level of an MLBTC map (all arrays row-major, flattened).

alpha; right R [right_blocks, n / right_blocks, right_cols]; right_perm (gather, length
right_blocks * right_cols; empty: identity); left L [left_blocks, m / left_blocks,
right_blocks * right_cols / left_blocks]; left_perm (length m; empty: identity).)")
      .def(
          "__init__",
          [](MlbtcLevel* level, double alpha, std::vector<double> right, int64_t right_blocks,
             int64_t right_cols, std::vector<int64_t> right_perm, std::vector<double> left,
             int64_t left_blocks, std::vector<int64_t> left_perm) {
            new (level) MlbtcLevel{alpha,       std::move(right),      right_blocks,
                                   right_cols,  std::move(right_perm), std::move(left),
                                   left_blocks, std::move(left_perm)};
          },
          nb::kw_only(), "alpha"_a = 1.0, "right"_a, "right_blocks"_a = 1, "right_cols"_a = 1,
          "right_perm"_a = std::vector<int64_t>(), "left"_a, "left_blocks"_a = 1,
          "left_perm"_a = std::vector<int64_t>())
      .def_rw("alpha", &MlbtcLevel::alpha)
      .def_rw("right", &MlbtcLevel::right)
      .def_rw("right_blocks", &MlbtcLevel::right_blocks)
      .def_rw("right_cols", &MlbtcLevel::right_cols)
      .def_rw("right_perm", &MlbtcLevel::right_perm)
      .def_rw("left", &MlbtcLevel::left)
      .def_rw("left_blocks", &MlbtcLevel::left_blocks)
      .def_rw("left_perm", &MlbtcLevel::left_perm);

  nb::class_<MlbtcMap>(m, "MlbtcMap",
                       R"(An MLBTC linear map R^n -> R^m: y = sum_l alpha_l P_L blockdiag(L_l)
P_R blockdiag(R_l^T) x. MlbtcMap(in_dim, out_dim, levels) validates every level.)")
      .def(nb::init<int64_t, int64_t, std::vector<MlbtcLevel>>(), "in_dim"_a, "out_dim"_a,
           "levels"_a)
      .def_prop_ro("in_dim", &MlbtcMap::in_dim)
      .def_prop_ro("out_dim", &MlbtcMap::out_dim)
      .def("apply", &mlbtc_apply, "x"_a, "x [in_dim] float64 -> y [out_dim].")
      .def("dense", &mlbtc_dense, "The dense [out_dim, in_dim] matrix.");
}

const BindingRegistrar structured_bindings("structured", &bind_structured);

}  // namespace subquad::python
