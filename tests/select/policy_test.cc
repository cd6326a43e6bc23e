// Tests of the policy registry: every name creates its policy with the right score kind,
// unknown names and bad parameters are one-line errors naming what is allowed.
#include "kvstack/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "select_test_util.h"

namespace kvstack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(PolicyRegistryTest, NamesInStableOrderAndEveryNameCreates) {
  EXPECT_THAT(PolicyNames(),
              ElementsAre("full", "window", "streaming", "h2o", "tova", "snapkv", "duo"));
  for (const std::string& name : PolicyNames()) {
    auto policy = CreatePolicy(name);
    ASSERT_TRUE(policy.ok()) << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
}

TEST(PolicyRegistryTest, ScoreKindsAndObservationWindows) {
  struct Expected {
    const char* name;
    ScoreKind kind;
    int window;
  };
  PolicyParams params;
  params.observation_window = 16;
  for (const Expected& e :
       {Expected{"full", ScoreKind::kNone, 0}, Expected{"window", ScoreKind::kNone, 0},
        Expected{"streaming", ScoreKind::kNone, 0}, Expected{"duo", ScoreKind::kNone, 0},
        Expected{"h2o", ScoreKind::kAccumulated, 0}, Expected{"tova", ScoreKind::kRecent, 1},
        Expected{"snapkv", ScoreKind::kRecent, 16}}) {
    auto policy = select_test::MustCreate(e.name, params);
    ASSERT_NE(policy, nullptr);
    EXPECT_EQ(policy->score_kind(), e.kind) << e.name;
    EXPECT_EQ(policy->needs_scores(), e.kind != ScoreKind::kNone) << e.name;
    EXPECT_EQ(policy->observation_window(), e.window) << e.name;
  }
}

TEST(PolicyRegistryTest, UnknownNameListsAllowed) {
  auto policy = CreatePolicy("h2o-typo");
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(policy.status().message());
  EXPECT_THAT(message, HasSubstr("unknown policy 'h2o-typo'"));
  EXPECT_THAT(message, HasSubstr("allowed: full, window, streaming, h2o, tova, snapkv, duo"));
  EXPECT_THAT(message, Not(HasSubstr("\n")));
}

TEST(PolicyRegistryTest, BadParamsAreOneLineErrorsNamingTheAllowedRange) {
  struct Case {
    PolicyParams params;
    const char* expected;
  };
  const Case cases[] = {
      {{.sink_tokens = -1}, "sink_tokens must be >= 0 (got -1)"},
      {{.recent_tokens = -2}, "recent_tokens must be >= 0, or -1 for the policy's default"},
      {{.observation_window = 0}, "observation_window must be >= 1 (got 0)"},
      {{.pool_kernel = 4}, "pool_kernel must be odd and >= 1 (got 4)"},
      {{.pool_kernel = 0}, "pool_kernel must be odd and >= 1 (got 0)"},
  };
  for (const Case& c : cases) {
    auto policy = CreatePolicy("snapkv", c.params);
    ASSERT_FALSE(policy.ok()) << c.expected;
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(policy.status().message());
    EXPECT_THAT(message, HasSubstr("policy 'snapkv': "));
    EXPECT_THAT(message, HasSubstr(c.expected));
    EXPECT_THAT(message, Not(HasSubstr("\n")));
  }
  // Every policy checks every field, even one it ignores.
  EXPECT_FALSE(CreatePolicy("window", {.pool_kernel = 2}).ok());
}

TEST(PolicyRegistryTest, DefaultParams) {
  const PolicyParams params;
  EXPECT_EQ(params.sink_tokens, 4);
  EXPECT_EQ(params.recent_tokens, -1);
  EXPECT_EQ(params.observation_window, 32);
  EXPECT_EQ(params.pool_kernel, 7);
}

}  // namespace
}  // namespace kvstack
