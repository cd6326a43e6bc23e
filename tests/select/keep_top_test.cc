// Tests of the selection machinery every policy shares (src/select/keep_top.h): the integer
// rank keys order like the scores with the tie rule, and LargestDropped agrees with a full
// sort on every path (few dropped, few kept, neither).
#include "select/keep_top.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace kvstack::select_internal {
namespace {

TEST(RankKeyTest, OrdersLikeScoresThenLaterIndex) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denormal = std::numeric_limits<float>::denorm_min();
  const std::vector<float> ascending = {-inf,   -1e30f, -1.0f, -denormal, 0.0f, denormal,
                                        1e-30f, 0.5f,   1.0f,  1e30f,     inf};
  for (size_t a = 0; a + 1 < ascending.size(); ++a) {
    EXPECT_LT(RankKey(ascending[a], 5), RankKey(ascending[a + 1], 0)) << ascending[a];
  }
  // Equal scores: the later index ranks higher.
  EXPECT_LT(RankKey(0.5f, 3), RankKey(0.5f, 4));
  // -0 is 0 and NaN (of either sign) is -inf, so only the index tells them apart.
  EXPECT_LT(RankKey(-0.0f, 3), RankKey(0.0f, 4));
  EXPECT_LT(RankKey(0.0f, 3), RankKey(-0.0f, 4));
  EXPECT_EQ(RankKey(nan, 7), RankKey(-inf, 7));
  EXPECT_EQ(RankKey(-nan, 7), RankKey(-inf, 7));
  EXPECT_EQ(RankValue(nan), -inf);
}

TEST(LargestDroppedTest, MatchesAFullSortOnEveryPath) {
  std::mt19937_64 rng(99);
  for (size_t count : {2u, 10u, 300u, 1000u}) {
    std::vector<uint64_t> keys(count);
    for (uint64_t& k : keys) k = rng();
    std::vector<uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    for (size_t wanted : {size_t{0}, size_t{1}, count / 2, count - 2, count - 1}) {
      if (wanted >= count) continue;
      const uint64_t got = LargestDropped<uint64_t>(count, wanted, [&](const auto& visit) {
        for (uint64_t k : keys) visit(k);
      });
      EXPECT_EQ(got, sorted[count - wanted - 1]) << "count " << count << " wanted " << wanted;
    }
  }
}

TEST(ClampProtectedTest, RecentShrinksFirstThenSinks) {
  EXPECT_EQ(ClampProtected(100, 10, 4, 4).total(), 8);
  EXPECT_EQ(ClampProtected(100, 6, 4, 4).sinks, 4);
  EXPECT_EQ(ClampProtected(100, 6, 4, 4).recent, 2);
  EXPECT_EQ(ClampProtected(100, 3, 4, 4).sinks, 3);
  EXPECT_EQ(ClampProtected(100, 3, 4, 4).recent, 0);
  // Fewer tokens than the budget: the protected parts never overlap.
  EXPECT_EQ(ClampProtected(5, 10, 4, 4).sinks, 4);
  EXPECT_EQ(ClampProtected(5, 10, 4, 4).recent, 1);
}

}  // namespace
}  // namespace kvstack::select_internal
