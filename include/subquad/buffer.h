// Owning, 64-byte aligned, uninitialised-on-request storage for kernels' workspaces and
// for the edges (CLI, tests). Movable, not copyable.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace subquad {

inline constexpr size_t kBufferAlignment = 64;  // one cache line, one AVX-512 register

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  // `count` elements, zero-filled.
  explicit Buffer(int64_t count) { allocate(count, /*zero=*/true); }
  static Buffer uninitialized(int64_t count) {
    Buffer buffer;
    buffer.allocate(count, /*zero=*/false);
    return buffer;
  }
  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void allocate(int64_t count, bool zero) {
    size_ = count;
    if (count <= 0) return;
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    const size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    data_ = static_cast<T*>(std::aligned_alloc(kBufferAlignment, rounded));
    if (!data_) throw std::bad_alloc();
    if (zero) std::memset(static_cast<void*>(data_), 0, bytes);
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace subquad
