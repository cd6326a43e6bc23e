// KvLayerView's runs: where a range of logical tokens lies in the blocks (RunAt, ForEachRun), and
// how far a run carries on into the blocks that follow it in one arena (ArenaRunAt).
#include "kvstack/kv_view.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace kvstack {
namespace {

// A view of blocks of 4 slots with the given block table, and its key arena head-major (a
// block's units of one head fill its block_stride) with units of `group_tokens` tokens.
struct Blocks {
  std::vector<int32_t> table;
  KvLayerView view;

  Blocks(std::vector<int32_t> ids, int first_slot, int group_tokens) : table(std::move(ids)) {
    view.block_table = table;
    view.block_size = 4;
    view.first_slot = first_slot;
    view.num_tokens = static_cast<int>(table.size()) * 4;
    view.k.group_tokens = group_tokens;
    view.k.unit_bytes = 10;
    view.k.block_stride = 10 * (4 / group_tokens);
  }
};

struct RunSeen {
  int logical, count, block_id, row;
  bool operator==(const RunSeen&) const = default;
};

// ArenaRunAt's runs over [begin, end), one call after another.
std::vector<RunSeen> ArenaRuns(const KvLayerView& view, const KvArenaView& arena, int begin,
                               int end) {
  std::vector<RunSeen> runs;
  for (int i = begin; i < end;) {
    const KvLayerView::Run run = view.ArenaRunAt(arena, i, end);
    runs.push_back({i, run.count, run.block_id, run.row});
    i += run.count;
  }
  return runs;
}

TEST(KvViewTest, ForEachRunStopsAtEveryBlock) {
  const Blocks blocks({5, 6, 2}, 0, 1);
  std::vector<RunSeen> runs;
  blocks.view.ForEachRun(1, 11, [&](int logical, int count, int32_t block_id, int row) {
    runs.push_back({logical, count, block_id, row});
  });
  EXPECT_EQ(runs, (std::vector<RunSeen>{{1, 3, 5, 1}, {4, 4, 6, 0}, {8, 3, 2, 0}}));
}

TEST(KvViewTest, ArenaRunCarriesOnOverBlocksThatFollowInTheArena) {
  const Blocks blocks({5, 6, 7, 2, 3, 9}, 0, 1);
  // 5, 6, 7 follow each other, then 2, 3; 9 stands alone. `end` cuts the last run short.
  EXPECT_EQ(ArenaRuns(blocks.view, blocks.view.k, 2, 22),
            (std::vector<RunSeen>{{2, 10, 5, 2}, {12, 8, 2, 0}, {20, 2, 9, 0}}));
  // The units of a run are consecutive from its first.
  const KvArenaView& arena = blocks.view.k;
  EXPECT_EQ(arena.Unit(5, 2, 0) + 9 * arena.unit_bytes, arena.Unit(7, 3, 0));
}

TEST(KvViewTest, ArenaRunStopsWhereBlocksDoNotFollowInTheArena) {
  Blocks blocks({5, 6, 7}, 0, 1);
  // Block-major: a block holds every head's units, so block 6 does not follow block 5's
  // units of one head.
  blocks.view.k.block_stride = 4 * blocks.view.k.unit_bytes * 2;
  EXPECT_EQ(ArenaRuns(blocks.view, blocks.view.k, 0, 12),
            (std::vector<RunSeen>{{0, 4, 5, 0}, {4, 4, 6, 0}, {8, 4, 7, 0}}));
}

TEST(KvViewTest, ArenaRunOfMultiTokenUnits) {
  const Blocks blocks({3, 4, 8}, 0, 2);
  EXPECT_EQ(ArenaRuns(blocks.view, blocks.view.k, 1, 12),
            (std::vector<RunSeen>{{1, 7, 3, 1}, {8, 4, 8, 0}}));
}

TEST(KvViewTest, ArenaRunWrapsAroundTheRing) {
  // Slot 6 of 8 is logical token 0: tokens 0-1 are the last block's rows 2-3. Then the slots
  // wrap to the first block (id 1), and the run goes on into block 2, which follows it.
  const Blocks blocks({1, 2}, 6, 1);
  EXPECT_EQ(ArenaRuns(blocks.view, blocks.view.k, 0, 8),
            (std::vector<RunSeen>{{0, 2, 2, 2}, {2, 6, 1, 0}}));
}

}  // namespace
}  // namespace kvstack
