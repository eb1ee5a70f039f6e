// Owning, 64-byte aligned, uninitialised-on-request storage for kernels' workspaces and
// for the edges (CLI, tests). Movable, not copyable. A failed allocation throws
// OutOfMemory (subquad/error.h). Builds with SUBQUAD_POISON_WORKSPACES (the sanitizer build)
// fill uninitialised floating-point buffers with NaN, so that a kernel reading workspace it
// never wrote fails a test instead of reading zeros by luck.
#pragma once

#include <algorithm>
#include <atomic>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "subquad/error.h"

namespace subquad {

inline constexpr size_t kBufferAlignment = 64;  // one cache line, one AVX-512 register

// Buffers allocated in this process so far, over all threads and element types: tests show
// with it that a call given a Workspace (subquad/workspace.h) allocates nothing. One relaxed
// atomic add per allocation, next to an aligned_alloc.
inline std::atomic<int64_t>& buffer_allocations() {
  static std::atomic<int64_t> count{0};
  return count;
}

template <typename T>
struct is_complex : std::false_type {};
template <typename R>
struct is_complex<std::complex<R>> : std::true_type {};

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
    if (count <= 0) return;
    constexpr size_t kMaxCount = (std::numeric_limits<size_t>::max() - kBufferAlignment) / sizeof(T);
    if (static_cast<uint64_t>(count) > kMaxCount)
      throw_out_of_memory(std::numeric_limits<size_t>::max(), "a workspace (size overflows)");
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    const size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    data_ = static_cast<T*>(std::aligned_alloc(kBufferAlignment, rounded));
    if (!data_) throw_out_of_memory(rounded, "a workspace");
    buffer_allocations().fetch_add(1, std::memory_order_relaxed);
    size_ = count;
    if (zero) {
      std::memset(static_cast<void*>(data_), 0, bytes);
    } else {
#ifdef SUBQUAD_POISON_WORKSPACES
      if constexpr (std::is_floating_point_v<T>) {
        std::fill(data_, data_ + count, std::numeric_limits<T>::quiet_NaN());
      } else if constexpr (is_complex<T>::value) {
        using R = typename T::value_type;
        std::fill(data_, data_ + count,
                  T(std::numeric_limits<R>::quiet_NaN(), std::numeric_limits<R>::quiet_NaN()));
      }
#endif
    }
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace subquad
