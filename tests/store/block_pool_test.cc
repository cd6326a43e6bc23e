// Tests of BlockPool: allocation order (head first, freed blocks to the tail), exhaustion,
// reference counts, misuse checks, and a randomised run against a plain model of the pool.
#include "kvstack/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

namespace kvstack {
namespace {

TEST(BlockPoolTest, AllocatesEveryBlockOnceThenExhausts) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<BlockId> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = pool.Allocate();
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    EXPECT_EQ(pool.ref_count(*id), 1);
    EXPECT_EQ(pool.num_free(), 3 - i);
  }
  EXPECT_EQ(ids, (std::vector<BlockId>{0, 1, 2, 3}));
  auto none = pool.Allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPoolTest, FreedBlocksAreReusedLast) {
  BlockPool pool(4);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pool.Allocate().ok());  // 0, 1 taken; 2, 3 free
  pool.Unref(1);
  pool.Unref(0);
  // Free list is now 2, 3, 1, 0: untouched blocks first, then in the order they were freed.
  std::vector<BlockId> order;
  for (int i = 0; i < 4; ++i) order.push_back(*pool.Allocate());
  EXPECT_EQ(order, (std::vector<BlockId>{2, 3, 1, 0}));
}

TEST(BlockPoolTest, RefCountsKeepBlocksUntilLastHolder) {
  BlockPool pool(2);
  const BlockId id = *pool.Allocate();
  pool.Ref(id);
  pool.Ref(id);
  EXPECT_EQ(pool.ref_count(id), 3);
  pool.Unref(id);
  pool.Unref(id);
  EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.num_free(), 1);
  pool.Unref(id);
  EXPECT_EQ(pool.ref_count(id), 0);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPoolDeathTest, MisuseIsCaught) {
  BlockPool pool(2);
  const BlockId id = *pool.Allocate();
  EXPECT_DEATH(pool.Unref(1), "invariant violated");   // free block
  EXPECT_DEATH(pool.Ref(1), "invariant violated");     // free block
  EXPECT_DEATH(pool.Ref(2), "invariant violated");     // out of range
  EXPECT_DEATH(pool.Unref(-1), "invariant violated");  // out of range
  EXPECT_DEATH(pool.ref_count(5), "invariant violated");
  EXPECT_DEATH(BlockPool(0), "invariant violated");
  pool.Unref(id);
  EXPECT_DEATH(pool.Unref(id), "invariant violated");  // double free
}

// The model: a ref count per block and the free order as a queue.
TEST(BlockPoolTest, RandomOperationsMatchModel) {
  constexpr int kNumBlocks = 16;
  BlockPool pool(kNumBlocks);
  std::vector<int> model_refs(kNumBlocks, 0);
  std::deque<BlockId> model_free;
  for (BlockId id = 0; id < kNumBlocks; ++id) model_free.push_back(id);

  int num_exhausted = 0;
  std::mt19937 rng(42);
  for (int step = 0; step < 20000; ++step) {
    std::vector<BlockId> held;
    for (BlockId id = 0; id < kNumBlocks; ++id) {
      if (model_refs[id] > 0) held.push_back(id);
    }
    // Weights keep the pool cycling between exhausted and mostly free: 3/8 allocate, 1/8 ref,
    // 4/8 unref.
    const int r = static_cast<int>(rng() % 8);
    const int op = r < 3 ? 0 : (r == 3 ? 1 : 2);
    if (op == 0 || held.empty()) {
      auto id = pool.Allocate();
      if (model_free.empty()) {
        ASSERT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
        ++num_exhausted;
      } else {
        ASSERT_TRUE(id.ok());
        ASSERT_EQ(*id, model_free.front());
        model_free.pop_front();
        model_refs[*id] = 1;
      }
    } else {
      const BlockId id = held[rng() % held.size()];
      if (op == 1) {
        pool.Ref(id);
        ++model_refs[id];
      } else {
        pool.Unref(id);
        if (--model_refs[id] == 0) model_free.push_back(id);
      }
    }
    ASSERT_EQ(pool.num_free(), static_cast<int>(model_free.size())) << "step " << step;
    for (BlockId id = 0; id < kNumBlocks; ++id) {
      ASSERT_EQ(pool.ref_count(id), model_refs[id]) << "step " << step << " block " << id;
    }
  }
  EXPECT_GT(num_exhausted, 0);  // the walk reached the exhausted state
}

