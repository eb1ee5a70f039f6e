// Bindings of CAT, circular-convolutional attention (include/subquad/cat.h): the circulant
// forward and backward, the averaged-key and causal variants, and causal decoding.
#include "common/option_names.h"
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

// Non-causal CAT reads z, v and dout in place with either their last axis or their sequence
// axis (1) contiguous: a [B, N, H, Dv] view of [B, H, Dv, N] memory (sequence-last) is the
// fastest layout (include/subquad/cat.h).
template <typename T, int Rank>
View<const T, Rank> cat_input(const Array& array, const char* name) {
  const View<const T, Rank> view = input_unchecked<T, Rank>(array, name);
  const bool last = view.shape[Rank - 1] <= 1 || view.strides[Rank - 1] == 1;
  const bool sequence = view.shape[1] <= 1 || view.strides[1] == 1;
  check(last || sequence, name, ": the last dimension (stride ", view.strides[Rank - 1],
        ") or the sequence dimension 1 (stride ", view.strides[1],
        ") must be contiguous (stride 1)");
  check_view_contiguous_in(view, last ? Rank - 1 : 1, name);
  return view;
}

template <typename T, int Rank>
bool sequence_last(const View<const T, Rank>& view) {
  return !(view.shape[Rank - 1] <= 1 || view.strides[Rank - 1] == 1);
}

// An output [B, N, H, Dv] (or [B, N, H]) in the layout of `like`: sequence-last memory
// [B, H, Dv, N] when `like` is sequence-last, else C-contiguous. view() is the operator's
// [B, N, H, ...] view; release() the array with that shape (a transposed view when
// sequence-last).
template <typename T, int Rank>
class LayoutOutput {
 public:
  LayoutOutput(const std::array<int64_t, Rank>& shape, bool sequence_last)
      : shape_(shape), sequence_last_(sequence_last), output_(memory_shape(shape, sequence_last)) {}
  View<T, Rank> view() const {
    if (!sequence_last_) return output_.view();
    // Memory [B, H, (Dv,) N]: the sequence stride is 1, the others follow.
    std::array<int64_t, Rank> strides{};
    const int64_t N = shape_[1];
    int64_t stride = N;
    for (int i = Rank - 1; i >= 2; --i) {
      strides[i] = stride;
      stride *= shape_[i];
    }
    strides[1] = 1;
    strides[0] = stride;
    return View<T, Rank>(output_.view().data, shape_, strides);
  }
  nb::object release() {
    // NumPy reorders axes with transpose(*axes), torch (an outputs_from tensor) with permute.
    const char* reorder = output_.allocated() ? "permute" : "transpose";
    nb::object array = output_.release();
    if (!sequence_last_) return array;
    return Rank == 4 ? array.attr(reorder)(0, 3, 1, 2) : array.attr(reorder)(0, 2, 1);
  }

 private:
  static std::array<int64_t, Rank> memory_shape(const std::array<int64_t, Rank>& shape,
                                                bool sequence_last) {
    if (!sequence_last) return shape;
    std::array<int64_t, Rank> memory{};
    memory[0] = shape[0];
    for (int i = 2; i < Rank; ++i) memory[i - 1] = shape[i];
    memory[Rank - 1] = shape[1];
    return memory;
  }
  std::array<int64_t, Rank> shape_;
  bool sequence_last_;
  Output<T, Rank> output_;
};

ArrayResult forward(const Array& z, const Array& v, const std::string& convention,
                    const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatOptions options = cat_options(convention, path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}}), [&]<typename T>() {
    const auto z_view = cat_input<T, 3>(z, "z");
    const auto v_view = cat_input<T, 4>(v, "v");
    LayoutOutput<T, 4> out(v_view.shape, sequence_last(v_view));
    {
      nb::gil_scoped_release release;
      cat_forward<T>(context, z_view, v_view, options, out.view());
    }
    return out.release();
  });
}

ArrayPair backward(const Array& z, const Array& v, const Array& dout, const std::string& convention,
                   const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatOptions options = cat_options(convention, path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}, {dout, "dout"}}), [&]<typename T>() {
    const auto z_view = cat_input<T, 3>(z, "z");
    const auto v_view = cat_input<T, 4>(v, "v");
    const auto dout_view = cat_input<T, 4>(dout, "dout");
    LayoutOutput<T, 3> dz(z_view.shape, sequence_last(z_view));
    LayoutOutput<T, 4> dv(v_view.shape, sequence_last(v_view));
    {
      nb::gil_scoped_release release;
      cat_backward<T>(context, z_view, v_view, dout_view, options, dz.view(), dv.view());
    }
    return nb::make_tuple(dz.release(), dv.release());
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
    return out.release();
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
    return nb::make_tuple(dq.release(), dk.release(), dv.release());
  });
}

ArrayResult causal_forward(const Array& z, const Array& v, const std::string& path,
                           int64_t threads) {
  const Context context = context_for(threads);
  const CatCausalOptions options = causal_options(path);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}}), [&]<typename T>() {
    const auto z_view = cat_input<T, 3>(z, "z");
    const auto v_view = cat_input<T, 4>(v, "v");
    LayoutOutput<T, 4> out(v_view.shape, sequence_last(v_view));
    {
      nb::gil_scoped_release release;
      cat_causal_forward<T>(context, z_view, v_view, options, out.view());
    }
    return out.release();
  });
}

