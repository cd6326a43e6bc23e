// BlockPool: the ids of a fixed set of cache blocks, all allocated up front, with an O(1)
// free list and a reference count per block (blocks shared by forked sequences or reused
// prefixes are freed when the last holder lets go). It manages ids only; the bytes live in the
// KvCache's arenas, indexed by the same id in every layer. Single-threaded by contract.
#pragma once

#include <cstdint>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

using BlockId = int32_t;

class BlockPool {
 public:
  // A pool of `num_blocks` free blocks, ids 0..num_blocks-1. num_blocks must be > 0.
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return num_free_; }

  // Blocks per extent (AllocateAfter).
  static constexpr int32_t kExtentBlocks = 16;

  // Takes a free block (the head of the free list) and sets its count to 1. ResourceExhausted
  // when none is free.
  absl::StatusOr<BlockId> Allocate();
  // Takes a free block for a sequence whose last block is `prev` (-1: it has none), so that a
  // sequence's blocks stay adjacent, which head-major arenas turn into one run of memory per
  // kv head: prev + 1 if it is free; else the first block of an extent (kExtentBlocks blocks
  // from a multiple of it) that is wholly free, so that sequences growing at once each fill
  // their own; else what Allocate takes. Never fails while a block is free.
  absl::StatusOr<BlockId> AllocateAfter(BlockId prev);
  // Adds a holder to an allocated block.
  void Ref(BlockId id);
  // Drops a holder; the block returns to the free list when the count reaches zero.
  void Unref(BlockId id);
  int32_t ref_count(BlockId id) const;

 private:
  absl::Status Exhausted() const;
  // Takes `id` (free) off the free list, in O(1).
  void Take(BlockId id);
  int32_t ExtentSize(int32_t extent) const;  // the last extent may be short

  // Doubly linked free list threaded through two arrays so that any block can be taken off it
  // in O(1) (prefix reuse will revive freed blocks that still hold valid data).
  std::vector<int32_t> ref_counts_;
  std::vector<BlockId> next_free_;
  std::vector<BlockId> prev_free_;
  BlockId free_head_ = -1;
  BlockId free_tail_ = -1;
  int32_t num_free_ = 0;
  std::vector<int32_t> extent_free_;  // free blocks per extent
  int32_t num_free_extents_ = 0;      // extents wholly free
  int32_t extent_cursor_ = 0;         // where AllocateAfter's next search starts
};

}  // namespace kvstack
