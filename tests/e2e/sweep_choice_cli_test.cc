// `kvstack sweep --max-dppl / --max-bits / --max-bits-at-ctx` as a user runs it: the real binary
// chooses a row of a real sweep on stories260K, writes it with --write-config, and `kvstack
// perplexity --kv-config` on that file reproduces the row's perplexity, so the design runs as
// it was measured. The choice is checked against the rows of the same run's JSON; bad input
// gets one line.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli_runner.h"
#include "gtest/gtest.h"
#include "kvstack/kv_config.h"
#include "nlohmann/json.hpp"

namespace {

using namespace kvstack::testing_cli;  // NOLINT: test helpers

const std::string kShared = KVS_SHARED_DIR;
const std::string kModel = kShared + "/models/stories260K.gguf";

class SweepChoiceCliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir() + "/sweep_choice_cli";
    std::filesystem::create_directories(dir_);
    // A few windows of 64 tokens: the sweep and the perplexity run both read the whole slice.
    const std::string text = Slurp(kShared + "/data/tinystories_valid_head256k.txt");
    std::ofstream(Slice()) << text.substr(0, 1500);
  }
  std::string Slice() const { return dir_ + "/slice.txt"; }
  std::string Sweep() const {
    return "sweep -m " + kModel + " -f " + Slice() + " --ctx 64 --threads 2";
  }
  // The PPL `kvstack perplexity` measures with the chosen file, in the sweep's calls.
  double PerplexityWith(const std::string& config_path, int batch) const {
    const CommandResult r = RunCli("perplexity -m " + kModel + " -f " + Slice() +
                                   " --ctx 64 --threads 2 --json --batch " + std::to_string(batch) +
                                   " --kv-config " + config_path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["ppl"].get<double>() : -1;
  }
  std::string dir_;
};

// The row the test expects: within the bound, the least `bits` (a row's JSON key), then the
// lowest ΔPPL.
int FewestBitsWithin(const nlohmann::json& rows, double max_dppl,
                     const std::string& bits = "memory_bits") {
  int best = -1;
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const double row_bits = rows[i][bits].get<double>();
    const double dppl = rows[i]["delta_ppl_pct"].get<double>();
    if (dppl > max_dppl) continue;
    if (best < 0 || row_bits < rows[best][bits].get<double>() ||
        (row_bits == rows[best][bits].get<double>() &&
         dppl < rows[best]["delta_ppl_pct"].get<double>())) {
      best = i;
    }
  }
  return best;
}

// The heads of a mix row, as (layer, kv head), from its JSON configuration.
std::set<std::pair<int, int>> MixHeads(const nlohmann::json& row) {
  std::set<std::pair<int, int>> heads;
  for (const auto& head : row["config"]["head_codecs"]) {
    heads.emplace(head["layer_idx"].get<int>(), head["kv_head"].get<int>());
  }
  return heads;
}

// The (layer, kv head) of the `count` probes (rows 1..20, layer-major, 4 kv heads) that lost
// least, ties in layer-major order.
std::set<std::pair<int, int>> BestProbedHeads(const nlohmann::json& rows, int count) {
  std::vector<std::pair<double, int>> ranked;
  for (int i = 0; i < 20; ++i) ranked.emplace_back(rows[1 + i]["delta_ppl_pct"].get<double>(), i);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::set<std::pair<int, int>> heads;
  for (int rank = 0; rank < count; ++rank) {
    heads.emplace(ranked[rank].second / 4, ranked[rank].second % 4);
  }
  return heads;
}

