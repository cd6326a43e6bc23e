// Tests of the score policies (h2o, tova, snapkv) on hand-made scores: heavy hitters beside
// the protected sinks and recent window, TOVA against H2O on the same scores, SnapKV's pooling
// and observation window, ties towards the later token and NaN scores.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kvstack/policy.h"
#include "select_test_util.h"

namespace kvstack {
namespace {

using select_test::Iota;
using select_test::Keep;
using select_test::MustCreate;

// 12 tokens: heavy hitters at 4 (0.9) and 7 (0.8), a lesser one at 5 (0.3), the last two
// tokens barely attended.
const std::vector<float> kScores = {0.5f, 0.1f, 0.1f, 0.1f, 0.9f, 0.3f,
                                    0.1f, 0.8f, 0.1f, 0.1f, 0.0f, 0.01f};

TEST(H2oPolicyTest, KeepsSinksRecentAndHeavyHitters) {
  auto policy = MustCreate("h2o", {.sink_tokens = 1, .recent_tokens = 2});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, kScores, 5), (std::vector<int>{0, 4, 7, 10, 11}));
  EXPECT_EQ(Keep(*policy, kScores, 6), (std::vector<int>{0, 4, 5, 7, 10, 11}));
}

TEST(H2oPolicyTest, DefaultRecentWindowIsHalfTheBudget) {
  auto policy = MustCreate("h2o", {.sink_tokens = 0});
  ASSERT_NE(policy, nullptr);
  // Budget 6: the last 3 tokens, then the 3 highest of the rest (4, 7, 0).
  EXPECT_EQ(Keep(*policy, kScores, 6), (std::vector<int>{0, 4, 7, 9, 10, 11}));
}

TEST(H2oPolicyTest, ProtectedTokensBeyondTheBudgetShrinkRecentFirstThenSinks) {
  auto policy = MustCreate("h2o", {.sink_tokens = 4, .recent_tokens = 4});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, kScores, 6), (std::vector<int>{0, 1, 2, 3, 10, 11}));
  EXPECT_EQ(Keep(*policy, kScores, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Keep(*policy, kScores, 3), (std::vector<int>{0, 1, 2}));
}

TEST(TovaPolicyTest, DropsWhatTheLatestQueryAttendsLeastButKeepsSinks) {
  auto policy = MustCreate("tova", {.sink_tokens = 1});
  ASSERT_NE(policy, nullptr);
  // Sink 0 (score 0.5 would win anyway) and the three highest: 4, 7, 5.
  EXPECT_EQ(Keep(*policy, kScores, 4), (std::vector<int>{0, 4, 5, 7}));
  // The sink is kept even when its score is the lowest.
  std::vector<float> low_sink = kScores;
  low_sink[0] = 0.0f;
  EXPECT_EQ(Keep(*policy, low_sink, 4), (std::vector<int>{0, 4, 5, 7}));
}

TEST(TovaPolicyTest, DiffersFromH2oOnTheSameScores) {
  // H2O protects a recent window, TOVA does not: the barely attended last tokens survive H2O
  // and are the first TOVA drops.
  auto tova = MustCreate("tova", {.sink_tokens = 1});
  auto h2o = MustCreate("h2o", {.sink_tokens = 1});
  ASSERT_NE(tova, nullptr);
  ASSERT_NE(h2o, nullptr);
  EXPECT_EQ(Keep(*tova, kScores, 6), (std::vector<int>{0, 4, 5, 7, 8, 9}));
  EXPECT_EQ(Keep(*h2o, kScores, 6), (std::vector<int>{0, 4, 7, 9, 10, 11}));
}

TEST(SnapKvPolicyTest, PoolingKeepsTheNeighboursOfAnAttendedToken) {
  // One strongly attended token (5) and a few lesser isolated ones.
  std::vector<float> scores(16, 0.0f);
  scores[2] = 0.55f;
  scores[5] = 1.0f;
  scores[10] = 0.6f;
  scores[12] = 0.5f;
  auto unpooled = MustCreate("snapkv", {.sink_tokens = 0, .recent_tokens = 2, .pool_kernel = 1});
  auto pooled = MustCreate("snapkv", {.sink_tokens = 0, .recent_tokens = 2, .pool_kernel = 3});
  ASSERT_NE(unpooled, nullptr);
  ASSERT_NE(pooled, nullptr);
  EXPECT_EQ(Keep(*unpooled, scores, 5), (std::vector<int>{2, 5, 10, 14, 15}));
  EXPECT_EQ(Keep(*pooled, scores, 5), (std::vector<int>{4, 5, 6, 14, 15}));
  // The pooled ranking itself: max over [i - 1, i + 1], clipped at the ends.
  std::vector<float> scratch;
  const std::vector<int> positions = Iota(16);
  const std::span<const float> ranking =
      pooled->RankingScores({.positions = positions, .scores = scores, .budget = 5}, &scratch);
  EXPECT_EQ(std::vector<float>(ranking.begin(), ranking.end()),
            (std::vector<float>{0, 0.55f, 0.55f, 0.55f, 1, 1, 1, 0, 0, 0.6f, 0.6f, 0.6f, 0.5f, 0.5f,
                                0, 0}));
}

TEST(SnapKvPolicyTest, DefaultRecentWindowIsTheObservationWindow) {
  auto policy = MustCreate("snapkv", {.sink_tokens = 1, .observation_window = 3, .pool_kernel = 1});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, kScores, 5), (std::vector<int>{0, 4, 9, 10, 11}));
}

TEST(ScorePolicyTest, EqualScoresGoToTheLaterToken) {
  const std::vector<float> equal(10, 0.25f);
  for (const char* name : {"h2o", "tova", "snapkv"}) {
    auto policy = MustCreate(name, {.sink_tokens = 1, .recent_tokens = 1});
    ASSERT_NE(policy, nullptr);
    EXPECT_EQ(Keep(*policy, equal, 4), (std::vector<int>{0, 7, 8, 9})) << name;
  }
}

TEST(ScorePolicyTest, NanScoresRankBelowEverything) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {0.0f, nan, 0.0f, nan, 0.0f, nan};
  auto policy = MustCreate("tova", {.sink_tokens = 0});
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(Keep(*policy, scores, 3), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(Keep(*policy, scores, 4), (std::vector<int>{0, 2, 4, 5}));
}

TEST(ScorePolicyTest, FewerTokensThanTheBudgetKeepsThemAll) {
  for (const char* name : {"h2o", "tova", "snapkv"}) {
    auto policy = MustCreate(name);
    ASSERT_NE(policy, nullptr);
    EXPECT_EQ(Keep(*policy, kScores, 12), Iota(12)) << name;
    EXPECT_EQ(Keep(*policy, kScores, 100), Iota(12)) << name;
  }
}

TEST(ScorePolicyDeathTest, ScoresOfTheWrongLengthAreABug) {
  auto policy = MustCreate("h2o");
  ASSERT_NE(policy, nullptr);
  EXPECT_DEATH(Keep(*policy, {1.0f, 2.0f}, 1, 3), "invariant violated");
}

}  // namespace
}  // namespace kvstack
