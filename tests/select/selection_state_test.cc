// Tests of SelectionState: appends to every head, score rows the kernels add into, retain with
// the cache's keep semantics (per head, so heads diverge), re-assigned positions, cleared
// scores, and the inputs it builds for the policies.
#include "kvstack/selection_state.h"

#include <gtest/gtest.h>

#include <vector>

#include "kvstack/policy.h"
#include "select_test_util.h"

namespace kvstack {
namespace {

using select_test::Iota;

std::vector<int> PositionsOf(const SelectionState& state, int layer, int head) {
  const std::span<const int> p = state.Positions(layer, head);
  return {p.begin(), p.end()};
}

std::vector<float> ScoresOf(const SelectionState& state, int layer, int head) {
  const std::span<const float> s = state.Scores(layer, head);
  return {s.begin(), s.end()};
}

TEST(SelectionStateTest, AppendGrowsEveryHeadOfOneLayer) {
  SelectionState state(/*num_layers=*/2, /*num_kv_heads=*/3, /*capacity=*/20);
  EXPECT_EQ(state.stride(), 32);
  state.Append(1, 0, 5);
  state.Append(1, 5, 2);
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(state.HeadTokens(1, h), 7);
    EXPECT_EQ(PositionsOf(state, 1, h), Iota(7));
    EXPECT_EQ(ScoresOf(state, 1, h), std::vector<float>(7, 0.0f));
    EXPECT_EQ(state.HeadTokens(0, h), 0);
  }
}

TEST(SelectionStateTest, ScoreRowsAreWhereKernelsAdd) {
  SelectionState state(1, 2, 10);
  state.Append(0, 0, 4);
  float* rows = state.ScoreRows(0);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) rows[h * state.stride() + t] += 10.0f * h + t;
  }
  EXPECT_EQ(ScoresOf(state, 0, 0), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(ScoresOf(state, 0, 1), (std::vector<float>{10, 11, 12, 13}));
  state.ClearScores(0);
  EXPECT_EQ(ScoresOf(state, 0, 1), std::vector<float>(4, 0.0f));
}

TEST(SelectionStateTest, RetainKeepsPositionsAndScoresOfOneHead) {
  SelectionState state(1, 2, 10);
  state.Append(0, 100, 6);
  float* rows = state.ScoreRows(0);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 6; ++t) rows[h * state.stride() + t] = 1.0f + t;
  }
  const std::vector<int> keep = {0, 2, 5};
  state.Retain(0, 1, keep);
  EXPECT_EQ(state.HeadTokens(0, 1), 3);
  EXPECT_EQ(PositionsOf(state, 0, 1), (std::vector<int>{100, 102, 105}));
  EXPECT_EQ(ScoresOf(state, 0, 1), (std::vector<float>{1, 3, 6}));
  // The other head is untouched.
  EXPECT_EQ(state.HeadTokens(0, 0), 6);
  EXPECT_EQ(PositionsOf(state, 0, 0), Iota(6, 100));
  // Appends grow both heads by the same count, with fresh scores.
  state.Append(0, 106, 2);
  EXPECT_EQ(PositionsOf(state, 0, 1), (std::vector<int>{100, 102, 105, 106, 107}));
  EXPECT_EQ(ScoresOf(state, 0, 1), (std::vector<float>{1, 3, 6, 0, 0}));
  EXPECT_EQ(state.HeadTokens(0, 0), 8);
  // Retaining nothing empties the head; retaining everything changes nothing.
  state.Retain(0, 0, Iota(8));
  EXPECT_EQ(PositionsOf(state, 0, 0), Iota(8, 100));
  state.Retain(0, 0, {});
  EXPECT_EQ(state.HeadTokens(0, 0), 0);
}

TEST(SelectionStateTest, SetPositionsReassignsAfterEviction) {
  SelectionState state(1, 1, 8);
  state.Append(0, 0, 8);
  state.Retain(0, 0, std::vector<int>{0, 1, 6, 7});
  EXPECT_EQ(PositionsOf(state, 0, 0), (std::vector<int>{0, 1, 6, 7}));
  state.SetPositions(0, 0, Iota(4));  // StreamingLLM: positions inside the cache
  EXPECT_EQ(PositionsOf(state, 0, 0), Iota(4));
}

TEST(SelectionStateTest, InputsForPoliciesAndSelectRoundTrip) {
  SelectionState state(1, 2, 16);
  state.Append(0, 0, 10);
  float* rows = state.ScoreRows(0);
  rows[3] = 5.0f;                   // head 0, token 3
  rows[state.stride() + 6] = 5.0f;  // head 1, token 6

  const SelectionInput none = state.Input(0, 0, 4, ScoreKind::kNone);
  EXPECT_EQ(none.positions.size(), 10u);
  EXPECT_TRUE(none.scores.empty());
  EXPECT_EQ(none.budget, 4);

  auto policy = select_test::MustCreate("h2o", {.sink_tokens = 1, .recent_tokens = 2});
  ASSERT_NE(policy, nullptr);
  std::vector<SelectionInput> inputs;
  state.LayerInputs(0, 0, policy->score_kind(), &inputs);
  ASSERT_EQ(inputs.size(), 2u);
  std::vector<std::vector<int>> keep;
  SelectLayer(*policy, HeadSplit::kUniform, inputs, 4, &keep);
  EXPECT_EQ(keep[0], (std::vector<int>{0, 3, 8, 9}));
  EXPECT_EQ(keep[1], (std::vector<int>{0, 6, 8, 9}));
  for (int h = 0; h < 2; ++h) state.Retain(0, h, keep[h]);
  EXPECT_EQ(ScoresOf(state, 0, 0), (std::vector<float>{0, 5, 0, 0}));
  EXPECT_EQ(PositionsOf(state, 0, 1), (std::vector<int>{0, 6, 8, 9}));
}

TEST(SelectionStateDeathTest, MisuseIsABug) {
  SelectionState state(1, 1, 4);
  state.Append(0, 0, 3);
  EXPECT_DEATH(state.Append(0, 3, 2), "invariant violated");                       // over capacity
  EXPECT_DEATH(state.Retain(0, 0, std::vector<int>{1, 1}), "invariant violated");  // repeated
  EXPECT_DEATH(state.Retain(0, 0, std::vector<int>{3}), "invariant violated");     // too far
  EXPECT_DEATH(state.SetPositions(0, 0, std::vector<int>{0, 2, 1}), "invariant violated");
  EXPECT_DEATH(state.HeadTokens(1, 0), "invariant violated");
}

}  // namespace
}  // namespace kvstack