// The [kv] table of a written file, key by key, against the configuration the sweep's JSON
// reports for the same row: the TOML writer and the JSON one list KvConfig's fields apart, and
// this keeps the two lists (and their values) the same. Layer and head overrides are tables in
// TOML and arrays in JSON; the budget is written only when set.
void ExpectFileAndJsonHoldTheSameFields(const std::string& file, const nlohmann::json& config) {
  std::set<std::string> file_keys;
  bool in_kv = false;
  std::istringstream lines(file);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      in_kv = line == "[kv]";
      continue;
    }
    if (!in_kv) continue;
    const size_t eq = line.find(" = ");
    ASSERT_NE(eq, std::string::npos) << line;
    const std::string key = line.substr(0, eq);
    const std::string value = line.substr(eq + 3);
    file_keys.insert(key);
    ASSERT_TRUE(config.contains(key)) << "the JSON lacks '" << key << "'";
    const nlohmann::json& json_value = config[key];
    if (value.front() == '\'') {
      EXPECT_EQ(json_value, value.substr(1, value.size() - 2)) << key;
    } else if (value == "true" || value == "false") {
      EXPECT_EQ(json_value, value == "true") << key;
    } else {
      EXPECT_DOUBLE_EQ(json_value.get<double>(), std::stod(value)) << key;
    }
  }
  for (const auto& [key, value] : config.items()) {
    if (key == "layer_codecs" || key == "head_codecs") continue;
    if (key == "budget" && value == "") continue;
    EXPECT_TRUE(file_keys.count(key)) << "the file lacks '" << key << "'";
  }
}