ArrayPair causal_backward(const Array& z, const Array& v, const Array& out, const Array& dout,
                          const std::string& path, int64_t threads) {
  const Context context = context_for(threads);
  const CatCausalOptions options = causal_options(path);
  const Scalar scalar = common_scalar({{z, "z"}, {v, "v"}, {out, "out"}, {dout, "dout"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto z_view = cat_input<T, 3>(z, "z");
    const auto v_view = cat_input<T, 4>(v, "v");
    LayoutOutput<T, 3> dz(z_view.shape, sequence_last(z_view));
    LayoutOutput<T, 4> dv(v_view.shape, sequence_last(v_view));
    {
      nb::gil_scoped_release release;
      cat_causal_backward<T>(context, z_view, v_view, cat_input<T, 4>(out, "out"),
                             cat_input<T, 4>(dout, "dout"), options, dz.view(), dv.view());
    }
    return nb::make_tuple(dz.release(), dv.release());
  });
}

ArrayResult causal_decode(const Array& z, const Array& v, int64_t tokens, int64_t threads) {
  const Context context = context_for(threads);
  return dispatch(common_scalar({{z, "z"}, {v, "v"}}), [&]<typename T>() {
    const auto z_view = input<T, 3>(z, "z");
    const auto v_view = input<T, 4>(v, "v");
    check(tokens >= 0 && tokens <= z_view.dim(1), "tokens: expected 0 to the ", z_view.dim(1),
          " held in z, got ", tokens);
    Output<T, 4> out({z_view.dim(0), tokens, z_view.dim(2), v_view.dim(3)});
    {
      nb::gil_scoped_release release;
      cat_causal_decode<T>(context, z_view, v_view, out.view());
    }
    return out.release();
  });
}

}  // namespace

void bind_cat(nb::module_& m) {
  m.def("cat_forward", &forward, "z"_a, "v"_a, nb::kw_only(), "convention"_a = "roll",
        "path"_a = "automatic", "threads"_a = 0,
        R"(CAT (circular-convolutional attention), forward.

z [B, N, H] (scores), v [B, N, H, Dv] -> out [B, N, H, Dv]. Per (batch, head)
s = softmax(z) over the sequence and the attention matrix is the circulant of s:
convention "roll" A[i, j] = s[(j - i) mod N] (default), "conv" A[i, j] = s[(i - j) mod N].
path "automatic" (direct gather below a measured N, FFT above), "direct" or "fft".
Non-finite z or v propagates (NaN heads or columns).
Layouts: z and v are read in place with their last or their sequence axis contiguous. The
fastest from N = 1024 on, and for every backward, is sequence-last: v a [B, N, H, Dv] view
of [B, H, Dv, N] memory (e.g. x.transpose(0, 3, 1, 2) of a C-contiguous [B, H, Dv, N]
array), whose value columns the transforms run on in place (measured, one thread, H = 8:
forward 1.13-1.79x, backward 1.28-3.02x faster than [B, N, H, Dv]); at N = 256 the float32
forward on [B, N, H, Dv] was faster (0.76-0.88x the time). out comes back in v's layout (a
[B, N, H, Dv] view of new [B, H, Dv, N] memory when sequence-last).)");

  m.def("cat_backward", &backward, "z"_a, "v"_a, "dout"_a, nb::kw_only(), "convention"_a = "roll",
        "path"_a = "automatic", "threads"_a = 0,
        R"(CAT, backward: dout [B, N, H, Dv] -> (dz [B, N, H], dv [B, N, H, Dv]).

Layouts as cat_forward's: dz comes back in z's layout, dv in v's.)");

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
oracle of the FFT blocks). Non-finite z or v propagate to the rows that see them.
Layouts as cat_forward's: sequence-last v (a [B, N, H, Dv] view of [B, H, Dv, N] memory) is
read in place and out comes back in that layout.)");

  m.def("cat_causal_backward", &causal_backward, "z"_a, "v"_a, "out"_a, "dout"_a, nb::kw_only(),
        "path"_a = "automatic", "threads"_a = 0,
        R"(Causal CAT, backward from the forward's out: -> (dz [B, N, H], dv [B, N, H, Dv]).

Layouts as cat_forward's: dz comes back in z's layout, dv in v's.)");

  m.def("cat_causal_decode", &causal_decode, "z"_a, "v"_a, nb::kw_only(), "tokens"_a,
        "threads"_a = 0,
        R"(Causal CAT decoding over caller-owned state: z [B, S, H], v [B, S, H, Dv] hold every
token seen, the `tokens` new ones last -> out [B, tokens, H, Dv], rows S - tokens .. S - 1 of
cat_causal_forward. Slices of larger buffers are read in place.)");
}

const BindingRegistrar cat_bindings("cat", &bind_cat);

}  // namespace subquad::python
