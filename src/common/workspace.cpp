// Workspace: a bump allocator over one block; what does not fit during a call spills into
// blocks of its own, and the outermost frame's close replaces them by one block of the
// call's peak, so that the next call with the same shapes fits. O(1) per block taken.
#include "subquad/workspace.h"

#include <algorithm>

#include "subquad/error.h"

namespace subquad {

namespace {

size_t round_to_alignment(size_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}

}  // namespace

void Workspace::release() {
  check(depth_ == 0, "workspace: release() during an operator call");
  main_ = Buffer<std::byte>();
  spill_.clear();
  offset_ = demand_ = 0;
}

std::byte* Workspace::take(size_t bytes) {
  const size_t rounded = round_to_alignment(bytes);
  demand_ += rounded;
  peak_ = std::max(peak_, demand_);
  if (offset_ + rounded <= static_cast<size_t>(main_.size())) {
    std::byte* block = main_.data() + offset_;
    offset_ += rounded;
    return block;
  }
  spill_.push_back(Buffer<std::byte>::uninitialized(static_cast<int64_t>(rounded)));
  return spill_.back().data();
}

void Workspace::enter() { ++depth_; }

void Workspace::leave(size_t offset, size_t demand, bool keep) noexcept {
  offset_ = offset;
  demand_ = demand;
  if (--depth_ > 0) return;
  if (!spill_.empty()) {
    spill_.clear();
    if (keep && peak_ > static_cast<size_t>(main_.size())) {
      main_ = Buffer<std::byte>();  // free first: the old and new blocks need not coexist
      // Best effort: this runs in a frame's destructor, after the call's results are written.
      // When the peak does not fit now, the next call spills again (and reports what it
      // cannot allocate itself).
      try {
        main_ = Buffer<std::byte>::uninitialized(static_cast<int64_t>(peak_));
      } catch (const std::bad_alloc&) {
      }
    }
  }
}

}  // namespace subquad