TEST_F(SweepChoiceCliTest, ChosenCodecsAreWrittenAndRunAsMeasured) {
  const std::string chosen = dir_ + "/chosen.toml";
  const std::string json_path = dir_ + "/rows.json";
  std::filesystem::remove(chosen);
  // The base's own fields (sinks, a block size, a head override) must reach the file too.
  const CommandResult r =
      RunCli(Sweep() +
             " --k-codec f16,int8,int4-g8,int2-g8 --v-codec int8,int4-g8 --sinks 4 "
             "--block-size 32 --head-codec 0:1:f32: --max-dppl 1 --write-config " +
             chosen + " --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(Slurp(json_path))["rows"];
  ASSERT_EQ(rows.size(), 8u);
  const int expected = FewestBitsWithin(rows, 1.0);
  ASSERT_GE(expected, 0);
  // Some row is outside the bound and some inside has more bits: the choice is a real one.
  EXPECT_GT(FewestBitsWithin(rows, 1e9), -1);
  EXPECT_NE(FewestBitsWithin(rows, 1e9), expected);
  const auto& row = rows[expected];
  EXPECT_NE(r.out.find("Chosen within ΔPPL <= 1 % (fewest bits per element of context): "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("; written to " + chosen), std::string::npos) << r.out;

  auto config = kvstack::LoadKvConfigFile(chosen);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->k_codec, row["k_codec"]);
  EXPECT_EQ(config->v_codec, row["v_codec"]);
  EXPECT_EQ(config->sink_tokens, 4);
  EXPECT_EQ(config->block_size, 32);
  ASSERT_EQ(config->head_codecs.size(), 1u);
  EXPECT_EQ(config->KCodecOf(0, 1), "f32");
  EXPECT_EQ(config->capacity, 0);  // as the user gave it, not the sweep's resolved window
  const std::string file = Slurp(chosen);
  EXPECT_EQ(file.rfind("# KV cache design chosen by `kvstack sweep --max-dppl 1", 0), 0u) << file;
  // The file writes the grid's config, the JSON the resolved one: capacity differs.
  nlohmann::json resolved = row["config"];
  resolved["capacity"] = 0;
  ExpectFileAndJsonHoldTheSameFields(file, resolved);

  EXPECT_NEAR(PerplexityWith(chosen, 64), row["ppl"].get<double>(),
              1e-9 * row["ppl"].get<double>());
}

TEST_F(SweepChoiceCliTest, AnEvictingChoiceCarriesItsPolicyAndBudget) {
  const std::string chosen = dir_ + "/evicting.toml";
  const CommandResult r =
      RunCli(Sweep() + " --policy full,window --budget 24 --max-dppl 1000 --write-config " +
             chosen + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  ASSERT_EQ(rows.size(), 2u);
  // Keeping 24 of 64 tokens stores fewer bits of context, and 1000 % admits its loss.
  ASSERT_EQ(FewestBitsWithin(rows, 1000), 1);
  // With --json - the choice is named on stderr, so stdout stays JSON.
  EXPECT_NE(r.err.find("Chosen within ΔPPL <= 1000 % (fewest bits per element of context): "
                       "f16 / f16 window@24"),
            std::string::npos)
      << r.err;
  auto config = kvstack::LoadKvConfigFile(chosen);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy, "window");
  EXPECT_EQ(config->budget.ToString(), "24");
  nlohmann::json resolved = rows[1]["config"];
  resolved["capacity"] = 0;
  resolved["block_size"] = 0;  // the grid's "auto", which the run resolved
  ExpectFileAndJsonHoldTheSameFields(Slurp(chosen), resolved);
  // An evicting sweep runs in calls of 16 tokens; the file says so, and so reproduces.
  EXPECT_NE(Slurp(chosen).find("--ctx 64 --batch 16 --kv-config"), std::string::npos);
  EXPECT_NEAR(PerplexityWith(chosen, 16), rows[1]["ppl"].get<double>(),
              1e-9 * rows[1]["ppl"].get<double>());
}

TEST_F(SweepChoiceCliTest, PreferSpeedTakesTheFastestAttentionWithinTheBound) {
  const CommandResult r =
      RunCli(Sweep() +
             " --k-codec f16,int8,int4-g8 --v-codec int8 --max-dppl 50 --prefer speed "
             "--json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  int fastest = -1;
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    if (rows[i]["delta_ppl_pct"].get<double>() > 50) continue;
    if (fastest < 0 || rows[i]["decode_attention_us_per_token"].get<double>() <
                           rows[fastest]["decode_attention_us_per_token"].get<double>()) {
      fastest = i;
    }
  }
  ASSERT_GE(fastest, 0);
  const std::string label = rows[fastest]["k_codec"].get<std::string>() + " / " +
                            rows[fastest]["v_codec"].get<std::string>() + ",";
  EXPECT_NE(r.err.find("(fastest decode attention): " + label), std::string::npos) << r.err;
}

// KIVI keys hold their recent window and a 32-token unit in F32: the fewest bits per element
// stored, but not the fewest bytes the cache held at ctx 64. The two objectives disagree, and
// each takes its own figure's least.
TEST_F(SweepChoiceCliTest, PreferPeakMemoryCountsTheF32Rows) {
  const std::string grid =
      " --k-codec kivi4-g32,int4-g8,int8 --v-codec int4-g32,int4-g8 --block-size 32 "
      "--recent 32 --max-dppl 100 --json -";
  const CommandResult memory = RunCli(Sweep() + grid);
  const CommandResult peak = RunCli(Sweep() + grid + " --prefer peak-memory");
  ASSERT_EQ(memory.exit_code, 0) << memory.err;
  ASSERT_EQ(peak.exit_code, 0) << peak.err;
  const auto rows = nlohmann::json::parse(peak.out)["rows"];
  const int fewest_stored = FewestBitsWithin(rows, 100);
  const int fewest_held = FewestBitsWithin(rows, 100, "bits_at_ctx");
  ASSERT_GE(fewest_stored, 0);
  ASSERT_GE(fewest_held, 0);
  ASSERT_NE(fewest_stored, fewest_held);
  EXPECT_GT(rows[fewest_stored]["bits_at_ctx"].get<double>(),
            rows[fewest_held]["bits_at_ctx"].get<double>());
  const auto label = [&](int i) {
    return rows[i]["k_codec"].get<std::string>() + " / " + rows[i]["v_codec"].get<std::string>() +
           " recent=32,";
  };
  EXPECT_NE(memory.err.find("(fewest bits per element of context): " + label(fewest_stored)),
            std::string::npos)
      << memory.err;
  EXPECT_NE(peak.err.find("(fewest bytes in use at the run's fullest): " + label(fewest_held)),
            std::string::npos)
      << peak.err;
}

TEST_F(SweepChoiceCliTest, MixBestStoresTheHeadsWhoseProbesLostLeast) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int2 --v-codec int2 --probe-heads int8 "
                                 "--mix-best 1,3,20 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  // The grid's row, stories260K's 5 x 4 probes, then one row per count.
  ASSERT_EQ(rows.size(), 1u + 20u + 3u);
  for (int i = 21; i < 24; ++i) {
    for (const auto& head : rows[i]["config"]["head_codecs"]) {
      EXPECT_EQ(head["k_codec"], "int8");
      EXPECT_EQ(head["v_codec"], "int8");
    }
  }
  const auto& best1 = rows[21];
  const auto& best3 = rows[22];
  const auto& all20 = rows[23];
  // One head: the best probe's configuration itself, so the same perplexity to the bit.
  const std::set<std::pair<int, int>> best_head = BestProbedHeads(rows, 1);
  EXPECT_EQ(MixHeads(best1), best_head);
  const auto [layer, kv_head] = *best_head.begin();
  EXPECT_EQ(best1["ppl"].get<double>(), rows[1 + layer * 4 + kv_head]["ppl"].get<double>());
  EXPECT_EQ(MixHeads(best3), BestProbedHeads(rows, 3));
  const double int2_bits = rows[0]["bits_per_element"].get<double>();
  const double int8_bits = all20["bits_per_element"].get<double>();
  EXPECT_GT(int8_bits, int2_bits);
  EXPECT_DOUBLE_EQ(best1["bits_per_element"].get<double>(), (19 * int2_bits + int8_bits) / 20);
  EXPECT_DOUBLE_EQ(best3["bits_per_element"].get<double>(), (17 * int2_bits + 3 * int8_bits) / 20);
  EXPECT_EQ(MixHeads(all20).size(), 20u);
  // Every head in int8 loses least of all, the probes' best one head more than it.
  EXPECT_LT(all20["delta_ppl_pct"].get<double>(), best1["delta_ppl_pct"].get<double>());
}

