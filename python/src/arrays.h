// Arrays at the Python boundary: inputs are any CPU arrays (NumPy, or anything exporting
// DLPack or the buffer protocol) read in place as subquad views, with any element strides
// as long as the last dimension is contiguous; outputs are new C-contiguous NumPy arrays.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "subquad/context.h"
#include "subquad/error.h"
#include "subquad/view.h"

namespace subquad::python {

namespace nb = nanobind;

// Any dtype is accepted by the caster and checked here, so that a wrong dtype raises
// ValueError naming the argument rather than nanobind's generic overload TypeError, and
// nothing is ever converted (converting would silently copy).
using Array = nb::ndarray<nb::ro, nb::device::cpu>;

enum class Scalar { f32, f64 };

// A named input argument.
struct Named {
  const Array& array;
  const char* name;
};

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

// A view of `array`, whose dtype is T (checked by common_scalar), with Rank dimensions.
template <typename T, int Rank>
View<const T, Rank> input(const Array& array, const char* name) {
  check(array.ndim() == size_t(Rank), name, ": expected ", Rank, " dimensions, got ", array.ndim());
  typename View<const T, Rank>::Shape shape{}, strides{};
  for (int i = 0; i < Rank; ++i) {
    shape[i] = int64_t(array.shape(size_t(i)));
    strides[i] = array.stride(size_t(i));
  }
  View<const T, Rank> view(static_cast<const T*>(array.data()), shape, strides);
  check_view(view, name);
  return view;
}

// A new array of shape `shape`, zero-filled: written without the GIL, then handed to Python.
template <typename T, int Rank>
class Output {
 public:
  explicit Output(const std::array<int64_t, Rank>& shape) : shape_(shape) {
    int64_t size = 1;
    for (int64_t extent : shape) {
      check(extent >= 0, "output: negative dimension in shape ", shape_string(shape));
      check(!__builtin_mul_overflow(size, extent, &size), "output: shape ", shape_string(shape),
            " has more elements than int64 can count");
    }
    data_ = std::make_unique<T[]>(size_t(size));
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

// The execution context for a `threads` argument (0: OpenMP's default).
Context context_for(int threads);

// An enum option given as a string ("paper", "roll", ...), as the CLI spells it.
template <typename Enum>
struct Choice {
  const char* text;
  Enum value;
};

template <typename Enum>
Enum parse_choice(const std::string& text, const char* name,
                  std::initializer_list<Choice<Enum>> choices) {
  std::string expected;
  for (const Choice<Enum>& choice : choices) {
    if (text == choice.text) return choice.value;
    expected += (expected.empty() ? "" : "|") + std::string(choice.text);
  }
  throw_error(name, ": expected one of ", expected, ", got \"", text, "\"");
}

}  // namespace subquad::python
