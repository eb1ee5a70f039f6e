// Bindings of 2D Circulant Attention (include/subquad/circulant2d.h): BCCB attention on
// token grids, forward (with the softmax weights), backward, scale and grid helpers.
#include "common/option_names.h"
#include "subquad/circulant2d.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

Circulant2dOptions circulant2d_options(const std::string& scale_mode, std::optional<double> scale) {
  Circulant2dOptions options;
  options.scale_mode = parse_option(scale_mode, "scale_mode", kCirculant2dScaleModeNames);
  options.scale = scale;
  return options;
}

ArrayPair forward(const Array& q, const Array& k, const Array& v, const std::string& scale_mode,
                  std::optional<double> scale, int64_t threads) {
  const Context context = context_for(threads);
  const Circulant2dOptions options = circulant2d_options(scale_mode, scale);
  return dispatch(common_scalar({{q, "q"}, {k, "k"}, {v, "v"}}), [&]<typename T>() {
    const auto q_view = input<T, 5>(q, "q");
    const auto k_view = input<T, 5>(k, "k");
    const auto v_view = input<T, 5>(v, "v");
    const auto& shape = q_view.shape;  // [B, Hg, Wg, H, D]
    Output<T, 5> out({shape[0], shape[1], shape[2], shape[3], v_view.dim(4)});
    Output<T, 4> weights({shape[0], shape[3], shape[1], shape[2]});
    {
      nb::gil_scoped_release release;
      circulant2d_forward<T>(context, q_view, k_view, v_view, options, out.view(), weights.view());
    }
    return nb::make_tuple(out.release(), weights.release());
  });
}

ArrayTriple backward(const Array& q, const Array& k, const Array& v, const Array& dout,
                     const std::string& scale_mode, std::optional<double> scale, int64_t threads) {
  const Context context = context_for(threads);
  const Circulant2dOptions options = circulant2d_options(scale_mode, scale);
  const Scalar scalar = common_scalar({{q, "q"}, {k, "k"}, {v, "v"}, {dout, "dout"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto q_view = input<T, 5>(q, "q");
    const auto k_view = input<T, 5>(k, "k");
    const auto v_view = input<T, 5>(v, "v");
    Output<T, 5> dq(q_view.shape);
    Output<T, 5> dk(k_view.shape);
    Output<T, 5> dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      circulant2d_backward<T>(context, q_view, k_view, v_view, input<T, 5>(dout, "dout"), options,
                              dq.view(), dk.view(), dv.view());
    }
    return nb::make_tuple(dq.release(), dk.release(), dv.release());
  });
}

}  // namespace

void bind_circulant2d(nb::module_& m) {
  m.def("circulant2d_forward", &forward, "q"_a, "k"_a, "v"_a, nb::kw_only(),
        "scale_mode"_a = "paper", "scale"_a = nb::none(), "threads"_a = 0,
        R"(2D Circulant Attention (BCCB attention on a token grid), forward.

q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> (out [B, Hg, Wg, H, Dv],
weights [B, H, Hg, Wg]). Per (batch, head): a[m] = c * sum_n <q[n], k[n + m]> (indices
modulo the grid), s = softmax(a) over all Hg * Wg entries (returned as weights),
out[i] = sum_n s[n] v[i + n]. scale_mode "paper": c = 1 / (N sqrt(D)); "code":
c = 1 / sqrt(N) (the released checkpoints, D = 1); scale: an explicit c overriding
scale_mode. A non-finite input or overflowing logits make their head NaN.)");

  m.def("circulant2d_backward", &backward, "q"_a, "k"_a, "v"_a, "dout"_a, nb::kw_only(),
        "scale_mode"_a = "paper", "scale"_a = nb::none(), "threads"_a = 0,
        R"(2D Circulant Attention, backward.

q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv], dout [B, Hg, Wg, H, Dv] -> (dq, dk, dv) of the
shapes of q, k, v. The weights are recomputed from q and k. Options as the forward.)");

  m.def(
      "circulant2d_scale",
      [](int64_t tokens, int64_t head_dim, const std::string& scale_mode,
         std::optional<double> scale) {
        check(tokens >= 1, "tokens: expected >= 1, got ", tokens);
        check(head_dim >= 1, "head_dim: expected >= 1, got ", head_dim);
        return circulant2d_scale(circulant2d_options(scale_mode, scale), tokens, head_dim);
      },
      "tokens"_a, "head_dim"_a, nb::kw_only(), "scale_mode"_a = "paper", "scale"_a = nb::none(),
      "The logit scale c for a grid of `tokens` = Hg * Wg and head dim `head_dim`.");

  m.def(
      "circulant2d_grid_for_tokens",
      [](int64_t tokens) -> IntPair {
        const Grid grid = circulant2d_grid_for_tokens(tokens);
        return nb::make_tuple(grid.rows, grid.cols);
      },
      "tokens"_a,
      R"(A grid (Hg, Wg) for `tokens`: Hg the largest divisor with Hg <= sqrt(tokens),
Wg = tokens // Hg (4096 -> (64, 64), a prime p -> (1, p)).)");
}

const BindingRegistrar circulant2d_bindings("circulant2d", &bind_circulant2d);

}  // namespace subquad::python
