// NumPy .npy files: float32 and float64, C order, format versions 1.0, 2.0 and 3.0.
// Loading rejects, with an Error naming the file: bad magic, unknown version, unparsable
// header, Fortran order, other dtypes, big-endian data, and sizes that disagree with the
// file length (truncated or trailing bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace subquad {

enum class DType { float32, float64 };

const char* dtype_name(DType dtype);

struct NpyArray {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;  // little-endian elements, C order

  int64_t element_count() const;
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  // A copy converted to `dtype` (a plain copy when it already is).
  NpyArray converted(DType dtype) const;
};

NpyArray load_npy(const std::string& path);
void save_npy(const std::string& path, const NpyArray& array);

// Builds an array from contiguous data.
template <typename T>
NpyArray make_npy(const std::vector<int64_t>& shape, const T* data);

}  // namespace subquad