// --mix-greedy chooses one head per round: the best probe's first, then each round the head
// whose mix with the heads chosen before it lost least, among every head not yet chosen; each
// round's mix is a row, and the JSON lists every round's candidates.
TEST_F(SweepChoiceCliTest, MixGreedyAddsTheHeadWhoseMixLosesLeastEachRound) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int2 --v-codec int2 --probe-heads int8 "
                                 "--mix-greedy 3 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  const auto& rows = json["rows"];
  // The grid's row, stories260K's 5 x 4 probes, then rounds 2 and 3.
  ASSERT_EQ(rows.size(), 1u + 20u + 2u);
  const auto& order = json["mix_greedy"];
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(MixHeads(rows[order[0]["row"].get<int>()]), BestProbedHeads(rows, 1));
  EXPECT_EQ(order[1]["row"].get<int>(), 21);
  EXPECT_EQ(order[2]["row"].get<int>(), 22);
  std::set<std::pair<int, int>> chosen;
  for (size_t round = 0; round < order.size(); ++round) {
    const auto& step = order[round];
    ASSERT_EQ(step["candidates"].size(), 20 - round);
    double least = std::numeric_limits<double>::infinity();
    for (const auto& candidate : step["candidates"]) {
      EXPECT_FALSE(chosen.count({candidate["layer"].get<int>(), candidate["kv_head"].get<int>()}));
      least = std::min(least, candidate["delta_ppl_pct"].get<double>());
    }
    EXPECT_EQ(step["delta_ppl_pct"].get<double>(), least) << "round " << round + 1;
    chosen.emplace(step["layer"].get<int>(), step["kv_head"].get<int>());
    // The round's row holds exactly the heads chosen so far, in the probe's codecs.
    const auto& row = rows[step["row"].get<int>()];
    EXPECT_EQ(MixHeads(row), chosen);
    EXPECT_EQ(row["delta_ppl_pct"].get<double>(), least);
    for (const auto& head : row["config"]["head_codecs"]) EXPECT_EQ(head["k_codec"], "int8");
  }
  EXPECT_EQ(chosen.size(), 3u);
  EXPECT_NE(r.err.find("--mix-greedy: heads in int8 / int8 in the order chosen, each with its "
                       "mix's ΔPPL: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rounds 2..3 are the last 2 rows (37 evaluations)"), std::string::npos)
      << r.err;
}

// A greedy mix chosen and written runs as it was measured: the written file's perplexity is
// its row's (the rows and the configurations they were measured with stay in step).
TEST_F(SweepChoiceCliTest, MixGreedyRowWrittenReproducesItsPerplexity) {
  const std::string chosen = dir_ + "/greedy.toml";
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int2 --v-codec int2 --probe-heads int8 "
                                 "--mix-greedy 3 --max-bits 100 --write-config " +
                                 chosen + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  const auto& rows = json["rows"];
  ASSERT_EQ(rows.size(), 23u);
  // The most accurate row of this grid is the last greedy mix (three heads in int8).
  ASSERT_EQ(json["choice"]["row"].get<int>(), 22) << json["choice"];
  EXPECT_EQ(MixHeads(rows[22]).size(), 3u);
  EXPECT_NEAR(PerplexityWith(chosen, 64), rows[22]["ppl"].get<double>(),
              1e-9 * rows[22]["ppl"].get<double>());
}

