// Scratch memory reused across operator calls (flashinfer's plan/run split, without a plan
// object per operator): point Context::workspace at one and repeated calls with the same
// shapes take their scratch from it instead of allocating. The first call (or a larger one)
// grows it to what the call needed, once, when the call ends; later calls that fit allocate
// nothing. Without a workspace an operator allocates its scratch per call, as before.
// One call at a time per workspace (it is not locked): give each thread its own Context and
// Workspace. Operators whose scratch comes from here are listed in docs/conventions.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace subquad {

class WorkspaceFrame;

class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Bytes held between calls, and the most one call has needed.
  int64_t capacity_bytes() const;
  int64_t peak_bytes() const { return static_cast<int64_t>(peak_); }
  // Frees the memory held (not during a call).
  void release();

 private:
  friend class WorkspaceFrame;
  std::byte* take(size_t bytes);
  void enter();
  // Closes a frame; the outermost one coalesces what spilled into one block when `keep`
  // (a frame's own workspace, dropped right after, is not kept). Never throws.
  void leave(size_t offset, size_t demand, bool keep) noexcept;

  // The aligned blocks (src/common/workspace.cpp), created by the first take: the block
  // later calls take from and what did not fit in it during this call.
  struct Blocks;
  std::unique_ptr<Blocks> blocks_;
  size_t offset_ = 0;  // bytes of the main block in use
  size_t demand_ = 0;  // bytes in use, all blocks together
  size_t peak_ = 0;
  int depth_ = 0;  // open frames (an operator calling another opens a nested one)
};

}  // namespace subquad
