// bfloat16 arrays at the Python boundary. NumPy has no bfloat16, so bfloat16 inputs come
// through DLPack (torch.bfloat16 tensors, read in place like every input) and bfloat16
// outputs leave as nanobind ndarrays that export DLPack only (torch.from_dlpack turns them
// into torch.bfloat16 tensors without a copy; torch 1.13 and 2.x).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>

#include "arrays.h"
#include "subquad/bfloat16.h"

namespace subquad::python {

inline constexpr nb::dlpack::dtype kBfloat16Dtype{
    static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};

inline bool is_bfloat16(const Array& array) { return array.dtype() == kBfloat16Dtype; }

// True when the first array is bfloat16; then every array must be (an Error names the
// first that is not). False when the first is not: the float32/float64 path checks the rest.
bool all_bfloat16(std::initializer_list<Named> arrays);

// The array `array` must be float32 (lse and dlse of a bfloat16 call); Error otherwise.
void check_float32(const Array& array, const char* name, const char* why);

// A new bfloat16 array of shape `shape` (zero bits), written without the GIL.
template <int Rank>
class Bf16Output {
 public:
  explicit Bf16Output(const std::array<int64_t, Rank>& shape) : shape_(shape) {
    const std::string what = "an output of shape " + shape_string(shape);
    const int64_t size = checked_product(shape, what.c_str());
    const size_t bytes = checked_bytes(size, sizeof(bfloat16), what.c_str());
    try {
      data_ = std::make_unique<bfloat16[]>(size_t(size));
    } catch (const std::bad_alloc&) {
      throw_out_of_memory(bytes, what);
    }
  }
  View<bfloat16, Rank> view() const { return View<bfloat16, Rank>(data_.get(), shape_); }

  // An ndarray owning the data, exporting DLPack (needs the GIL; empty afterwards).
  nb::object array() {
    bfloat16* data = data_.release();
    nb::capsule owner(data,
                      [](void* pointer) noexcept { delete[] static_cast<bfloat16*>(pointer); });
    std::array<size_t, Rank> shape{};
    for (int i = 0; i < Rank; ++i) shape[size_t(i)] = size_t(shape_[size_t(i)]);
    return nb::cast(nb::ndarray<>(data, Rank, shape.data(), owner, nullptr, kBfloat16Dtype,
                                  nb::device::cpu::value));
  }

 private:
  std::array<int64_t, Rank> shape_;
  std::unique_ptr<bfloat16[]> data_;
};

}  // namespace subquad::python
