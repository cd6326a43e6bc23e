// The conformance suite every policy runs: on random scores (with many ties) and every
// relation of budget to token count, Select keeps exactly min(n, budget) ascending distinct
// indices, always the protected sinks and recent window, the same answer on every call, and
// for score policies the same tokens as a plain full sort of the ranking (the reference for
// the heap and partial selections Select uses).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kvstack/policy.h"
#include "select_test_util.h"

namespace kvstack {
namespace {

using select_test::Iota;
using select_test::Keep;
using select_test::MustCreate;

// Reference: protected tokens, then the best of the rest by a full sort (rank descending,
// later token first on ties; NaN never appears here).
std::vector<int> ReferenceKeep(const SelectionPolicy& policy, const std::vector<float>& scores,
                               int budget) {
  const int n = static_cast<int>(scores.size());
  if (n <= budget) return Iota(n);
  const ProtectedTokens p = policy.Protected(n, budget);
  std::vector<int> keep = Iota(p.sinks);
  std::vector<int> rest;
  for (int i = p.sinks; i < n - p.recent; ++i) rest.push_back(i);
  if (p.total() < budget) {
    const std::vector<int> positions = Iota(n);
    std::vector<float> scratch;
    const std::span<const float> ranking = policy.RankingScores(
        {.positions = positions, .scores = scores, .budget = budget}, &scratch);
    std::sort(rest.begin(), rest.end(), [&](int a, int b) {
      return ranking[a] != ranking[b] ? ranking[a] > ranking[b] : a > b;
    });
    rest.resize(budget - p.total());
    keep.insert(keep.end(), rest.begin(), rest.end());
  }
  for (int i = n - p.recent; i < n; ++i) keep.push_back(i);
  std::sort(keep.begin(), keep.end());
  return keep;
}

class PolicyConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyConformanceTest, KeepsExactlyTheBudgetWithProtectedTokensDeterministically) {
  const PolicyParams params = {
      .sink_tokens = 3, .recent_tokens = -1, .observation_window = 5, .pool_kernel = 5};
  auto policy = MustCreate(GetParam(), params);
  ASSERT_NE(policy, nullptr);
  std::mt19937 rng(1234);
  // Few distinct values, so ties are common.
  std::uniform_int_distribution<int> level(0, 7);
  for (int n : {0, 1, 2, 3, 5, 8, 17, 64, 200, 1000}) {
    std::vector<float> scores(n);
    for (float& s : scores) s = 0.125f * static_cast<float>(level(rng));
    const std::vector<float> input = policy->needs_scores() ? scores : std::vector<float>{};
    // Up to 256 to drop, or to keep, and more of both: every selection path.
    for (int budget : {0, 1, 2, 3, 4, 7, 10, 16, 63, 64, 65, 199, 250, 500, 990, 999}) {
      if (GetParam() == "full" && budget < n) continue;  // full needs the whole context
      SCOPED_TRACE(testing::Message() << "n=" << n << " budget=" << budget);
      const std::vector<int> keep = Keep(*policy, input, budget, n);
      ASSERT_EQ(static_cast<int>(keep.size()), std::min(n, budget));
      EXPECT_TRUE(std::adjacent_find(keep.begin(), keep.end(),
                                     [](int a, int b) { return a >= b; }) == keep.end());
      if (!keep.empty()) {
        EXPECT_TRUE(keep.front() >= 0 && keep.back() < n);
      }
      EXPECT_EQ(Keep(*policy, input, budget, n), keep);
      if (n <= budget) continue;
      const ProtectedTokens p = policy->Protected(n, budget);
      EXPECT_LE(p.total(), budget);
      for (int i = 0; i < p.sinks; ++i)
        EXPECT_TRUE(std::binary_search(keep.begin(), keep.end(), i));
      for (int i = n - p.recent; i < n; ++i) {
        EXPECT_TRUE(std::binary_search(keep.begin(), keep.end(), i));
      }
      if (GetParam() != "window" && GetParam() != "full") {
        EXPECT_EQ(p.sinks, std::min(budget, params.sink_tokens));
      }
      if (policy->needs_scores()) {
        EXPECT_EQ(keep, ReferenceKeep(*policy, scores, budget));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, PolicyConformanceTest, ::testing::ValuesIn(PolicyNames()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kvstack
