// Tests of the position policies (full, window, streaming, duo): what each keeps, and how the
// protected sinks and recent window shrink when the budget is smaller than both.
#include <gtest/gtest.h>

#include <vector>

#include "kvstack/policy.h"
#include "select_test_util.h"

namespace kvstack {
namespace {

using select_test::Iota;
using select_test::Keep;
using select_test::MustCreate;

TEST(FullPolicyTest, KeepsEveryTokenWithoutScores) {
  auto policy = MustCreate("full");
  ASSERT_NE(policy, nullptr);
  // Positions need not be 0..n-1 (a sequence may have been shifted); indices are logical.
  const std::vector<int> positions = {5, 6, 9, 10, 11};
  std::vector<int> keep = {42};  // stale content must be replaced, not appended to
  policy->Select({.positions = positions, .scores = {}, .budget = 8}, &keep);
  EXPECT_EQ(keep, Iota(5));
  policy->Select({.positions = {}, .scores = {}, .budget = 0}, &keep);
  EXPECT_TRUE(keep.empty());
}

TEST(FullPolicyDeathTest, BudgetBelowTokenCountIsABug) {
  auto policy = MustCreate("full");
  ASSERT_NE(policy, nullptr);
  EXPECT_DEATH(Keep(*policy, {}, 2, 3), "invariant violated");
}

TEST(WindowPolicyTest, KeepsTheMostRecentBudgetTokensAndNoSinks) {
  auto policy = MustCreate("window", {.sink_tokens = 4});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, {}, 3, 10), (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(Keep(*policy, {}, 10, 10), Iota(10));
  EXPECT_EQ(Keep(*policy, {}, 12, 10), Iota(10));
  EXPECT_TRUE(Keep(*policy, {}, 0, 10).empty());
}

TEST(StreamingPolicyTest, KeepsSinksAndTheMostRecent) {
  auto policy = MustCreate("streaming", {.sink_tokens = 2});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, {}, 5, 12), (std::vector<int>{0, 1, 9, 10, 11}));
  // The recent window shrinks before the sinks do.
  EXPECT_EQ(Keep(*policy, {}, 2, 12), (std::vector<int>{0, 1}));
  EXPECT_EQ(Keep(*policy, {}, 1, 12), (std::vector<int>{0}));
  EXPECT_EQ(Keep(*policy, {}, 3, 12), (std::vector<int>{0, 1, 11}));
}

TEST(StreamingPolicyTest, IgnoresScoresAndRecentTokens) {
  auto policy = MustCreate("streaming", {.sink_tokens = 1, .recent_tokens = 1});
  ASSERT_NE(policy, nullptr);
  // recent_tokens is an h2o/snapkv parameter: streaming fills its whole budget.
  EXPECT_EQ(Keep(*policy, {}, 4, 8), (std::vector<int>{0, 5, 6, 7}));
}

TEST(DuoPolicyTest, StreamingHeadsKeepWhatStreamingKeeps) {
  auto duo = MustCreate("duo", {.sink_tokens = 3});
  auto streaming = MustCreate("streaming", {.sink_tokens = 3});
  ASSERT_NE(duo, nullptr);
  ASSERT_NE(streaming, nullptr);
  EXPECT_FALSE(duo->needs_scores());
  for (int n : {0, 1, 3, 7, 20}) {
    for (int budget : {0, 1, 2, 3, 5, 8, 30}) {
      EXPECT_EQ(Keep(*duo, {}, budget, n), Keep(*streaming, {}, budget, n))
          << "n=" << n << " budget=" << budget;
    }
  }
}

TEST(PositionPolicyDeathTest, RankingAPositionPolicyIsABug) {
  auto policy = MustCreate("window");
  ASSERT_NE(policy, nullptr);
  const std::vector<int> positions = Iota(3);
  std::vector<float> scratch;
  EXPECT_DEATH(policy->RankingScores({.positions = positions, .scores = {}, .budget = 1}, &scratch),
               "invariant violated");
}

}  // namespace
}  // namespace kvstack
