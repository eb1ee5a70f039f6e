// Bindings of CAT, circular-convolutional attention (include/subquad/cat.h): the circulant
// forward and backward, the averaged-key and causal variants, and the causal decoder.
#include "subquad/cat.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <variant>

#include "arrays.h"
#include "bindings.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

CatConvention parse_convention(const std::string& convention) {
  return parse_choice<CatConvention>(
      convention, "convention", {{"roll", CatConvention::roll}, {"conv", CatConvention::conv}});
}

CatPath parse_path(const std::string& path) {
  return parse_choice<CatPath>(
      path, "path",
      {{"automatic", CatPath::automatic}, {"direct", CatPath::direct}, {"fft", CatPath::fft}});
}

CatOptions cat_options(const std::string& convention, const std::string& path) {
  CatOptions options;
  options.convention = parse_convention(convention);
  options.path = parse_path(path);
  return options;
}

CatAvgKeyOptions avgkey_options(std::optional<double> scale, const std::string& convention,
                                const std::string& path) {
  CatAvgKeyOptions options;
  options.scale = scale;
  options.convention = parse_convention(convention);
  options.path = parse_path(path);
  return options;
}

CatCausalOptions causal_options(const std::string& path) {
  CatCausalOptions options;
  options.path = parse_path(path);
  return options;
}

nb::object forward(const Array& z, const Array& v, const std::string& convention,
                   const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatOptions options = cat_options(convention, path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}}), [&]<typename T>() {
    const auto z_view = input<T, 3>(z, "z");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 4> out(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_forward<T>(context, z_view, v_view, options, out.view());
    }
    return out.numpy();
  });
}

nb::tuple backward(const Array& z, const Array& v, const Array& dout, const std::string& convention,
                   const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatOptions options = cat_options(convention, path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}, {dout, "dout"}}), [&]<typename T>() {
    const auto z_view = input<T, 3>(z, "z");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 3> dz(z_view.shape);
    Output<T, 4> dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_backward<T>(context, z_view, v_view, input<T, 4>(dout, "dout"), options, dz.view(),
                      dv.view());
    }
    return nb::make_tuple(dz.numpy(), dv.numpy());
  });
}

nb::object avgkey_forward(const Array& q, const Array& k, const Array& v,
                          std::optional<double> scale, const std::string& convention,
                          const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatAvgKeyOptions options = avgkey_options(scale, convention, path);
  return dispatch(common_scalar({{q, "q"}, {k, "k"}, {v, "v"}}), [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 4> out(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_avgkey_forward<T>(context, q_view, input<T, 4>(k, "k"), v_view, options, out.view());
    }
    return out.numpy();
  });
}

nb::tuple avgkey_backward(const Array& q, const Array& k, const Array& v, const Array& dout,
                          std::optional<double> scale, const std::string& convention,
                          const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatAvgKeyOptions options = avgkey_options(scale, convention, path);
  const Scalar scalar = common_scalar({{q, "q"}, {k, "k"}, {v, "v"}, {dout, "dout"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto k_view = input<T, 4>(k, "k");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 4> dq(q_view.shape);
    Output<T, 4> dk(k_view.shape);
    Output<T, 4> dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_avgkey_backward<T>(context, q_view, k_view, v_view, input<T, 4>(dout, "dout"), options,
                             dq.view(), dk.view(), dv.view());
    }
    return nb::make_tuple(dq.numpy(), dk.numpy(), dv.numpy());
  });
}

nb::object causal_forward(const Array& z, const Array& v, const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatCausalOptions options = causal_options(path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}}), [&]<typename T>() {
    const auto z_view = input<T, 3>(z, "z");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 4> out(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_causal_forward<T>(context, z_view, v_view, options, out.view());
    }
    return out.numpy();
  });
}

nb::tuple causal_backward(const Array& z, const Array& v, const Array& out, const Array& dout,
                          const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatCausalOptions options = causal_options(path);
  const Scalar scalar = common_scalar({{z, "z"}, {v, "v"}, {out, "out"}, {dout, "dout"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto z_view = input<T, 3>(z, "z");
    const auto v_view = input<T, 4>(v, "v");
    Output<T, 3> dz(z_view.shape);
    Output<T, 4> dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      cat_causal_backward<T>(context, z_view, v_view, input<T, 4>(out, "out"),
                             input<T, 4>(dout, "dout"), options, dz.view(), dv.view());
    }
    return nb::make_tuple(dz.numpy(), dv.numpy());
  });
}

// CatCausalDecoder<float> or CatCausalDecoder<double>, chosen by a dtype string.
class CatDecoderBinding {
 public:
  CatDecoderBinding(int64_t heads, int64_t value_dim, const std::string& dtype)
      : decoder_(make(heads, value_dim, dtype)) {}

