// Bindings of CAT, circular-convolutional attention (include/subquad/cat.h): the circulant
// forward and backward, the averaged-key and causal variants, and the causal decoder.
#include "subquad/cat.h"
#include "subquad/option_names.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <variant>

#include "arrays.h"
#include "bindings.h"
#include "decode_cache.h"

namespace subquad::python {

using namespace nb::literals;

namespace {

CatConvention parse_convention(const std::string& convention) {
  return parse_option(convention, "convention", kCatConventionNames);
}

CatPath parse_path(const std::string& path) { return parse_option(path, "path", kCatPathNames); }

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

ArrayResult forward(const Array& z, const Array& v, const std::string& convention,
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

ArrayPair backward(const Array& z, const Array& v, const Array& dout, const std::string& convention,
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

ArrayResult avgkey_forward(const Array& q, const Array& k, const Array& v,
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

ArrayTriple avgkey_backward(const Array& q, const Array& k, const Array& v, const Array& dout,
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

ArrayResult causal_forward(const Array& z, const Array& v, const std::string& path,
                           int64_t threads) {
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

ArrayPair causal_backward(const Array& z, const Array& v, const Array& out, const Array& dout,
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

using CatDecoder = CacheVariant<CatCausalDecoder<float>, CatCausalDecoder<double>>;

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
path "automatic" (exact direct blocks near the diagonal, float64 FFT blocks elsewhere),
"direct" (O(N^2 Dv)) or "fft" (FFT blocks down to single rows, no direct blocks: the test
oracle of the FFT blocks). Non-finite z or v propagate to the rows that see them.)");

  m.def("cat_causal_backward", &causal_backward, "z"_a, "v"_a, "out"_a, "dout"_a, nb::kw_only(),
        "path"_a = "automatic", "threads"_a = 0,
        R"(Causal CAT, backward from the forward's out: -> (dz [B, N, H], dv [B, N, H, Dv]).)");

  nb::class_<CatDecoder> decoder(m, "CatCausalDecoder",
                                 R"(Token-by-token causal CAT for `batch` sequences of `heads` heads.

CatCausalDecoder(batch, heads, value_dim, *, dtype="float32"). update(z=[B, T, H],
v=[B, T, H, Dv]) -> out [B, T, H, Dv], rows seen .. seen + T - 1 of cat_causal_forward.
Caches z and v only; truncate rolls back exactly.)");
  decoder.def(
      "__init__",
      [](CatDecoder* self, int64_t batch, int64_t heads, int64_t value_dim,
         const std::string& dtype) {
        if (is_float32(dtype))
          new (self) CatDecoder(CatCausalDecoder<float>(batch, heads, value_dim));
        else
          new (self) CatDecoder(CatCausalDecoder<double>(batch, heads, value_dim));
      },
      "batch"_a, "heads"_a, "value_dim"_a, nb::kw_only(), "dtype"_a = "float32");
  bind_decode_verbs(decoder,
                    "Appends T tokens per sequence: z [B, T, H], v [B, T, H, Dv] -> their "
                    "outputs [B, T, H, Dv].");
}

const BindingRegistrar cat_bindings("cat", &bind_cat);

}  // namespace subquad::python
