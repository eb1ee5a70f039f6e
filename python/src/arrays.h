// Arrays at the Python boundary: inputs are any CPU arrays (NumPy, or anything exporting
// DLPack or the buffer protocol) read in place as subquad views, with any element strides
// as long as the last dimension is contiguous (non-causal CAT: or the sequence dimension);
// outputs are new C-contiguous NumPy arrays (CAT: in the layout of its inputs).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "subquad/checked_size.h"
#include "subquad/context.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad::python {

namespace nb = nanobind;

// Any dtype is accepted by the caster and checked here, so that a wrong dtype raises
// ValueError naming the argument rather than nanobind's generic overload TypeError, and
// nothing is ever converted (converting would silently copy).
using Array = nb::ndarray<nb::ro, nb::device::cpu>;

// Return types that say what Python receives (new NumPy arrays, tuples of them), so that the
// type stub (python/tools/make_stub.py) reads every return type from the signatures.
// (device='cpu' only so that the stub's signature parses: an empty annotation does not.)
using NumpyArray = nb::ndarray<nb::numpy, nb::device::cpu>;
using ArrayResult = nb::typed<nb::object, NumpyArray>;
template <typename... Parts>
using TupleResult = nb::typed<nb::tuple, Parts...>;
using ArrayPair = TupleResult<NumpyArray, NumpyArray>;
using ArrayTriple = TupleResult<NumpyArray, NumpyArray, NumpyArray>;
using IntPair = TupleResult<int64_t, int64_t>;

enum class Scalar { f32, f64 };

// A named input argument.
struct Named {
  const Array& array;
  const char* name;
};

// "int64", "float16", "bfloat16", ...: NumPy's name of a DLPack dtype, for error messages.
std::string dtype_name(nb::dlpack::dtype dtype);

// The scalar type shared by all `arrays`; throws Error on other dtypes or a mix.
Scalar common_scalar(std::span<const Named> arrays);
inline Scalar common_scalar(std::initializer_list<Named> arrays) {
  return common_scalar(std::span<const Named>(arrays.begin(), arrays.size()));
}

// Calls body.template operator()<float or double>() for `scalar`.
template <typename Body>
auto dispatch(Scalar scalar, Body&& body) {
  if (scalar == Scalar::f32) return body.template operator()<float>();
  return body.template operator()<double>();
}

// A view of `array`, whose dtype is T (checked by common_scalar), with Rank dimensions; its
// strides not yet checked (input checks them; CAT's bindings check their own rule).
template <typename T, int Rank>
View<const T, Rank> input_unchecked(const Array& array, const char* name) {
  check(array.ndim() == size_t(Rank), name, ": expected ", Rank, " dimensions, got ", array.ndim());
  typename View<const T, Rank>::Shape shape{}, strides{};
  for (int i = 0; i < Rank; ++i) {
    shape[i] = int64_t(array.shape(size_t(i)));
    strides[i] = array.stride(size_t(i));
  }
  return View<const T, Rank>(static_cast<const T*>(array.data()), shape, strides);
}

// A view of `array` with its last dimension contiguous (check_view).
template <typename T, int Rank>
View<const T, Rank> input(const Array& array, const char* name) {
  const View<const T, Rank> view = input_unchecked<T, Rank>(array, name);
  check_view(view, name);
  return view;
}

// A new array of shape `shape`, zero-filled: written without the GIL, then handed to Python.
template <typename T, int Rank>
class Output {
 public:
  explicit Output(const std::array<int64_t, Rank>& shape) : shape_(shape) {
    const std::string what = "an output of shape " + shape_string(shape);
    const int64_t size = checked_product(shape, what.c_str());
    const size_t bytes = checked_bytes(size, sizeof(T), what.c_str());
    try {
      data_ = std::make_unique<T[]>(size_t(size));
    } catch (const std::bad_alloc&) {
      throw_out_of_memory(bytes, what);  // MemoryError naming the output
    }
  }
  View<T, Rank> view() const { return View<T, Rank>(data_.get(), shape_); }
  const std::array<int64_t, Rank>& shape() const { return shape_; }

  // A NumPy array owning the data (needs the GIL; the Output is empty afterwards).
  nb::object numpy() {
    T* data = data_.release();
    nb::capsule owner(data, [](void* pointer) noexcept { delete[] static_cast<T*>(pointer); });
    std::array<size_t, Rank> shape{};
    for (int i = 0; i < Rank; ++i) shape[size_t(i)] = size_t(shape_[size_t(i)]);
    return nb::cast(nb::ndarray<nb::numpy, T>(data, Rank, shape.data(), owner));
  }

 private:
  std::array<int64_t, Rank> shape_;
  std::unique_ptr<T[]> data_;
};

// Attention ops in the FlashAttention contract (exact, MLR): q, k, v [B, N|M, H|Hkv, D|Dv]
// -> (out [B, N, H, Dv], lse [B, H, N]). `kernel(q, k, v, out, lse)` runs without the GIL on
// views of the common dtype (a generic lambda: the scalar type is deduced from the views).
template <typename Kernel>
ArrayPair attention_forward(const Array& q, const Array& k, const Array& v, Kernel&& kernel) {
  return dispatch(common_scalar({{q, "q"}, {k, "k"}, {v, "v"}}), [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto k_view = input<T, 4>(k, "k");
    const auto v_view = input<T, 4>(v, "v");
    const int64_t B = q_view.dim(0), N = q_view.dim(1), H = q_view.dim(2);
    Output<T, 4> out({B, N, H, v_view.dim(3)});
    Output<T, 3> lse({B, H, N});
    {
      nb::gil_scoped_release release;
      kernel(q_view, k_view, v_view, out.view(), lse.view());
    }
    return nb::make_tuple(out.numpy(), lse.numpy());
  });
}

// Their backward: (q, k, v, out, lse, dout) -> (dq, dk, dv) shaped like q, k, v;
// `kernel(q, k, v, out, lse, dout, dq, dk, dv)` runs without the GIL.
template <typename Kernel>
ArrayTriple attention_backward(const Array& q, const Array& k, const Array& v, const Array& out,
                               const Array& lse, const Array& dout, Kernel&& kernel) {
  const Scalar scalar =
      common_scalar({{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {lse, "lse"}, {dout, "dout"}});
  return dispatch(scalar, [&]<typename T>() {
    const auto q_view = input<T, 4>(q, "q");
    const auto k_view = input<T, 4>(k, "k");
    const auto v_view = input<T, 4>(v, "v");
    const auto out_view = input<T, 4>(out, "out");
    const auto lse_view = input<T, 3>(lse, "lse");
    const auto dout_view = input<T, 4>(dout, "dout");
    Output<T, 4> dq(q_view.shape), dk(k_view.shape), dv(v_view.shape);
    {
      nb::gil_scoped_release release;
      kernel(q_view, k_view, v_view, out_view, lse_view, dout_view, dq.view(), dk.view(),
             dv.view());
    }
    return nb::make_tuple(dq.numpy(), dk.numpy(), dv.numpy());
  });
}

// The execution context for a `threads` argument (0: all cores; the policy of
// subquad/context.h), with the workspace of this thread's innermost `with subquad.Workspace()`
// block, if any (workspace.cpp).
Context context_for(int64_t threads);
Workspace* current_workspace();

}  // namespace subquad::python