// The row the test expects among those `within` admits: the least in `key`, the first of equals.
template <typename Within, typename Key>
int BestRow(const nlohmann::json& rows, Within within, Key key) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    if (!within(rows[i])) continue;
    if (best < 0 || key(rows[i]) < key(rows[best])) best = i;
  }
  return best;
}

std::string LabelOf(const nlohmann::json& row) {
  return row["k_codec"].get<std::string>() + " / " + row["v_codec"].get<std::string>();
}

// A memory budget alone: the most accurate row that fits it, not the most accurate of all, and
// a file that says so and runs as it was measured.
TEST_F(SweepChoiceCliTest, MaxBitsAloneTakesTheMostAccurateRowWithinTheBudget) {
  const std::string chosen = dir_ + "/budget.toml";
  std::filesystem::remove(chosen);
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec f16,int8,int4-g8,int2-g8 --v-codec int8,int4-g8 "
                                 "--max-bits 8 --write-config " +
                                 chosen + " --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  const auto dppl = [](const nlohmann::json& row) {
    return std::tuple(row["delta_ppl_pct"].get<double>(), row["memory_bits"].get<double>());
  };
  const int expected = BestRow(
      rows, [](const nlohmann::json& row) { return row["memory_bits"].get<double>() <= 8; }, dppl);
  const int most_accurate = BestRow(
      rows, [](const nlohmann::json&) { return true; }, dppl);
  ASSERT_GE(expected, 0);
  ASSERT_NE(expected, most_accurate);  // the budget excludes the best row: a real choice
  // The JSON carries the choice too, for tools that read it rather than the line.
  const auto choice = nlohmann::json::parse(r.out)["choice"];
  EXPECT_EQ(choice["row"], expected);
  EXPECT_EQ(choice["prefer"], "accuracy");
  EXPECT_EQ(choice["max_bits"], 8.0);
  EXPECT_TRUE(choice["max_dppl_pct"].is_null());
  EXPECT_TRUE(choice["max_bits_at_ctx"].is_null());
  EXPECT_FALSE(choice.contains("error"));
  EXPECT_NE(r.err.find("Chosen within bits/elem of context <= 8 (smallest ΔPPL): " +
                       LabelOf(rows[expected]) + ","),
            std::string::npos)
      << r.err;
  const std::string file = Slurp(chosen);
  EXPECT_EQ(file.rfind("# KV cache design chosen by `kvstack sweep --max-bits 8 --prefer "
                       "accuracy`: of the rows within\n# bits/elem of context <= 8, the one "
                       "with the smallest ΔPPL.\n",
                       0),
            0u)
      << file;
  EXPECT_NEAR(PerplexityWith(chosen, 64), rows[expected]["ppl"].get<double>(),
              1e-9 * rows[expected]["ppl"].get<double>());
}

