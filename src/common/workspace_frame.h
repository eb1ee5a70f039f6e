// How an operator's CPU code takes scratch memory: a WorkspaceFrame opened at the start of the
// call hands out 64-byte aligned, uninitialised blocks (NaN-filled in the sanitizer build, as
// Buffer::uninitialized) from Context::workspace, or from a workspace of its own that lives
// as long as the frame when the context has none. Everything taken is given back when the
// frame closes. Take blocks on the calling thread, before parallel regions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "common/buffer.h"
#include "subquad/context.h"
#include "subquad/error.h"
#include "subquad/workspace.h"

namespace subquad {

class WorkspaceFrame {
 public:
  explicit WorkspaceFrame(const Context& context)
      : workspace_(context.workspace ? *context.workspace : own_.emplace()) {
    offset_ = workspace_.offset_;
    demand_ = workspace_.demand_;
    workspace_.enter();
  }
  ~WorkspaceFrame() { workspace_.leave(offset_, demand_, /*keep=*/!own_.has_value()); }
  WorkspaceFrame(const WorkspaceFrame&) = delete;
  WorkspaceFrame& operator=(const WorkspaceFrame&) = delete;

  // `count` elements of T, uninitialised.
  template <typename T>
  T* take(int64_t count) {
    static_assert(std::is_trivially_destructible_v<T>, "workspace blocks are raw memory");
    if (count <= 0) return nullptr;
    constexpr auto kMaxCount = std::numeric_limits<size_t>::max() / 2 / sizeof(T);
    if (static_cast<uint64_t>(count) > kMaxCount)
      throw_out_of_memory(std::numeric_limits<size_t>::max(), "a workspace (size overflows)");
    T* block = reinterpret_cast<T*>(workspace_.take(static_cast<size_t>(count) * sizeof(T)));
#ifdef SUBQUAD_POISON_WORKSPACES
    if constexpr (std::is_floating_point_v<T>) {
      std::fill(block, block + count, std::numeric_limits<T>::quiet_NaN());
    } else if constexpr (is_complex<T>::value) {
      using R = typename T::value_type;
      std::fill(block, block + count,
                T(std::numeric_limits<R>::quiet_NaN(), std::numeric_limits<R>::quiet_NaN()));
    }
#endif
    return block;
  }

 private:
  std::optional<Workspace> own_;  // declared first: constructed before workspace_ binds to it
  Workspace& workspace_;
  size_t offset_ = 0, demand_ = 0;
};

}  // namespace subquad