// How many times a sequence's next block is not the one after its last.
int Breaks(const std::vector<BlockId>& blocks) {
  int breaks = 0;
  for (size_t i = 1; i < blocks.size(); ++i) breaks += blocks[i] != blocks[i - 1] + 1;
  return breaks;
}

TEST(BlockPoolTest, SequencesGrowingAtOnceEachFillTheirOwnExtent) {
  constexpr int kE = BlockPool::kExtentBlocks;
  BlockPool pool(6 * kE);
  std::vector<BlockId> seqs[3];
  for (int step = 0; step < 2 * kE; ++step) {
    for (std::vector<BlockId>& blocks : seqs) {
      const absl::StatusOr<BlockId> id = pool.AllocateAfter(blocks.empty() ? -1 : blocks.back());
      ASSERT_TRUE(id.ok());
      blocks.push_back(*id);
    }
  }
  // Extents 0, 1 and 2 whole, then 3, 4 and 5: one break each, where Allocate in the same
  // lockstep breaks the run at every step.
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(seqs[s][0], s * kE);
    EXPECT_EQ(seqs[s][kE], (3 + s) * kE);
    EXPECT_EQ(Breaks(seqs[s]), 1) << s;
  }
  BlockPool plain(6 * kE);
  std::vector<BlockId> interleaved[3];
  for (int step = 0; step < kE; ++step) {
    for (std::vector<BlockId>& blocks : interleaved) blocks.push_back(*plain.Allocate());
  }
  EXPECT_EQ(Breaks(interleaved[0]), kE - 1);
}

// AllocateAfter against a model: it takes prev + 1 when that is free, else the first block of a
// wholly free extent when there is one, and fails only when no block is free.
TEST(BlockPoolTest, AllocateAfterRandomOperationsMatchModel) {
  constexpr int kE = BlockPool::kExtentBlocks;
  constexpr int kNumBlocks = 3 * kE + 5;  // a short last extent
  BlockPool pool(kNumBlocks);
  std::vector<int> refs(kNumBlocks, 0);
  const auto extent_free = [&](int extent) {
    for (int id = extent * kE; id < std::min(kNumBlocks, (extent + 1) * kE); ++id) {
      if (refs[id] > 0) return false;
    }
    return true;
  };
  std::mt19937 rng(7);
  int num_adjacent = 0, num_extent_starts = 0, num_exhausted = 0;
  for (int step = 0; step < 20000; ++step) {
    std::vector<BlockId> held;
    for (BlockId id = 0; id < kNumBlocks; ++id) {
      if (refs[id] > 0) held.push_back(id);
    }
    const int num_free = kNumBlocks - static_cast<int>(held.size());
    if (rng() % 2 == 0 || held.empty()) {
      const BlockId prev = held.empty() || rng() % 4 == 0 ? -1 : held[rng() % held.size()];
      bool any_extent = false;
      for (int e = 0; e * kE < kNumBlocks; ++e) any_extent |= extent_free(e);
      const absl::StatusOr<BlockId> id = pool.AllocateAfter(prev);
      if (num_free == 0) {
        ASSERT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
        ++num_exhausted;
        continue;
      }
      ASSERT_TRUE(id.ok()) << "step " << step;
      ASSERT_EQ(refs[*id], 0) << "step " << step;
      if (prev >= 0 && prev + 1 < kNumBlocks && refs[prev + 1] == 0) {
        ASSERT_EQ(*id, prev + 1) << "step " << step;
        ++num_adjacent;
      } else if (any_extent) {
        ASSERT_EQ(*id % kE, 0) << "step " << step;
        ASSERT_TRUE(extent_free(*id / kE)) << "step " << step;
        ++num_extent_starts;
      }
      refs[*id] = 1;
    } else {
      const BlockId id = held[rng() % held.size()];
      pool.Unref(id);
      refs[id] = 0;
    }
    ASSERT_EQ(pool.num_free(),
              kNumBlocks - static_cast<int>(std::count_if(refs.begin(), refs.end(),
                                                          [](int r) { return r > 0; })));
  }
  EXPECT_GT(num_adjacent, 0);
  EXPECT_GT(num_extent_starts, 0);
  EXPECT_GT(num_exhausted, 0);
}

}  // namespace
}  // namespace kvstack
