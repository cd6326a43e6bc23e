// Tests of SelectLayer: the uniform split is Select per head; the adaptive (Ada-KV) split
// gives heads with concentrated attention fewer tokens and spread heads more, keeps every
// head's protected tokens, never gives a head more than it holds, and keeps the layer's total
// budget exactly. And the head split names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvstack/policy.h"
#include "select_test_util.h"

namespace kvstack {
namespace {

using select_test::Iota;
using select_test::MustCreate;
using ::testing::HasSubstr;

int TotalKept(const std::vector<std::vector<int>>& keep) {
  int total = 0;
  for (const std::vector<int>& head : keep) total += static_cast<int>(head.size());
  return total;
}

// Head 0 attends to two tokens; head 1 spreads its attention evenly.
struct TwoHeads {
  std::vector<int> positions = Iota(16);
  std::vector<float> concentrated = std::vector<float>(16, 0.001f);
  std::vector<float> spread = std::vector<float>(16, 1.0f);
  TwoHeads() {
    concentrated[5] = 10.0f;
    concentrated[9] = 8.0f;
  }
  std::vector<SelectionInput> Inputs() const {
    return {{.positions = positions, .scores = concentrated, .budget = 0},
            {.positions = positions, .scores = spread, .budget = 0}};
  }
};

TEST(SelectLayerTest, UniformIsSelectPerHead) {
  auto policy = MustCreate("h2o", {.sink_tokens = 1, .recent_tokens = 2});
  ASSERT_NE(policy, nullptr);
  const TwoHeads heads;
  const std::vector<SelectionInput> inputs = heads.Inputs();
  std::vector<std::vector<int>> keep;
  SelectLayer(*policy, HeadSplit::kUniform, inputs, 6, &keep);
  ASSERT_EQ(keep.size(), 2u);
  for (int h = 0; h < 2; ++h) {
    std::vector<int> expected;
    SelectionInput input = inputs[h];
    input.budget = 6;
    policy->Select(input, &expected);
    EXPECT_EQ(keep[h], expected) << "head " << h;
  }
}

TEST(SelectLayerTest, AdaptiveGivesConcentratedHeadsFewerTokens) {
  auto policy = MustCreate("h2o", {.sink_tokens = 1, .recent_tokens = 2});
  ASSERT_NE(policy, nullptr);
  const TwoHeads heads;
  std::vector<std::vector<int>> keep;
  SelectLayer(*policy, HeadSplit::kAdaptive, heads.Inputs(), 6, &keep);
  ASSERT_EQ(keep.size(), 2u);
  EXPECT_EQ(TotalKept(keep), 12);
  // Pool: 12 - 2 * 3 protected = 6. Head 0's normalised scores: 10/18.01 and 8/18.01 for its
  // two tokens, ~0.00006 for the rest; head 1's: 1/16 each. So head 0 wins its two tokens and
  // head 1 the other four.
  EXPECT_EQ(keep[0], (std::vector<int>{0, 5, 9, 14, 15}));
  EXPECT_EQ(keep[1], (std::vector<int>{0, 10, 11, 12, 13, 14, 15}));
  EXPECT_LT(keep[0].size(), keep[1].size());
}

TEST(SelectLayerTest, AdaptiveNeverGivesAHeadMoreThanItHolds) {
  auto policy = MustCreate("tova", {.sink_tokens = 0});
  ASSERT_NE(policy, nullptr);
  const std::vector<int> short_positions = Iota(3);
  const std::vector<float> short_scores = {1.0f, 1.0f, 1.0f};
  const std::vector<int> long_positions = Iota(20);
  const std::vector<float> long_scores(20, 0.01f);
  const std::vector<SelectionInput> inputs = {
      {.positions = short_positions, .scores = short_scores, .budget = 0},
      {.positions = long_positions, .scores = long_scores, .budget = 0}};
  std::vector<std::vector<int>> keep;
  SelectLayer(*policy, HeadSplit::kAdaptive, inputs, 8, &keep);
  EXPECT_EQ(keep[0], Iota(3));
  EXPECT_EQ(keep[1], Iota(13, 7));  // the rest of 16, latest first on equal scores
  // Fewer tokens in all than the layer budget: everything is kept.
  SelectLayer(*policy, HeadSplit::kAdaptive, inputs, 12, &keep);
  EXPECT_EQ(keep[0], Iota(3));
  EXPECT_EQ(keep[1], Iota(20));
}

TEST(SelectLayerTest, AdaptiveKeepsTheLayerBudgetAndProtectedTokensOnRandomHeads) {
  auto policy = MustCreate("snapkv", {.sink_tokens = 2, .observation_window = 4, .pool_kernel = 3});
  ASSERT_NE(policy, nullptr);
  std::vector<std::vector<int>> positions(4);
  std::vector<std::vector<float>> scores(4);
  std::vector<SelectionInput> inputs;
  uint32_t state = 7;
  for (int h = 0; h < 4; ++h) {
    const int n = 30 + 7 * h;
    positions[h] = Iota(n, 100);
    for (int i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      // Head h's attention is sharper the higher h is.
      scores[h].push_back(static_cast<float>(std::pow((state >> 8) / 16777216.0, 1 + 3 * h)));
    }
    inputs.push_back({.positions = positions[h], .scores = scores[h], .budget = 0});
  }
  std::vector<std::vector<int>> keep;
  SelectLayer(*policy, HeadSplit::kAdaptive, inputs, 10, &keep);
  EXPECT_EQ(TotalKept(keep), 40);
  for (int h = 0; h < 4; ++h) {
    const int n = static_cast<int>(positions[h].size());
    const std::vector<int>& k = keep[h];
    EXPECT_TRUE(std::is_sorted(k.begin(), k.end()));
    EXPECT_LE(static_cast<int>(k.size()), n);
    // Sinks (2) and the observation window (4) are always kept.
    const ProtectedTokens p = policy->Protected(n, 10);
    EXPECT_EQ(p.total(), 6);
    for (int i : {0, 1, n - 4, n - 3, n - 2, n - 1}) {
      EXPECT_TRUE(std::binary_search(k.begin(), k.end(), i)) << "head " << h << " token " << i;
    }
  }
}

// Reference for the adaptive split: every head's candidates normalised as SelectLayer
// documents, fully sorted (value, then the later position, then the lower head).
std::vector<std::vector<int>> ReferenceAdaptive(const SelectionPolicy& policy,
                                                const std::vector<SelectionInput>& heads,
                                                int budget) {
  struct Candidate {
    float value;
    int position;
    int head;
    int index;
  };
  std::vector<Candidate> candidates;
  std::vector<std::vector<int>> keep(heads.size());
  int pool = static_cast<int>(heads.size()) * budget;
  for (int h = 0; h < static_cast<int>(heads.size()); ++h) {
    const int n = static_cast<int>(heads[h].positions.size());
    const ProtectedTokens p = policy.Protected(n, budget);
    pool -= p.total();
    for (int i = 0; i < p.sinks; ++i) keep[h].push_back(i);
    for (int i = n - p.recent; i < n; ++i) keep[h].push_back(i);
    std::vector<float> scratch;
    const std::span<const float> ranking = policy.RankingScores(heads[h], &scratch);
    double sum = 0;
    for (float s : ranking) sum += s;
    const float scale = sum > 0 ? static_cast<float>(1.0 / sum) : 1.0f;
    for (int i = p.sinks; i < n - p.recent; ++i) {
      candidates.push_back({ranking[i] * scale, heads[h].positions[i], h, i});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.value != b.value) return a.value > b.value;
    if (a.position != b.position) return a.position > b.position;
    return a.head < b.head;
  });
  for (int c = 0; c < std::min<int>(pool, candidates.size()); ++c) {
    keep[candidates[c].head].push_back(candidates[c].index);
  }
  for (std::vector<int>& k : keep) std::sort(k.begin(), k.end());
  return keep;
}

TEST(SelectLayerTest, AdaptiveMatchesAFullSortReference) {
  auto policy = MustCreate("h2o", {.sink_tokens = 2, .recent_tokens = 8});
  ASSERT_NE(policy, nullptr);
  std::mt19937 rng(5);
  // Few levels: many equal normalised scores across heads, so every tie rule is exercised.
  std::uniform_int_distribution<int> level(0, 5);
  for (int n : {12, 100, 700}) {
    std::vector<std::vector<int>> positions(3);
    std::vector<std::vector<float>> scores(3);
    std::vector<SelectionInput> inputs;
    for (int h = 0; h < 3; ++h) {
      positions[h] = Iota(n + 5 * h, h);  // heads of different lengths and offsets
      for (int i = 0; i < n + 5 * h; ++i) scores[h].push_back(static_cast<float>(level(rng)));
      inputs.push_back({.positions = positions[h], .scores = scores[h], .budget = 0});
    }
    for (int budget : {10, n / 2, n - 1, n + 20}) {
      std::vector<std::vector<int>> keep;
      SelectLayer(*policy, HeadSplit::kAdaptive, inputs, budget, &keep);
      EXPECT_EQ(keep, ReferenceAdaptive(*policy, inputs, budget)) << n << " " << budget;
    }
  }
}

TEST(SelectLayerDeathTest, AdaptiveNeedsScores) {
  auto policy = MustCreate("streaming");
  ASSERT_NE(policy, nullptr);
  const std::vector<int> positions = Iota(8);
  const std::vector<SelectionInput> inputs = {{.positions = positions, .scores = {}, .budget = 0}};
  std::vector<std::vector<int>> keep;
  EXPECT_DEATH(SelectLayer(*policy, HeadSplit::kAdaptive, inputs, 4, &keep), "invariant violated");
}

TEST(HeadSplitTest, NamesRoundTripAndUnknownIsAnError) {
  for (HeadSplit s : {HeadSplit::kUniform, HeadSplit::kAdaptive}) {
    auto parsed = ParseHeadSplit(HeadSplitName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  auto bad = ParseHeadSplit("ada");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("unknown head split 'ada'; allowed: uniform, adaptive"));
}

}  // namespace
}  // namespace kvstack
