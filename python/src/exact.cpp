// Bindings of exact softmax attention (include/subquad/exact.h): forward with the
// log-sum-exp, backward, and the merge of results over disjoint key sets.
#include "subquad/exact.h"

#include <nanobind/stl/optional.h>

#include <optional>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

ExactOptions exact_options(std::optional<double> scale, bool causal, int64_t window) {
  ExactOptions options;
  options.scale = scale;
  options.causal = causal;
  options.window = window;
  return options;
}

nb::tuple forward(const Array& q, const Array& k, const Array& v, std::optional<double> scale,
                  bool causal, int64_t window, int64_t threads) {
  const Context context = context_for(threads);
  const ExactOptions options = exact_options(scale, causal, window);
  return attention_forward(q, k, v, [&](auto q_view, auto k_view, auto v_view, auto out_view,
                                        auto lse_view) {
    exact_attention_forward(context, q_view, k_view, v_view, options, out_view, lse_view);
  });
}

nb::tuple backward(const Array& q, const Array& k, const Array& v, const Array& out,
                   const Array& lse, const Array& dout, std::optional<double> scale, bool causal,
                   int64_t window, int64_t threads) {
  const Context context = context_for(threads);
  const ExactOptions options = exact_options(scale, causal, window);
  return attention_backward(
      q, k, v, out, lse, dout,
      [&](auto q_view, auto k_view, auto v_view, auto out_view, auto lse_view, auto dout_view,
          auto dq, auto dk, auto dv) {
        exact_attention_backward(context, q_view, k_view, v_view, out_view, lse_view, dout_view,
                                 options, dq, dk, dv);
      });
}

nb::tuple merge(const Array& out_a, const Array& lse_a, const Array& out_b, const Array& lse_b,
                int64_t threads) {
  const Context context = context_for(threads);
  const Scalar scalar =
      common_scalar({{out_a, "out_a"}, {lse_a, "lse_a"}, {out_b, "out_b"}, {lse_b, "lse_b"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto out_a_view = input<T, 4>(out_a, "out_a");
    const auto lse_a_view = input<T, 3>(lse_a, "lse_a");
    Output<T, 4> out(out_a_view.shape);
    Output<T, 3> lse(lse_a_view.shape);
    {
      nb::gil_scoped_release release;
      merge_attention<T>(context, out_a_view, lse_a_view, input<T, 4>(out_b, "out_b"),
                         input<T, 3>(lse_b, "lse_b"), out.view(), lse.view());
    }
    return nb::make_tuple(out.numpy(), lse.numpy());
  });
}

}  // namespace

void bind_exact(nb::module_& m) {
  m.def("exact_attention_forward", &forward, "q"_a, "k"_a, "v"_a, nb::kw_only(),
        "scale"_a = nb::none(), "causal"_a = false, "window"_a = 0, "threads"_a = 0,
        R"(Exact softmax attention, forward.

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv], lse [B, H, N]).
All float32 or all float64. H % Hkv == 0 (query head h reads kv head h // (H // Hkv)).
scale: None -> 1/sqrt(D). causal: bottom-right aligned (query i sees key j iff
j <= i + M - N). window: 0 = none; w > 0 also requires j > i + M - N - w (implies causal).
A row that sees no key outputs zeros and lse = -inf. threads: 0 = all cores.)");

  m.def("exact_attention_backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a,
        nb::kw_only(), "scale"_a = nb::none(), "causal"_a = false, "window"_a = 0, "threads"_a = 0,
        R"(Exact softmax attention, backward from the forward's out and lse.

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv], out, dout [B, N, H, Dv], lse [B, H, N]
-> (dq [B, N, H, D], dk [B, M, Hkv, D], dv [B, M, Hkv, Dv]); GQA sums over the query heads of
a group. Options as exact_attention_forward (pass the same ones).)");

  m.def("merge_attention", &merge, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, nb::kw_only(),
        "threads"_a = 0,
        R"(Merges attention results over two disjoint key sets.

out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]) with
lse = log(exp(lse_a) + exp(lse_b)) and out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
A part whose lse is -inf contributes nothing.)");
}

}  // namespace subquad::python
