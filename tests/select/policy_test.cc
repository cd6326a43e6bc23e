// Tests of the selection policy factory and the "full" policy, the baseline every other
// policy is compared with.
#include "kvstack/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace kvstack {
namespace {

using ::testing::HasSubstr;

TEST(PolicyTest, NamesIncludeFullAndEveryNameCreates) {
  const std::vector<std::string> names = PolicyNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "full");
  for (const std::string& name : names) {
    auto policy = CreatePolicy(name);
    ASSERT_TRUE(policy.ok()) << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
}

TEST(PolicyTest, UnknownNameListsAllowed) {
  auto policy = CreatePolicy("h2o-typo");
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(policy.status().message()), HasSubstr("unknown policy 'h2o-typo'"));
  EXPECT_THAT(std::string(policy.status().message()), HasSubstr("allowed: full"));
}

TEST(FullPolicyTest, KeepsEveryTokenWithoutScores) {
  auto policy = CreatePolicy("full");
  ASSERT_TRUE(policy.ok());
  EXPECT_FALSE((*policy)->needs_scores());
  // Positions need not be 0..n-1 (a sequence may have been shifted); indices are logical.
  const std::vector<int> positions = {5, 6, 9, 10, 11};
  std::vector<int> keep = {42};  // stale content must be replaced, not appended to
  (*policy)->Select({.positions = positions, .scores = {}, .budget = 8}, &keep);
  EXPECT_EQ(keep, (std::vector<int>{0, 1, 2, 3, 4}));

  (*policy)->Select({.positions = {}, .scores = {}, .budget = 0}, &keep);
  EXPECT_TRUE(keep.empty());
}

TEST(FullPolicyDeathTest, BudgetBelowTokenCountIsABug) {
  auto policy = CreatePolicy("full");
  ASSERT_TRUE(policy.ok());
  const std::vector<int> positions = {0, 1, 2};
  std::vector<int> keep;
  EXPECT_DEATH((*policy)->Select({.positions = positions, .scores = {}, .budget = 2}, &keep),
               "invariant violated");
}

}  // namespace
}  // namespace kvstack
