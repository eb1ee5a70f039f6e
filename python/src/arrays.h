// Arrays at the Python boundary: inputs are any CPU arrays (NumPy, or anything exporting
// DLPack or the buffer protocol) read in place as subquad views, with any element strides
// as long as the last dimension is contiguous (non-causal CAT: or the sequence dimension);
// outputs are new C-contiguous NumPy arrays (CAT: in the layout of its inputs), or the
// arrays an outputs_from allocator returns (torch tensors, for subquad.ops).
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
#include <type_traits>
#include <utility>

#include "subquad/bfloat16.h"
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

// The element dtype of T: float32, float64 or bfloat16.
template <typename T>
nb::dlpack::dtype dtype_of() {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  } else {
    return nb::dtype<T>();
  }
}

// The allocator of this thread's innermost `with subquad._core.outputs_from(allocate)` block,
// or an invalid handle when there is none (outputs.cpp).
nb::handle current_output_allocator();

// The memory of `allocated`, the allocator's answer for an output of `shape` and `dtype`:
// checked to be a writable, C-contiguous CPU array of that shape and dtype (Error otherwise).
void* allocated_output(nb::handle allocated, std::span<const int64_t> shape,
                       nb::dlpack::dtype dtype, const std::string& what);

// A new output of shape `shape`: written without the GIL, then handed to Python by release().
// Its memory is not zero-filled (every operator writes its outputs whole; the tests fill
// allocated outputs with NaN to hold them to it). By default it is a new NumPy array (for
// bfloat16, which NumPy lacks, an ndarray exporting DLPack); inside
// `with _core.outputs_from(allocate)` it is whatever allocate(shape, dtype name) returns:
// subquad.ops passes torch.empty, so that its operators return torch-allocated tensors.
template <typename T, int Rank>
class Output {
 public:
  explicit Output(const std::array<int64_t, Rank>& shape) : shape_(shape) {
    const std::string what = "an output of shape " + shape_string(shape);
    const int64_t size = checked_product(shape, what.c_str());
    const size_t bytes = checked_bytes(size, sizeof(T), what.c_str());
    if (const nb::handle allocate = current_output_allocator(); allocate.is_valid()) {
      nb::tuple python_shape = nb::steal<nb::tuple>(PyTuple_New(Rank));
      for (int i = 0; i < Rank; ++i) {
        PyTuple_SET_ITEM(python_shape.ptr(), i, PyLong_FromLongLong(shape[size_t(i)]));
      }
      allocated_ = allocate(python_shape, dtype_name(dtype_of<T>()));
      data_ = static_cast<T*>(allocated_output(allocated_, shape, dtype_of<T>(), what));
      return;
    }
    try {
      owned_ = std::make_unique_for_overwrite<T[]>(size_t(size));
    } catch (const std::bad_alloc&) {
      throw_out_of_memory(bytes, what);  // MemoryError naming the output
    }
    data_ = owned_.get();
  }
  View<T, Rank> view() const { return View<T, Rank>(data_, shape_); }
  const std::array<int64_t, Rank>& shape() const { return shape_; }
  // Whether the memory came from an outputs_from allocator (a torch tensor, for subquad.ops).
  bool allocated() const { return allocated_.is_valid(); }

  // The output as a Python object (needs the GIL; the Output is empty afterwards).
  nb::object release() {
    if (allocated_.is_valid()) return std::move(allocated_);
    T* data = owned_.release();
    nb::capsule owner(data, [](void* pointer) noexcept { delete[] static_cast<T*>(pointer); });
    std::array<size_t, Rank> shape{};
    for (int i = 0; i < Rank; ++i) shape[size_t(i)] = size_t(shape_[size_t(i)]);
    if constexpr (std::is_same_v<T, bfloat16>) {
      return nb::cast(nb::ndarray<>(data, Rank, shape.data(), owner, nullptr, dtype_of<T>(),
                                    nb::device::cpu::value));
    } else {
      return nb::cast(nb::ndarray<nb::numpy, T>(data, Rank, shape.data(), owner));
    }
  }

 private:
  std::array<int64_t, Rank> shape_;
  std::unique_ptr<T[]> owned_;
  nb::object allocated_;
  T* data_ = nullptr;
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
    return nb::make_tuple(out.release(), lse.release());
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
    return nb::make_tuple(dq.release(), dk.release(), dv.release());
  });
}

// The execution context for a `threads` argument (0: all cores; the policy of
// subquad/context.h), with the workspace of this thread's innermost `with subquad.Workspace()`
// block, if any (workspace.cpp).
Context context_for(int64_t threads);
Workspace* current_workspace();

}  // namespace subquad::python
