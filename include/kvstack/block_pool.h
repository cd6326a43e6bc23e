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

  // Takes a free block and sets its count to 1. ResourceExhausted when none is free.
  absl::StatusOr<BlockId> Allocate();
  // Adds a holder to an allocated block.
  void Ref(BlockId id);
  // Drops a holder; the block returns to the free list when the count reaches zero.
  void Unref(BlockId id);
  int32_t ref_count(BlockId id) const;

 private:
  // Doubly linked free list threaded through two arrays so that any block can be taken off it
  // in O(1) (prefix reuse will revive freed blocks that still hold valid data).
  std::vector<int32_t> ref_counts_;
  std::vector<BlockId> next_free_;
  std::vector<BlockId> prev_free_;
  BlockId free_head_ = -1;
  BlockId free_tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace kvstack
