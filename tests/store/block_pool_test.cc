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

}  // namespace
}  // namespace kvstack
