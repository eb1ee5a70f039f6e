// Workspace: a bump allocator over one block; what does not fit during a call spills into
// blocks of its own, and the outermost frame's close replaces them by one block of the
// call's peak, so that the next call with the same shapes fits. O(1) per block taken.
#include "subquad/workspace.h"

#include <algorithm>
#include <vector>

#include "common/buffer.h"
#include "subquad/error.h"

namespace subquad {

namespace {

size_t round_to_alignment(size_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}

}  // namespace

// Kept out of the public header: Buffer is the library's internal storage.
struct Workspace::Blocks {
  Buffer<std::byte> main;                // [capacity] the block later calls take from
  std::vector<Buffer<std::byte>> spill;  // what did not fit in main during this call
};

Workspace::Workspace() = default;
Workspace::~Workspace() = default;

int64_t Workspace::capacity_bytes() const { return blocks_ ? blocks_->main.size() : 0; }

void Workspace::release() {
  check(depth_ == 0, "workspace: release() during an operator call");
  blocks_.reset();
  offset_ = demand_ = 0;
}

std::byte* Workspace::take(size_t bytes) {
  if (!blocks_) blocks_ = std::make_unique<Blocks>();
  Buffer<std::byte>& main = blocks_->main;
  const size_t rounded = round_to_alignment(bytes);
  demand_ += rounded;
  peak_ = std::max(peak_, demand_);
  if (offset_ + rounded <= static_cast<size_t>(main.size())) {
    std::byte* block = main.data() + offset_;
    offset_ += rounded;
    return block;
  }
  blocks_->spill.push_back(Buffer<std::byte>::uninitialized(static_cast<int64_t>(rounded)));
  return blocks_->spill.back().data();
}

void Workspace::enter() { ++depth_; }

void Workspace::leave(size_t offset, size_t demand, bool keep) noexcept {
  offset_ = offset;
  demand_ = demand;
  if (--depth_ > 0 || !blocks_) return;
  if (!blocks_->spill.empty()) {
    blocks_->spill.clear();
    Buffer<std::byte>& main = blocks_->main;
    if (keep && peak_ > static_cast<size_t>(main.size())) {
      main = Buffer<std::byte>();  // free first: the old and new blocks need not coexist
      // Best effort: this runs in a frame's destructor, after the call's results are written.
      // When the peak does not fit now, the next call spills again (and reports what it
      // cannot allocate itself).
      try {
        main = Buffer<std::byte>::uninitialized(static_cast<int64_t>(peak_));
      } catch (const std::bad_alloc&) {
      }
    }
  }
}

}  // namespace subquad
