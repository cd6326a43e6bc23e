// `kvstack sweep` over selection policies and budgets as a user runs it: the real binary on the
// real model and text. Checks the grid (full once, every evicting policy at every budget), the
// share of the context kept, the retrieval probe's columns, the streaming mode, and that bad
// policy input gets one line and exit code 1 before any work.
#include <filesystem>
#include <string>

#include "cli_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using namespace kvstack::testing_cli;  // NOLINT: test helpers

const std::string kShared = KVS_SHARED_DIR;
const std::string kModel = kShared + "/models/stories260K.gguf";
const std::string kText = kShared + "/data/tinystories_valid_head256k.txt";

class SweepPolicyCliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir() + "/sweep_policy_cli";
    std::filesystem::create_directories(dir_);
  }
  std::string Base() const {
    return "sweep -m " + kModel + " -f " + kText + " --ctx 128 --max-windows 3 --threads 2";
  }
  std::string dir_;
};

TEST_F(SweepPolicyCliTest, PoliciesTimesBudgetsWithTheRetrievalProbe) {
  const std::string json_path = dir_ + "/policies.json";
  const CommandResult r = RunCli(
      Base() + " --policy full,window,h2o --budget 32,50% --retrieval-probe --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| f16 / f16 window@32 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| f16 / f16 h2o@50% |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2nd-copy NLL | recall |"), std::string::npos) << r.out;

  const auto json = nlohmann::json::parse(Slurp(json_path));
  const auto& rows = json["rows"];
  ASSERT_EQ(rows.size(), 5u);  // full once, then 2 policies x 2 budgets
  EXPECT_EQ(rows[0]["policy"], "full");
  EXPECT_DOUBLE_EQ(rows[0]["kept_fraction"].get<double>(), 1.0);
  EXPECT_EQ(rows[1]["policy"], "window");
  EXPECT_EQ(rows[1]["budget"], "32");
  EXPECT_DOUBLE_EQ(rows[1]["kept_fraction"].get<double>(), 32.0 / 128);
  EXPECT_DOUBLE_EQ(rows[2]["kept_fraction"].get<double>(), 0.5);
  // What the cache held at its fullest: the 32 kept tokens and a forward call's 16 new ones
  // before the policy trims them, against 128 for the full cache.
  EXPECT_DOUBLE_EQ(rows[0]["bits_at_ctx"].get<double>(), 16.0);
  EXPECT_DOUBLE_EQ(rows[1]["bits_at_ctx"].get<double>(), 16.0 * (32 + 16) / 128);
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("retrieval_probe")) << row;
    EXPECT_GT(row["retrieval_probe"]["tokens_scored"].get<int>(), 0);
    // Evicting loses some accuracy, never gains memory: kept share times bits.
    EXPECT_NEAR(row["memory_bits"].get<double>(),
                row["bits_per_element"].get<double>() * row["kept_fraction"].get<double>(), 1e-9);
  }
  // A 32-token window has lost the passage's first copy; the full cache has not.
  EXPECT_GT(rows[0]["retrieval_probe"]["recall"].get<double>(),
            rows[1]["retrieval_probe"]["recall"].get<double>());
  EXPECT_TRUE(json["reference"].contains("retrieval_probe"));
}

TEST_F(SweepPolicyCliTest, StreamReportsPerplexityPerSegment) {
  const std::string json_path = dir_ + "/stream.json";
  const CommandResult r = RunCli(Base() +
                                 " --stream 1024 --segment 256 --policy streaming --budget 64 "
                                 "--positions reassign --json " +
                                 json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| 768-1024 | last / first | KiB held at most |"), std::string::npos)
      << r.out;
  const auto json = nlohmann::json::parse(Slurp(json_path));
  ASSERT_EQ(json["rows"].size(), 2u);  // the full cache, then streaming@64
  for (const auto& row : json["rows"]) {
    ASSERT_EQ(row["segment_ppl"].size(), 4u);
    for (const auto& ppl : row["segment_ppl"]) EXPECT_GT(ppl.get<double>(), 1.0);
  }
  EXPECT_EQ(json["rows"][1]["config"]["positions"], "reassign");
  // The full F32 cache holds the whole stream: 1024 tokens x 5 layers x 4 kv heads x 8 dims x
  // K and V x 4 bytes. streaming@64 holds its 64 tokens and a forward call's 16 new ones, F16.
  EXPECT_EQ(json["rows"][0]["peak_cache_bytes"], 1024 * 5 * 4 * 8 * 2 * 4);
  EXPECT_EQ(json["rows"][1]["peak_cache_bytes"], (64 + 16) * 5 * 4 * 8 * 2 * 2);
}

TEST_F(SweepPolicyCliTest, BadPolicyInputGetsOneLineAndExitOne) {
  const std::string plot = dir_ + "/never";
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {
           Case{" --policy h2o", "needs --budget"},
           Case{" --policy h2o --budget 0", "is zero"},
           Case{" --policy h2o --budget 200", "more than the context"},
           Case{" --policy h3o --budget 32", "allowed"},
           Case{" --policy window --budget 32 --k-codec kivi4 --block-size 16", "kivi4"},
           Case{" --policy snapkv --budget 32 --pool-kernel 4", "pool_kernel"},
           Case{" --policy duo --budget 32", "head profile"},
           Case{" --policy h2o --budget 32 --positions sideways", "positions"},
       }) {
    const CommandResult r = RunCli(Base() + c.args + " --plot " + plot);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.err;
    EXPECT_EQ(Lines(r.err), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(plot + ".png"));
}

}  // namespace
