// BlockPool: reference-counted block ids with an O(1) doubly linked free list. Allocation
// takes from the head and freed blocks go to the tail, so the most recently freed blocks are
// reused last — that keeps their bytes intact longest for prefix reuse to revive.
#include "kvstack/block_pool.h"

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
    : ref_counts_(CheckedNumBlocks(num_blocks), 0), next_free_(num_blocks), prev_free_(num_blocks) {
  for (BlockId id = 0; id < num_blocks; ++id) {
    prev_free_[id] = id - 1;
    next_free_[id] = id + 1 < num_blocks ? id + 1 : -1;
  }
  free_head_ = 0;
  free_tail_ = num_blocks - 1;
  num_free_ = num_blocks;
}

absl::StatusOr<BlockId> BlockPool::Allocate() {
  if (free_head_ < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block pool exhausted: all ", num_blocks(), " blocks are in use"));
  }
  const BlockId id = free_head_;
  free_head_ = next_free_[id];
  if (free_head_ >= 0) {
    prev_free_[free_head_] = -1;
  } else {
    free_tail_ = -1;
  }
  next_free_[id] = -1;
  prev_free_[id] = -1;
  ref_counts_[id] = 1;
  --num_free_;
  return id;
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
}

int32_t BlockPool::ref_count(BlockId id) const {
  KVS_CHECK(id >= 0 && id < num_blocks());
  return ref_counts_[id];
}

}  // namespace kvstack