// Both kinds of bound hold at once, and --prefer still decides among the rows within them:
// here KIVI's F32 unit holds bits at ctx that its bits of context do not show.
TEST_F(SweepChoiceCliTest, AccuracyAndHeldMemoryBoundsHoldTogether) {
  const std::string grid =
      " --k-codec kivi4-g32,int4-g8,int8,f16 --v-codec int4-g32,int4-g8,int8,f16 --pairs "
      "--block-size 32 --recent 32 --json -";
  const CommandResult all = RunCli(Sweep() + grid);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const auto rows = nlohmann::json::parse(all.out)["rows"];
  ASSERT_EQ(rows.size(), 4u);
  // A held bound between the rows' figures, and a loss bound that admits all but the worst.
  std::vector<double> held, loss;
  for (const auto& row : rows) {
    held.push_back(row["bits_at_ctx"].get<double>());
    loss.push_back(row["delta_ppl_pct"].get<double>());
  }
  std::sort(held.begin(), held.end());
  std::sort(loss.begin(), loss.end());
  const double max_held = (held[2] + held[3]) / 2;
  const double max_dppl = (loss[2] + loss[3]) / 2;
  const auto within = [&](const nlohmann::json& row) {
    return row["bits_at_ctx"].get<double>() <= max_held &&
           row["delta_ppl_pct"].get<double>() <= max_dppl;
  };
  const auto speed = [](const nlohmann::json& row) {
    return row["decode_attention_us_per_token"].get<double>();
  };
  const std::string bounds =
      absl::StrFormat(" --max-dppl %.6g --max-bits-at-ctx %.6g", max_dppl, max_held);
  const CommandResult fewest = RunCli(Sweep() + grid + bounds);
  ASSERT_EQ(fewest.exit_code, 0) << fewest.err;
  const auto fewest_bits = [](const nlohmann::json& row) {
    return std::tuple(row["memory_bits"].get<double>(), row["delta_ppl_pct"].get<double>());
  };
  const int expected = BestRow(rows, within, fewest_bits);
  ASSERT_GE(expected, 0);
  // The held bound rules out the row the loss bound alone would take (KIVI's).
  const int loss_bound_only = BestRow(
      rows,
      [&](const nlohmann::json& row) { return row["delta_ppl_pct"].get<double>() <= max_dppl; },
      fewest_bits);
  ASSERT_NE(expected, loss_bound_only);
  EXPECT_NE(fewest.err.find("(fewest bits per element of context): " + LabelOf(rows[expected]) +
                            " recent=32,"),
            std::string::npos)
      << fewest.err;
  // Speed among the same rows: attention times differ between runs, so the test checks the
  // chosen row is within the bounds rather than which one it is.
  const CommandResult fastest = RunCli(Sweep() + grid + bounds + " --prefer speed");
  ASSERT_EQ(fastest.exit_code, 0) << fastest.err;
  const auto fastest_rows = nlohmann::json::parse(fastest.out)["rows"];
  const int fastest_expected = BestRow(fastest_rows, within, speed);
  ASSERT_GE(fastest_expected, 0);
  EXPECT_NE(fastest.err.find("(fastest decode attention): " +
                             LabelOf(fastest_rows[fastest_expected]) + " recent=32,"),
            std::string::npos)
      << fastest.err;
}

// Bounds nothing meets together: one line that says, for each kind, how close the rows within
// the other kind came, so the user knows which bound to move and by how much.
TEST_F(SweepChoiceCliTest, BoundsNothingMeetsTogetherNameTheNearestMisses) {
  const std::string json_path = dir_ + "/unmet.json";
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int8,int2-g8 --v-codec int8,int2-g8 --pairs "
                                 "--max-dppl 1 --max-bits 7 --json " +
                                 json_path);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  // The JSON, written before the error, says the same: no row, and why.
  const auto choice = nlohmann::json::parse(Slurp(json_path))["choice"];
  EXPECT_TRUE(choice["row"].is_null());
  EXPECT_EQ(choice["prefer"], "memory");
  EXPECT_EQ("kvstack: " + choice["error"].get<std::string>() + "\n", r.err);
  EXPECT_NE(r.err.find("kvstack: --max-dppl 1 --max-bits 7: no configuration is within ΔPPL <= "
                       "1 % and bits/elem of context <= 7 (the most accurate within the memory "
                       "bounds: int2-g8 / int2-g8 at +"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("; the fewest bits of context within the ΔPPL bound: int8 / int8 at "
                       "10.00); nothing chosen"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("| int2-g8 / int2-g8 |"), std::string::npos) << r.out;
}

// --mix-fit fills a memory budget with the best-probed heads: as many in the larger codec as
// fit, and the choice then takes the most accurate row within the budget.
TEST_F(SweepChoiceCliTest, MixFitTakesAsManyBestProbedHeadsAsTheBudgetHolds) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int2 --v-codec int2 --probe-heads int8 "
                                 "--max-bits 4.05 --mix-fit --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  ASSERT_EQ(rows.size(), 1u + 20u + 1u);  // the grid's row, the probes, the mix
  const auto& mix = rows[21];
  // int2 stores 3 bits and int8 10 at head_dim 8: each of 20 heads in int8 adds 0.35, and
  // 4.05 is exactly 3 heads' worth, a sum that rounding in doubles puts just above it.
  const int count = static_cast<int>(MixHeads(mix).size());
  ASSERT_EQ(count, 3);
  EXPECT_EQ(MixHeads(mix), BestProbedHeads(rows, count));
  // Every head in int8 adds the same bits: the mix fits, one head more would not.
  const double first = rows[0]["memory_bits"].get<double>();
  const double per_head = rows[1]["memory_bits"].get<double>() - first;
  ASSERT_GT(per_head, 0);
  EXPECT_NEAR(mix["memory_bits"].get<double>(), first + count * per_head, 1e-9);
  EXPECT_NEAR(mix["memory_bits"].get<double>(), 4.05, 1e-9);
  EXPECT_GT(first + (count + 1) * per_head, 4.05);
  EXPECT_NE(r.err.find("--mix-fit: the " + std::to_string(count) +
                       " best-probed of 20 heads in int8 / int8 fit bits/elem of context <= "
                       "4.05; their mix is the last row"),
            std::string::npos)
      << r.err;
  const int most_accurate = BestRow(
      rows,
      [](const nlohmann::json& row) { return row["memory_bits"].get<double>() <= 4.05 + 1e-9; },
      [](const nlohmann::json& row) {
        return std::tuple(row["delta_ppl_pct"].get<double>(), row["memory_bits"].get<double>());
      });
  EXPECT_NE(r.err.find("(smallest ΔPPL): int2 / int2 " +
                       (most_accurate == 21 ? "+" + std::to_string(count) + " head overrides,"
                                            : std::string("head."))),
            std::string::npos)
      << r.err;
}

