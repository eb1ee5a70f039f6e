// Non-owning strided views: a pointer, a shape and element strides (int64). The operators
// take views whose last dimension is contiguous (stride 1); other strides are free, so slices
// and transposed-batch layouts are accepted without copies. CAT also takes views whose
// sequence axis is the contiguous one (sequence-last memory, include/subquad/cat.h).
#pragma once

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <type_traits>

#include "subquad/checked_size.h"
#include "subquad/error.h"

namespace subquad {

template <typename T, int Rank>
struct View {
  static_assert(Rank >= 1, "a view has at least one dimension");
  using Shape = std::array<int64_t, Rank>;

  T* data = nullptr;
  Shape shape{};
  Shape strides{};

  View() = default;
  View(T* data_, const Shape& shape_, const Shape& strides_)
      : data(data_), shape(shape_), strides(strides_) {}
  // Contiguous row-major view. Strides that would overflow int64 are left at 0: such a
  // shape either has zero volume (strides unused) or an element count beyond int64, which
  // size() and check_view() refuse.
  View(T* data_, const Shape& shape_) : data(data_), shape(shape_) {
    int64_t stride = 1;
    for (int i = Rank - 1; i >= 0; --i) {
      strides[i] = stride;
      if (__builtin_mul_overflow(stride, shape[i], &stride)) stride = 0;
    }
  }
  // A view of const T from a view of T.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> &&
                                                    !std::is_same_v<U, T>>>
  View(const View<U, Rank>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data), shape(other.shape), strides(other.strides) {}

  int64_t dim(int i) const { return shape[i]; }
  int64_t size() const { return checked_product(shape, "view shape"); }
  bool empty() const { return data == nullptr; }
  bool is_contiguous() const {
    int64_t stride = 1;
    for (int i = Rank - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != stride) return false;
      if (__builtin_mul_overflow(stride, shape[i], &stride)) return false;
    }
    return true;
  }

  template <typename... Index>
  T& operator()(Index... index) const {
    static_assert(sizeof...(Index) == Rank, "one index per dimension");
    const std::array<int64_t, Rank> idx{static_cast<int64_t>(index)...};
    int64_t offset = 0;
    for (int i = 0; i < Rank; ++i) offset += idx[i] * strides[i];
    return data[offset];
  }
  // Pointer to the contiguous last-dimension row at the given leading indices.
  template <typename... Index>
  T* row(Index... index) const {
    static_assert(sizeof...(Index) == Rank - 1, "one index per leading dimension");
    const std::array<int64_t, Rank - 1> idx{static_cast<int64_t>(index)...};
    int64_t offset = 0;
    for (int i = 0; i < Rank - 1; ++i) offset += idx[i] * strides[i];
    return data + offset;
  }
};

template <typename T> using View1 = View<T, 1>;
template <typename T> using View2 = View<T, 2>;
template <typename T> using View3 = View<T, 3>;
template <typename T> using View4 = View<T, 4>;
template <typename T> using View5 = View<T, 5>;

// "[2, 3, 4]": for error messages.
template <typename Shape>
std::string shape_string(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// The same text, formatted only when streamed: check(ok, "q: got ", shape_text(q.shape))
// builds no string unless the check fails (a shape longer than 15 characters, 5-D grids or
// N >= 1000, would leave std::string's inline buffer: heap allocations on every call). It
// holds a copy of the shape, so it may outlive the array it was made from.
template <size_t Rank>
struct ShapeText {
  std::array<int64_t, Rank> shape;
  friend std::ostream& operator<<(std::ostream& stream, const ShapeText& text) {
    stream << '[';
    for (size_t i = 0; i < Rank; ++i) stream << (i ? ", " : "") << text.shape[i];
    return stream << ']';
  }
};

template <size_t Rank>
ShapeText<Rank> shape_text(const std::array<int64_t, Rank>& shape) {
  return {shape};
}

// Checks at the public boundary that a view is usable: non-negative shape whose element
// count and largest offset fit in int64; when non-empty: non-null, dimension
// `contiguous_dim` contiguous (stride 1), non-negative strides. `name` is the argument's
// name. Kernels that read along another axis than the last (CAT on sequence-last memory)
// check with that axis; everything else uses check_view below.
template <typename T, int Rank>
void check_view_contiguous_in(const View<T, Rank>& view, int contiguous_dim, const char* name) {
  for (int i = 0; i < Rank; ++i)
    check(view.shape[i] >= 0, name, ": dimension ", i, " is negative in shape ",
          shape_text(view.shape));
  const int64_t count = checked_product(view.shape, name);
  // An empty view is never read, so its strides do not matter (NumPy 2 gives zero-size
  // arrays all-zero strides).
  if (count == 0) return;
  check(view.data != nullptr, name, ": null data for shape ", shape_text(view.shape));
  if (contiguous_dim == Rank - 1)
    check(view.shape[Rank - 1] <= 1 || view.strides[Rank - 1] == 1, name,
          ": the last dimension must be contiguous (stride 1), got stride ",
          view.strides[Rank - 1]);
  else
    check(view.shape[contiguous_dim] <= 1 || view.strides[contiguous_dim] == 1, name,
          ": dimension ", contiguous_dim, " must be contiguous (stride 1), got stride ",
          view.strides[contiguous_dim]);
  for (int i = 0; i < Rank; ++i)
    check(view.strides[i] >= 0, name, ": negative stride ", view.strides[i], " in dimension ",
          i);
  int64_t last_offset = 0;
  for (int i = 0; i < Rank; ++i)
    last_offset =
        checked_add(last_offset, checked_mul(view.shape[i] - 1, view.strides[i], name), name);
}

// The common case: the last dimension contiguous.
template <typename T, int Rank>
void check_view(const View<T, Rank>& view, const char* name) {
  check_view_contiguous_in(view, Rank - 1, name);
}

// Checks that `view` has exactly `expected` as shape.
template <typename T, int Rank>
void check_shape(const View<T, Rank>& view, const typename View<T, Rank>::Shape& expected,
                 const char* name) {
  check(view.shape == expected, name, ": expected shape ", shape_text(expected), ", got ",
        shape_text(view.shape));
}

}  // namespace subquad
