// Bindings of exact softmax attention (include/subquad/exact.h): forward with the
// log-sum-exp, backward (from dout and dlse), and the merge of results over disjoint key sets
// with its backward.
#include "subquad/exact.h"

#include <nanobind/stl/optional.h>

#include <optional>
#include <vector>

#include "arrays.h"
#include "bfloat16_arrays.h"
#include "bindings.h"
#include "exact_bf16.h"

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

ArrayPair forward(const Array& q, const Array& k, const Array& v, std::optional<double> scale,
                  bool causal, int64_t window, int64_t threads) {
  const Context context = context_for(threads);
  const ExactOptions options = exact_options(scale, causal, window);
  if (is_bfloat16(q)) return exact_forward_bf16(q, k, v, options, context);
  return attention_forward(q, k, v, [&](auto q_view, auto k_view, auto v_view, auto out_view,
                                        auto lse_view) {
    exact_attention_forward(context, q_view, k_view, v_view, options, out_view, lse_view);
  });
}

ArrayTriple backward(const Array& q, const Array& k, const Array& v, const Array& out,
                     const Array& lse, const Array& dout, const std::optional<Array>& dlse,
                     std::optional<double> scale, bool causal, int64_t window, int64_t threads) {
  const Context context = context_for(threads);
  const ExactOptions options = exact_options(scale, causal, window);
  if (is_bfloat16(q))
    return exact_backward_bf16(q, k, v, out, lse, dout, dlse, options, context);
  std::vector<Named> arrays{{q, "q"},     {k, "k"},     {v, "v"},
                            {out, "out"}, {lse, "lse"}, {dout, "dout"}};
  if (dlse) arrays.push_back({*dlse, "dlse"});
  return dispatch(common_scalar(arrays), [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto k_view = input<T, 4>(k, "k");
    const auto v_view = input<T, 4>(v, "v");
    const auto dlse_view = dlse ? input<T, 3>(*dlse, "dlse") : View3<const T>();
    Output<T, 4> dq(q_view.shape), dk(k_view.shape), dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      exact_attention_backward<T>(context, q_view, k_view, v_view, input<T, 4>(out, "out"),
                                  input<T, 3>(lse, "lse"), input<T, 4>(dout, "dout"),
                                  dlse_view, options, dq.view(), dk.view(), dv.view());
    }
    return nb::make_tuple(dq.release(), dk.release(), dv.release());
  });
}

ArrayPair merge(const Array& out_a, const Array& lse_a, const Array& out_b, const Array& lse_b,
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
    return nb::make_tuple(out.release(), lse.release());
  });
}

TupleResult<NumpyArray, NumpyArray, NumpyArray, NumpyArray> merge_backward(
    const Array& out_a, const Array& lse_a, const Array& out_b, const Array& lse_b,
    const Array& out, const Array& lse, const std::optional<Array>& dout,
    const std::optional<Array>& dlse, int64_t threads) {
  const Context context = context_for(threads);
  std::vector<Named> arrays{{out_a, "out_a"}, {lse_a, "lse_a"}, {out_b, "out_b"},
                            {lse_b, "lse_b"}, {out, "out"},     {lse, "lse"}};
  if (dout) arrays.push_back({*dout, "dout"});
  if (dlse) arrays.push_back({*dlse, "dlse"});
  return dispatch(common_scalar(arrays), [&]<typename T>() {
    const auto out_a_view = input<T, 4>(out_a, "out_a");
    const auto lse_a_view = input<T, 3>(lse_a, "lse_a");
    const auto dout_view = dout ? input<T, 4>(*dout, "dout") : View4<const T>();
    const auto dlse_view = dlse ? input<T, 3>(*dlse, "dlse") : View3<const T>();
    Output<T, 4> dout_a(out_a_view.shape), dout_b(out_a_view.shape);
    Output<T, 3> dlse_a(lse_a_view.shape), dlse_b(lse_a_view.shape);
    {
      nb::gil_scoped_release release;
      merge_attention_backward<T>(context, out_a_view, lse_a_view, input<T, 4>(out_b, "out_b"),
                                  input<T, 3>(lse_b, "lse_b"), input<T, 4>(out, "out"),
                                  input<T, 3>(lse, "lse"), dout_view, dlse_view, dout_a.view(),
                                  dlse_a.view(), dout_b.view(), dlse_b.view());
    }
    return nb::make_tuple(dout_a.release(), dlse_a.release(), dout_b.release(), dlse_b.release());
  });
}

}  // namespace

void bind_exact(nb::module_& m) {
  m.def("exact_attention_forward", &forward, "q"_a, "k"_a, "v"_a, nb::kw_only(),
        "scale"_a = nb::none(), "causal"_a = false, "window"_a = 0, "threads"_a = 0,
        R"(Exact softmax attention, forward.

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv], lse [B, H, N]).
All float32, all float64, or all bfloat16 (through DLPack, e.g. torch.bfloat16: out comes
back as a DLPack array for torch.from_dlpack, lse as float32).
H % Hkv == 0 (query head h reads kv head h // (H // Hkv)).
scale: None -> 1/sqrt(D). causal: bottom-right aligned (query i sees key j iff
j <= i + M - N). window: 0 = none; w > 0 also requires j > i + M - N - w (implies causal).
A row that sees no key outputs zeros and lse = -inf. threads: 0 = all cores.)");

  m.def("exact_attention_backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a,
        nb::kw_only(), "dlse"_a = nb::none(), "scale"_a = nb::none(), "causal"_a = false,
        "window"_a = 0, "threads"_a = 0,
        R"(Exact softmax attention, backward from the forward's out and lse.

q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv], out, dout [B, N, H, Dv], lse [B, H, N],
dlse [B, H, N] or None (no gradient reaches lse) -> (dq [B, N, H, D], dk [B, M, Hkv, D],
dv [B, M, Hkv, Dv]); GQA sums over the query heads of a group. bfloat16 calls take a float32
lse and dlse and return bfloat16 DLPack arrays. Options as
exact_attention_forward (pass the same ones).)");

  m.def("merge_attention", &merge, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, nb::kw_only(),
        "threads"_a = 0,
        R"(Merges attention results over two disjoint key sets.

out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]) with
lse = log(exp(lse_a) + exp(lse_b)) and out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
A part whose lse is -inf contributes nothing.)");

  m.def("merge_attention_backward", &merge_backward, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a,
        "out"_a, "lse"_a, nb::kw_only(), "dout"_a = nb::none(), "dlse"_a = nb::none(),
        "threads"_a = 0,
        R"(Backward of merge_attention from its inputs and outputs.

out_a, out_b, out [B, N, H, Dv], lse_a, lse_b, lse [B, H, N]; dout [B, N, H, Dv] and dlse
[B, H, N] may be None (no gradient there) -> (dout_a, dlse_a, dout_b, dlse_b) with
w_p = exp(lse_p - lse): dout_p = w_p dout, dlse_p = w_p (<dout, out_p - out> + dlse).)");
}

const BindingRegistrar exact_bindings("exact", &bind_exact);

}  // namespace subquad::python
