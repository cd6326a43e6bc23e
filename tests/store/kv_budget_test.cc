// The selection part of KvConfig: budgets in tokens, shares of the context and bytes; the
// TOML keys of the policies; and validation that names what is wrong in one line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvstack/kv_config.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

TEST(KvBudgetTest, ParsesTokensFractionsAndBytes) {
  struct Case {
    std::string text;
    KvBudget::Kind kind;
    double value;
    std::string printed;
  };
  for (const Case& c : {
           Case{"256", KvBudget::Kind::kTokens, 256, "256"},
           Case{"50%", KvBudget::Kind::kFraction, 0.5, "50%"},
           Case{"0.25", KvBudget::Kind::kFraction, 0.25, "25%"},
           Case{"100%", KvBudget::Kind::kFraction, 1.0, "100%"},
           Case{"4096B", KvBudget::Kind::kBytes, 4096, "4096B"},
           Case{"64KiB", KvBudget::Kind::kBytes, 65536, "65536B"},
           Case{"1.5MiB", KvBudget::Kind::kBytes, 1572864, "1572864B"},
       }) {
    absl::StatusOr<KvBudget> budget = ParseKvBudget(c.text);
    ASSERT_TRUE(budget.ok()) << c.text << ": " << budget.status();
    EXPECT_EQ(budget->kind, c.kind) << c.text;
    EXPECT_DOUBLE_EQ(budget->value, c.value) << c.text;
    EXPECT_EQ(budget->ToString(), c.printed);
    // What is printed parses back to the same budget.
    EXPECT_DOUBLE_EQ(ParseKvBudget(budget->ToString())->value, budget->value);
  }
}

TEST(KvBudgetTest, RejectsZeroNegativeAndGarbageInOneLine) {
  for (const std::string text : {"0", "0%", "-5", "abc", "", "12.5", "150%", "KiB", "3 tokens"}) {
    absl::StatusOr<KvBudget> budget = ParseKvBudget(text);
    ASSERT_FALSE(budget.ok()) << text;
    EXPECT_THAT(std::string(budget.status().message()), HasSubstr("allowed:")) << text;
    EXPECT_EQ(std::string(budget.status().message()).find('\n'), std::string::npos);
  }
}

TEST(KvBudgetTest, ResolvesToTokensPerHead) {
  EXPECT_EQ(ParseKvBudget("100")->Resolve(512, 64), 100);
  EXPECT_EQ(ParseKvBudget("50%")->Resolve(512, 64), 256);
  // Bytes per sequence over the bytes of one token in every layer and head.
  EXPECT_EQ(ParseKvBudget("64KiB")->Resolve(512, 256), 256);
  EXPECT_EQ(ParseKvBudget("1B")->Resolve(512, 256), 1);  // never below one token
  EXPECT_EQ(KvBudget{}.Resolve(512, 256), 512);          // unset: the whole context
}

TEST(KvConfigSelectionTest, TomlSetsEveryPolicyKey) {
  absl::StatusOr<KvConfig> config = ParseKvConfigToml(R"(
[kv]
policy = "snapkv"
budget = 128
layer_budget = "pyramid"
head_budget = "adaptive"
policy_sinks = 2
policy_recent = 16
observation_window = 8
pool_kernel = 5
score_aggregation = "mean"
[kv.layer.1]
policy = "full"
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->budget.kind, KvBudget::Kind::kTokens);
  EXPECT_EQ(config->budget.value, 128);
  EXPECT_EQ(config->layer_budget, "pyramid");
  EXPECT_EQ(config->head_budget, "adaptive");
  EXPECT_EQ(config->policy_sinks, 2);
  EXPECT_EQ(config->policy_recent, 16);
  EXPECT_EQ(config->observation_window, 8);
  EXPECT_EQ(config->pool_kernel, 5);
  EXPECT_EQ(config->score_aggregation, "mean");
  EXPECT_EQ(config->PolicyOf(0), "snapkv");
  EXPECT_EQ(config->PolicyOf(1), "full");
  EXPECT_TRUE(config->evicts());
  EXPECT_THAT(config->ToString(), HasSubstr("policy=snapkv budget=128 layer_budget=pyramid"));

  absl::StatusOr<KvConfig> string_budget =
      ParseKvConfigToml("policy = \"window\"\nbudget = \"25%\"\npositions = \"reassign\"\n");
  ASSERT_TRUE(string_budget.ok()) << string_budget.status();
  EXPECT_EQ(string_budget->budget.kind, KvBudget::Kind::kFraction);
  EXPECT_EQ(string_budget->positions, "reassign");
}

TEST(KvConfigSelectionTest, ValidationNamesWhatIsWrong) {
  struct Case {
    std::string toml, needle;
  };
  for (const Case& c : {
           Case{"budget = 64", "policy 'full' keeps every token"},
           Case{"policy = \"h2o\"", "needs a budget"},
           Case{"policy = \"h2o\"\nbudget = 0", "is zero"},
           Case{"policy = \"h2o\"\nbudget = 64\nlayer_budget = \"cone\"", "cone"},
           Case{"policy = \"h2o\"\nbudget = 64\nhead_budget = \"random\"", "random"},
           Case{"policy = \"window\"\nbudget = 64\nhead_budget = \"adaptive\"", "adaptive"},
           Case{"policy = \"h2o\"\nbudget = 64\nscore_aggregation = \"sum\"", "sum"},
           Case{"policy = \"h2o\"\nbudget = 64\npositions = \"relative\"", "relative"},
           Case{"policy = \"h2o\"\nbudget = 64\nhead_budget = \"adaptive\"\npositions = "
                "\"reassign\"",
                "reassign"},
           Case{"policy = \"duo\"\nbudget = 64", "head profile"},
           Case{"policy = \"duo\"\nbudget = 64\nhead_profile = \"p\"\nretrieval_fraction = 2.0",
                "retrieval_fraction"},
           Case{"policy = \"snapkv\"\nbudget = 64\npool_kernel = 4", "pool_kernel"},
           Case{"policy = \"h2o\"\nbudget = 64\n[kv.layer.0]\npolicy = \"h3o\"", "h3o"},
       }) {
    absl::StatusOr<KvConfig> config = ParseKvConfigToml(c.toml);
    ASSERT_FALSE(config.ok()) << c.toml;
    const std::string message(config.status().message());
    EXPECT_THAT(message, HasSubstr(c.needle)) << c.toml;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace kvstack