// Where the probe's codecs are the smaller, the fewest heads that bring the row within the
// budget: each one more costs accuracy.
TEST_F(SweepChoiceCliTest, MixFitTakesTheFewestSmallerHeadsThatFit) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int8 --v-codec int8 --probe-heads int2 "
                                 "--max-bits 8 --mix-fit --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  ASSERT_EQ(rows.size(), 22u);
  const int count = static_cast<int>(MixHeads(rows[21]).size());
  EXPECT_EQ(MixHeads(rows[21]), BestProbedHeads(rows, count));
  const double first = rows[0]["memory_bits"].get<double>();
  const double per_head = rows[1]["memory_bits"].get<double>() - first;
  ASSERT_LT(per_head, 0);
  EXPECT_LE(rows[21]["memory_bits"].get<double>(), 8 + 1e-9);
  EXPECT_GT(first + (count - 1) * per_head, 8);
}

// A count --mix-best already asked for gets no second row, and the line says whose it is.
TEST_F(SweepChoiceCliTest, MixFitOfACountMixBestAskedForAddsNoSecondRow) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int2 --v-codec int2 --probe-heads int8 "
                                 "--mix-best 3 --max-bits 4.05 --mix-fit --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  ASSERT_EQ(rows.size(), 1u + 20u + 1u);
  EXPECT_EQ(MixHeads(rows[21]), BestProbedHeads(rows, 3));
  EXPECT_NE(r.err.find("--mix-fit: the 3 best-probed of 20 heads in int8 / int8 fit bits/elem of "
                       "context <= 4.05; their mix is --mix-best's row of that count"),
            std::string::npos)
      << r.err;
}

