// bfloat16 exact attention at the Python boundary (exact_bf16.h): inputs through DLPack,
// read in place; bfloat16 outputs as DLPack arrays, lse as a float32 NumPy array.
#include "exact_bf16.h"

#include "bfloat16_arrays.h"

namespace subquad::python {

nb::tuple exact_forward_bf16(const Array& q, const Array& k, const Array& v,
                             const ExactOptions& options, const Context& context) {
  all_bfloat16({{q, "q"}, {k, "k"}, {v, "v"}});
  const auto q_view = input<bfloat16, 4>(q, "q");
  const auto k_view = input<bfloat16, 4>(k, "k");
  const auto v_view = input<bfloat16, 4>(v, "v");
  const int64_t B = q_view.dim(0), N = q_view.dim(1), H = q_view.dim(2);
  Bf16Output<4> out({B, N, H, v_view.dim(3)});
  Output<float, 3> lse({B, H, N});
  {
    nb::gil_scoped_release release;
    exact_attention_forward<bfloat16>(context, q_view, k_view, v_view, options, out.view(),
                                      lse.view());
  }
  return nb::make_tuple(out.release(), lse.release());
}

nb::tuple exact_backward_bf16(const Array& q, const Array& k, const Array& v, const Array& out,
                              const Array& lse, const Array& dout, const std::optional<Array>& dlse,
                              const ExactOptions& options, const Context& context) {
  all_bfloat16({{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {dout, "dout"}});
  check_float32(lse, "lse", "the lse of a bfloat16 forward");
  if (dlse) check_float32(*dlse, "dlse", "the gradient of a bfloat16 forward's lse");
  const auto q_view = input<bfloat16, 4>(q, "q");
  const auto k_view = input<bfloat16, 4>(k, "k");
  const auto v_view = input<bfloat16, 4>(v, "v");
  const auto dlse_view = dlse ? input<float, 3>(*dlse, "dlse") : View3<const float>();
  Bf16Output<4> dq(q_view.shape), dk(k_view.shape), dv(v_view.shape);
  {
    nb::gil_scoped_release release;
    exact_attention_backward<bfloat16>(context, q_view, k_view, v_view,
                                       input<bfloat16, 4>(out, "out"), input<float, 3>(lse, "lse"),
                                       input<bfloat16, 4>(dout, "dout"), dlse_view, options,
                                       dq.view(), dk.view(), dv.view());
  }
  return nb::make_tuple(dq.release(), dk.release(), dv.release());
}

}  // namespace subquad::python
