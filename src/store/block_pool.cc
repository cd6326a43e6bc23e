// BlockPool: reference-counted block ids with an O(1) doubly linked free list. Allocation
// takes from the head and freed blocks go to the tail, so the most recently freed blocks are
// reused last — that keeps their bytes intact longest for prefix reuse to revive. AllocateAfter
// keeps a sequence's blocks adjacent: the next id if free, else a whole free extent's first.
#include "kvstack/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

// Checked before the vectors are sized, so a negative count fails the check, not std::vector.
size_t CheckedNumBlocks(int32_t num_blocks) {
  KVS_CHECK(num_blocks > 0);
  return static_cast<size_t>(num_blocks);
}

}  // namespace

BlockPool::BlockPool(int32_t num_blocks)
    : ref_counts_(CheckedNumBlocks(num_blocks), 0),
      next_free_(num_blocks),
      prev_free_(num_blocks),
      extent_free_((num_blocks + kExtentBlocks - 1) / kExtentBlocks, 0) {
  for (BlockId id = 0; id < num_blocks; ++id) {
    prev_free_[id] = id - 1;
    next_free_[id] = id + 1 < num_blocks ? id + 1 : -1;
    ++extent_free_[id / kExtentBlocks];
  }
  free_head_ = 0;
  free_tail_ = num_blocks - 1;
  num_free_ = num_blocks;
  num_free_extents_ = static_cast<int32_t>(extent_free_.size());
}

absl::Status BlockPool::Exhausted() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("block pool exhausted: all ", num_blocks(), " blocks are in use"));
}

absl::StatusOr<BlockId> BlockPool::Allocate() {
  if (free_head_ < 0) return Exhausted();
  const BlockId id = free_head_;
  Take(id);
  return id;
}

absl::StatusOr<BlockId> BlockPool::AllocateAfter(BlockId prev) {
  KVS_CHECK(prev >= -1 && prev < num_blocks());
  if (free_head_ < 0) return Exhausted();
  if (prev >= 0 && prev + 1 < num_blocks() && ref_counts_[prev + 1] == 0) {
    Take(prev + 1);
    return prev + 1;
  }
  // Next fit over the extents, from where the last search stopped.
  const int32_t num_extents = static_cast<int32_t>(extent_free_.size());
  for (int32_t k = 0; num_free_extents_ > 0 && k < num_extents; ++k) {
    const int32_t extent = (extent_cursor_ + k) % num_extents;
    if (extent_free_[extent] == ExtentSize(extent)) {
      extent_cursor_ = (extent + 1) % num_extents;
      const BlockId id = extent * kExtentBlocks;
      Take(id);
      return id;
    }
  }
  return Allocate();
}

int32_t BlockPool::ExtentSize(int32_t extent) const {
  return std::min(kExtentBlocks, num_blocks() - extent * kExtentBlocks);
}

void BlockPool::Take(BlockId id) {
  const BlockId prev = prev_free_[id], next = next_free_[id];
  if (prev >= 0) {
    next_free_[prev] = next;
  } else {
    free_head_ = next;
  }
  if (next >= 0) {
    prev_free_[next] = prev;
  } else {
    free_tail_ = prev;
  }
  next_free_[id] = -1;
  prev_free_[id] = -1;
  ref_counts_[id] = 1;
  --num_free_;
  const int32_t extent = id / kExtentBlocks;
  if (extent_free_[extent]-- == ExtentSize(extent)) --num_free_extents_;
}

void BlockPool::Ref(BlockId id) {
  KVS_CHECK(id >= 0 && id < num_blocks());
  KVS_CHECK(ref_counts_[id] > 0);
  ++ref_counts_[id];
}

void BlockPool::Unref(BlockId id) {
  KVS_CHECK(id >= 0 && id < num_blocks());
  KVS_CHECK(ref_counts_[id] > 0);
  if (--ref_counts_[id] > 0) return;
  prev_free_[id] = free_tail_;
  next_free_[id] = -1;
  if (free_tail_ >= 0) {
    next_free_[free_tail_] = id;
  } else {
    free_head_ = id;
  }
  free_tail_ = id;
  ++num_free_;
  const int32_t extent = id / kExtentBlocks;
  if (++extent_free_[extent] == ExtentSize(extent)) ++num_free_extents_;
}

int32_t BlockPool::ref_count(BlockId id) const {
  KVS_CHECK(id >= 0 && id < num_blocks());
  return ref_counts_[id];
}

}  // namespace kvstack