// A budget no mix can meet adds no row, says so, and the choice's error names the nearest.
TEST_F(SweepChoiceCliTest, MixFitWithABudgetNothingMeetsAddsNoRow) {
  const CommandResult r = RunCli(Sweep() +
                                 " --k-codec int8 --v-codec int8 --probe-heads int2 "
                                 "--max-bits 2 --mix-fit --csv -");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(Lines(r.out), 1 + 1 + 20) << r.out;  // the header, the grid's row, the probes
  EXPECT_NE(r.err.find("--mix-fit: no number of heads in int2 / int2 fits bits/elem of context "
                       "<= 2; no mix row added"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("kvstack: --max-bits 2: no configuration is within bits/elem of context "
                       "<= 2 (the fewest bits of context: "),
            std::string::npos)
      << r.err;
}

TEST_F(SweepChoiceCliTest, BoundNothingMeetsLosesNoOtherOutput) {
  const std::string chosen = dir_ + "/never.toml";
  const std::string csv = dir_ + "/rows.csv";
  std::filesystem::remove(chosen);
  const CommandResult r = RunCli(Sweep() + " --k-codec int2-g8 --v-codec int2-g8 --max-dppl 0.5 " +
                                 "--write-config " + chosen + " --csv " + csv);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("kvstack: --max-dppl 0.5: no configuration is within ΔPPL <= 0.5 % (the "
                       "closest: int2-g8 / int2-g8 at +"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(chosen));
  EXPECT_EQ(Lines(Slurp(csv)), 2);  // the header and the row
  EXPECT_NE(r.out.find("| int2-g8 / int2-g8 |"), std::string::npos) << r.out;
}

TEST_F(SweepChoiceCliTest, BadChoiceInputGetsOneLineBeforeAnyWork) {
  for (const std::string& args : {
           Sweep() + " --max-dppl -1",                                    // negative bound
           Sweep() + " --max-dppl nan",                                   // not a number
           Sweep() + " --max-dppl 1 --prefer fast",                       // unknown objective
           Sweep() + " --max-dppl 1 --write-config /no/such/dir/c.toml",  // unwritable
           Sweep() + " --max-dppl 1 --write-config -",                    // not a file
           Sweep() + " --max-dppl 1 --stream 256",                        // no ΔPPL rows
           Sweep() + " --probe-heads int8 --mix-best 0",                  // no heads
           Sweep() + " --probe-heads int8 --mix-best 21",                 // 20 kv heads
           Sweep() + " --probe-heads int8 --mix-best 2 --stream 256",     // no ΔPPL rows
           Sweep() + " --probe-heads int8 --mix-greedy 1",                // the best probe row
           Sweep() + " --probe-heads int8 --mix-greedy 21",               // 20 kv heads
           Sweep() + " --probe-heads int8 --mix-greedy 3 --stream 256",   // no ΔPPL rows
           Sweep() + " --max-bits 0",                                     // no memory at all
           Sweep() + " --max-bits -4",                                    // negative
           Sweep() + " --max-bits-at-ctx nan",                            // not a number
           Sweep() + " --max-bits-at-ctx inf",                            // no bound
           Sweep() + " --max-bits 4.5 --stream 256",                      // no ΔPPL rows
           Sweep() + " --max-bits 4.5 --prefer fast",                     // unknown objective
           Sweep() + " --prefer speed",                                   // nothing to bound
           Sweep() + " --write-config c.toml",                            // nothing to bound
           Sweep() + " --probe-heads int8 --mix-fit",                     // no memory budget
           Sweep() + " --probe-heads int8 --mix-fit --max-dppl 1",        // no memory budget
       }) {
    const CommandResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_EQ(Lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("kvstack: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // The unknown objective's line names every one there is.
  EXPECT_NE(RunCli(Sweep() + " --max-dppl 1 --prefer fast")
                .err.find("allowed: memory, peak-memory, speed, accuracy"),
            std::string::npos);
  // --prefer and --write-config only mean something with a bound: refused alone, naming them.
  EXPECT_NE(RunCli(Sweep() + " --prefer speed")
                .err.find("--prefer needs a bound to choose within: --max-dppl, --max-bits or "
                          "--max-bits-at-ctx"),
            std::string::npos);
  EXPECT_NE(RunCli(Sweep() + " --max-bits -4").err.find("--max-bits must be bits per element > 0"),
            std::string::npos);
  EXPECT_NE(RunCli(Sweep() + " --probe-heads int8 --mix-fit")
                .err.find("--mix-fit fills a memory budget: give --max-bits or --max-bits-at-ctx"),
            std::string::npos);
  const CommandResult fit = RunCli(Sweep() + " --mix-fit --max-bits 4");
  EXPECT_EQ(fit.exit_code, 2) << fit.err;
  EXPECT_NE(fit.err.find("--mix-fit requires --probe-heads"), std::string::npos) << fit.err;
  const CommandResult mix = RunCli(Sweep() + " --mix-best 2");
  EXPECT_EQ(mix.exit_code, 2) << mix.err;
  EXPECT_NE(mix.err.find("--mix-best requires --probe-heads"), std::string::npos) << mix.err;
  EXPECT_NE(RunCli(Sweep() + " --probe-heads int8 --mix-best 21").err.find("allowed 1..20"),
            std::string::npos);
  EXPECT_NE(RunCli(Sweep() + " --probe-heads int8 --mix-greedy 1").err.find("allowed 2..20"),
            std::string::npos);
  const CommandResult greedy = RunCli(Sweep() + " --mix-greedy 2");
  EXPECT_EQ(greedy.exit_code, 2) << greedy.err;
  EXPECT_NE(greedy.err.find("--mix-greedy requires --probe-heads"), std::string::npos)
      << greedy.err;
}

}  // namespace
