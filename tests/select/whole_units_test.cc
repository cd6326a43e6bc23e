// Tests of KeepWholeUnits: a per-token keep list rounded to whole encoded units, within the
// same number of tokens, keeping every F32 token and the sinks' units.
#include "select/whole_units.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace kvstack {
namespace {

using Ids = std::vector<int>;

TEST(KeepWholeUnitsTest, WholeOrDroppedUnitsAndOneTokenUnitsAreUnchanged) {
  const Ids whole = Ids{0, 1, 2, 3, 12, 13, 14, 15, 17, 19};
  EXPECT_EQ(KeepWholeUnits(whole, 16, 4, 1), whole);
  const Ids scattered = {0, 3, 5, 9, 10, 15};
  EXPECT_EQ(KeepWholeUnits(scattered, 16, 1, 0), scattered);
  EXPECT_EQ(KeepWholeUnits(scattered, 0, 4, 0), scattered);  // nothing encoded yet
}

TEST(KeepWholeUnitsTest, KeepsTheSinksUnitsThenTheFullestUnitsNewestFirst) {
  // Units of 4 over [0, 16); tokens 16.. are F32. The policy kept 10 tokens: sinks 0-1,
  // three of unit 2, two of unit 3, one of unit 1, and F32 tokens 16 and 18.
  const Ids keep = {0, 1, 5, 8, 9, 11, 13, 14, 16, 18};
  // Sinks' unit 0 (4) + F32 (2) = 6; unit 2 (three kept) fits (10); unit 3 would not.
  EXPECT_EQ(KeepWholeUnits(keep, 16, 4, 2), (Ids{0, 1, 2, 3, 8, 9, 10, 11, 16, 18}));
  // Units 1 and 3 both have two kept tokens and room is left for one: the newer wins.
  const Ids tie = {0, 1, 2, 3, 5, 6, 9, 13, 14, 16};
  EXPECT_EQ(KeepWholeUnits(tie, 16, 4, 1), (Ids{0, 1, 2, 3, 12, 13, 14, 15, 16}));
}

TEST(KeepWholeUnitsTest, FallsBackWhenTheSinksUnitsAndF32TokensExceedTheList) {
  // Sinks 0-1 in a unit of 8, plus 3 F32 tokens: 11 > the 6 kept.
  const Ids keep = {0, 1, 9, 24, 25, 26};
  EXPECT_EQ(KeepWholeUnits(keep, 24, 8, 2), keep);
}

// On random lists: ascending, within the list's size, every encoded unit whole or absent,
// every F32 token and sink kept.
TEST(KeepWholeUnitsTest, RandomListsKeepTheContract) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int period = 1 + static_cast<int>(rng() % 8);
    const int num_units = static_cast<int>(rng() % 10);
    const int encoded_end = num_units * period;
    const int held = encoded_end + static_cast<int>(rng() % 12);
    if (held == 0) continue;
    const int num_sinks = std::min(held, static_cast<int>(rng() % 4));
    Ids keep(num_sinks);
    std::iota(keep.begin(), keep.end(), 0);
    for (int t = num_sinks; t < held; ++t) {
      if (rng() % 3 == 0) keep.push_back(t);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " period " << period);
    const Ids got = KeepWholeUnits(keep, encoded_end, period, num_sinks);
    ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
    ASSERT_TRUE(std::adjacent_find(got.begin(), got.end()) == got.end());
    ASSERT_LE(got.size(), keep.size());
    for (int t : keep) {
      if (t >= encoded_end || t < num_sinks) {
        ASSERT_TRUE(std::binary_search(got.begin(), got.end(), t)) << t;
      }
    }
    if (got == keep) continue;  // unchanged (already whole, or the fallback)
    for (int u = 0; u < num_units; ++u) {
      const auto in_unit = std::count_if(
          got.begin(), got.end(), [&](int t) { return t >= u * period && t < (u + 1) * period; });
      ASSERT_TRUE(in_unit == 0 || in_unit == period) << "unit " << u;
    }
  }
}

}  // namespace
}  // namespace kvstack