  nb::object append(const Array& z, const Array& v) {
    const Scalar scalar = common_scalar({{z, "z"}, {v, "v"}});
    return std::visit(
        [&]<typename T>(CatCausalDecoder<T>& decoder) {
          check(scalar == (sizeof(T) == 4 ? Scalar::f32 : Scalar::f64),
                "z: expected the decoder's dtype ", sizeof(T) == 4 ? "float32" : "float64");
          const auto v_view = input<T, 2>(v, "v");
          Output<T, 2> out(v_view.shape);
          {
            nb::gil_scoped_release release;
            decoder.append(input<T, 1>(z, "z"), v_view, out.view());
          }
          return out.numpy();
        },
        decoder_);
  }
  int64_t length() const {
    return std::visit([](const auto& decoder) { return decoder.length(); }, decoder_);
  }

 private:
  using Variant = std::variant<CatCausalDecoder<float>, CatCausalDecoder<double>>;
  static Variant make(int64_t heads, int64_t value_dim, const std::string& dtype) {
    check(dtype == "float32" || dtype == "float64",
          "dtype: expected \"float32\" or \"float64\", got \"", dtype, "\"");
    if (dtype == "float32") return CatCausalDecoder<float>(heads, value_dim);
    return CatCausalDecoder<double>(heads, value_dim);
  }
  Variant decoder_;
};

}  // namespace

void bind_cat(nb::module_& m) {
  m.def("cat_forward", &forward, "z"_a, "v"_a, nb::kw_only(), "convention"_a = "roll",
        "path"_a = "automatic", "threads"_a = 0,
        R"(CAT (circular-convolutional attention), forward.

z [B, N, H] (scores), v [B, N, H, Dv] -> out [B, N, H, Dv]. Per (batch, head)
s = softmax(z) over the sequence and the attention matrix is the circulant of s:
convention "roll" A[i, j] = s[(j - i) mod N] (default), "conv" A[i, j] = s[(i - j) mod N].
path "automatic" (direct gather below a measured N, FFT above), "direct" or "fft".
Non-finite z raises ValueError.)");

  m.def("cat_backward", &backward, "z"_a, "v"_a, "dout"_a, nb::kw_only(), "convention"_a = "roll",
        "path"_a = "automatic", "threads"_a = 0,
        R"(CAT, backward: dout [B, N, H, Dv] -> (dz [B, N, H], dv [B, N, H, Dv]).)");

  m.def("cat_avgkey_forward", &avgkey_forward, "q"_a, "k"_a, "v"_a, nb::kw_only(),
        "scale"_a = nb::none(), "convention"_a = "roll", "path"_a = "automatic", "threads"_a = 0,
        R"(Averaged-key CAT, forward.

q, k [B, N, H, D], v [B, N, H, Dv] -> out [B, N, H, Dv] with
z[b, i, h] = scale * <q[b, i, h], mean_j k[b, j, h]> (scale None: 1/sqrt(D)), then CAT.)");

  m.def("cat_avgkey_backward", &avgkey_backward, "q"_a, "k"_a, "v"_a, "dout"_a, nb::kw_only(),
        "scale"_a = nb::none(), "convention"_a = "roll", "path"_a = "automatic", "threads"_a = 0,
        R"(Averaged-key CAT, backward: -> (dq, dk [B, N, H, D], dv [B, N, H, Dv]).)");

  m.def("cat_causal_forward", &causal_forward, "z"_a, "v"_a, nb::kw_only(), "path"_a = "automatic",
        "threads"_a = 0,
        R"(Causal CAT (lag convention), forward.

z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv],
out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).
path "automatic" (exact direct blocks near the diagonal, float64 FFT blocks elsewhere) or
"direct" (O(N^2 Dv)).)");

  m.def("cat_causal_backward", &causal_backward, "z"_a, "v"_a, "out"_a, "dout"_a, nb::kw_only(),
        "path"_a = "automatic", "threads"_a = 0,
        R"(Causal CAT, backward from the forward's out: -> (dz [B, N, H], dv [B, N, H, Dv]).)");

  nb::class_<CatDecoderBinding>(m, "CatCausalDecoder",
                                R"(Token-by-token causal CAT for one sequence of `heads` heads.

CatCausalDecoder(heads, value_dim, *, dtype="float32"); append(z [H], v [H, Dv]) ->
out [H, Dv] equals row `length - 1` of cat_causal_forward. Caches z and v only.)")
      .def(nb::init<int64_t, int64_t, const std::string&>(), "heads"_a, "value_dim"_a,
           nb::kw_only(), "dtype"_a = "float32")
      .def("append", &CatDecoderBinding::append, "z"_a, "v"_a,
           "Appends one token: z [H], v [H, Dv] -> its output [H, Dv].")
      .def_prop_ro("length", &CatDecoderBinding::length, "Tokens appended so far.");
}

}  // namespace subquad::python
