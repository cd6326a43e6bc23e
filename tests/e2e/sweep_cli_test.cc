// `kvstack sweep` as a user runs it: the real binary on the real model and a slice of real
// text, a few windows per configuration. Checks the markdown table, the CSV and JSON rows, the
// plot files, and that bad input gets one line and exit code 1 before any work.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using namespace kvstack::testing_cli;  // NOLINT: test helpers

const std::string kShared = KVS_SHARED_DIR;
const std::string kModel = kShared + "/models/stories260K.gguf";

class SweepCliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir() + "/sweep_cli";
    std::filesystem::create_directories(dir_);
    // A slice of the validation text: enough for the 3 windows of 64 tokens each run uses.
    const std::string text = Slurp(kShared + "/data/tinystories_valid_head256k.txt");
    std::ofstream(dir_ + "/slice.txt") << text.substr(0, 4000);
  }

  std::string Base() const {
    return "sweep -m " + kModel + " -f " + dir_ + "/slice.txt --ctx 64 --max-windows 3 --threads 2";
  }

  std::string dir_;
};

TEST_F(SweepCliTest, GridWritesTableCsvJsonAndPlot) {
  for (const char* ext : {".csv", ".json", ".png", ".svg"}) {
    std::filesystem::remove(dir_ + "/out" + ext);
  }
  const CommandResult r = RunCli(Base() + " --k-codec f32,bf16 --v-codec f16,bf16 --csv " + dir_ +
                                 "/out.csv --json " + dir_ + "/out.json --plot " + dir_ + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // Markdown table: header, separator, one row per K x V pair, in grid order.
  EXPECT_NE(r.out.find("| config | bits/elem | bytes/token/layer | compression vs F16 | kept | "
                       "bits at ctx |"),
            std::string::npos)
      << r.out;
  const size_t f32_f16 = r.out.find("| f32 / f16 | 24.00 | 192.0 | 0.67x | 1.000 | 24.00 |");
  const size_t f32_bf16 = r.out.find("| f32 / bf16 |");
  const size_t bf16_f16 = r.out.find("| bf16 / f16 |");
  const size_t bf16_bf16 = r.out.find("| bf16 / bf16 | 16.00 | 128.0 | 1.00x |");
  ASSERT_NE(f32_f16, std::string::npos) << r.out;
  ASSERT_NE(bf16_bf16, std::string::npos) << r.out;
  EXPECT_LT(f32_f16, f32_bf16);
  EXPECT_LT(f32_bf16, bf16_f16);
  EXPECT_LT(bf16_f16, bf16_bf16);
  EXPECT_NE(r.out.find("93 tokens scored in 3 windows of 64"), std::string::npos) << r.out;

  const std::string csv = Slurp(dir_ + "/out.csv");
  EXPECT_EQ(
      csv.substr(0, csv.find('\n')),
      "k_codec,v_codec,policy,budget,recent_tokens,bits_per_element,bytes_per_token_per_layer,"
      "compression_vs_f16,kept_fraction,memory_bits,peak_cache_bytes,bits_at_ctx,ppl,"
      "ppl_stderr,delta_ppl_pct,mean_kl,top1_agreement,tokens_scored,"
      "decode_attention_us_per_token,pareto");
  EXPECT_EQ(Lines(csv), 1 + 4);
  // 64 tokens x 128 bytes in each of 5 layers, in whole blocks: 16 bits at ctx.
  EXPECT_NE(csv.find("\nbf16,bf16,full,,0,16,128,1,1,16,40960,16,"), std::string::npos) << csv;
  // The table names the frontier; CSV and JSON mark its rows. Some 16-bit pair has the fewest
  // bits, so the frontier is never empty.
  EXPECT_NE(r.out.find("Pareto frontier (fewest bits of context for a given ΔPPL): "),
            std::string::npos);

  const auto json = nlohmann::json::parse(Slurp(dir_ + "/out.json"));
  EXPECT_EQ(json["ctx"], 64);
  EXPECT_EQ(json["windows"], 3);
  EXPECT_EQ(json["reference"]["config"]["k_codec"], "f32");
  EXPECT_EQ(json["reference"]["peak_cache_bytes"], 64 * 5 * 256);  // F32 K and V, 5 layers
  const double reference_ppl = json["reference"]["ppl"].get<double>();
  EXPECT_GT(reference_ppl, 1.0);
  ASSERT_EQ(json["rows"].size(), 4u);
  int num_pareto = 0;
  for (const auto& row : json["rows"]) {
    for (const char* key :
         {"bits_per_element", "bytes_per_token_per_layer", "compression_vs_f16", "ppl",
          "ppl_stderr", "delta_ppl_pct", "mean_kl", "top1_agreement", "tokens_scored",
          "decode_attention_us_per_token", "peak_cache_bytes", "bits_at_ctx"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    EXPECT_EQ(row["config"]["k_codec"], row["k_codec"]);
    EXPECT_EQ(row["tokens_scored"], 93);
    num_pareto += row["pareto"].get<bool>();
    EXPECT_GE(row["mean_kl"].get<double>(), 0.0);
    EXPECT_NEAR(row["delta_ppl_pct"].get<double>(),
                100.0 * (row["ppl"].get<double>() / reference_ppl - 1.0), 1e-9);
  }
  EXPECT_GE(num_pareto, 1);
  // The same rows are marked in the CSV's last column.
  int csv_pareto = 0;
  for (size_t pos = csv.find(",1\n"); pos != std::string::npos; pos = csv.find(",1\n", pos + 1)) {
    ++csv_pareto;
  }
  EXPECT_EQ(csv_pareto, num_pareto);

  const std::string png = Slurp(dir_ + "/out.png");
  const std::string svg = Slurp(dir_ + "/out.svg");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("bf16 / bf16"), std::string::npos);  // the points are labelled
}

TEST_F(SweepCliTest, PairsZipTheListsAndF32MatchesTheReference) {
  const CommandResult r = RunCli(Base() + " --pairs --k-codec f32,f16 --v-codec f32,f16 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // --json - makes stdout pure JSON (no table).
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["rows"].size(), 2u);
  EXPECT_EQ(json["rows"][0]["k_codec"], "f32");
  EXPECT_EQ(json["rows"][0]["v_codec"], "f32");
  EXPECT_EQ(json["rows"][0]["mean_kl"].get<double>(), 0.0);
  EXPECT_EQ(json["rows"][0]["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(json["rows"][0]["delta_ppl_pct"].get<double>(), 0.0);
  EXPECT_EQ(json["rows"][1]["k_codec"], "f16");
  EXPECT_EQ(json["rows"][1]["v_codec"], "f16");
  EXPECT_GT(json["rows"][1]["mean_kl"].get<double>(), 0.0);
}

// --lowrank adds one K = V row per entry after the codec grid, short names taking "lowrank-";
// full-rank bases only rotate, so those rows score as the F16 cache does.
TEST_F(SweepCliTest, LowRankRowsFollowTheGridAndNeedTheirProfile) {
  const std::string profile = dir_ + "/s260.kvsprof";
  const CommandResult calibrate =
      RunCli("calibrate -m " + kModel + " -f " + kShared +
             "/data/tinystories_valid_head256k.txt --ctx 256 --max-windows 4 -o " + profile);
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.err;

  const CommandResult r = RunCli(Base() + " --k-codec f16 --v-codec f16 --profile " + profile +
                                 " --lowrank r8,r4-int4,latent-r16 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["rows"].size(), 4u);
  const auto& rows = json["rows"];
  const char* expected[] = {"f16", "lowrank-r8", "lowrank-r4-int4", "latent-r16"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rows[i]["k_codec"], expected[i]);
    EXPECT_EQ(rows[i]["v_codec"], expected[i]);
  }
  const double f16_ppl = rows[0]["ppl"].get<double>();
  EXPECT_NEAR(rows[1]["ppl"].get<double>(), f16_ppl, 1e-3 * f16_ppl);
  EXPECT_NEAR(rows[3]["ppl"].get<double>(), f16_ppl, 1e-3 * f16_ppl);
  // Half rank in 4 bits: an F16 scale and minimum and 4 codes per head and token, 48 bits for
  // 8 elements; and a real loss on this model.
  EXPECT_EQ(rows[2]["bits_per_element"].get<double>(), 6.0);
  EXPECT_GT(rows[2]["ppl"].get<double>(), 1.5 * f16_ppl);

  // Low-rank codecs for one kv head only: the profile is loaded for them, full rank
  // reconstructs, and half rank in 4 bits on one head of 20 changes the result (on these 3
  // windows it happens to lower PPL by 0.3 %), by far less than on every head.
  auto head_ppl = [&](const std::string& codec) {
    const CommandResult head = RunCli(Base() + " --k-codec f16 --v-codec f16 --profile " + profile +
                                      " --head-codec 2:1:" + codec + ":" + codec + " --json -");
    EXPECT_EQ(head.exit_code, 0) << head.err;
    return head.exit_code == 0 ? nlohmann::json::parse(head.out)["rows"][0]["ppl"].get<double>()
                               : 0.0;
  };
  EXPECT_NEAR(head_ppl("lowrank-r8"), f16_ppl, 1e-3 * f16_ppl);
  const double one_head_r4 = head_ppl("lowrank-r4-int4");
  EXPECT_GT(std::abs(one_head_r4 - f16_ppl), 1e-3 * f16_ppl);
  EXPECT_LT(one_head_r4, rows[2]["ppl"].get<double>());

  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {" --profile " + profile + " --lowrank int4", "--lowrank 'int4'"},
           {" --profile " + profile + " --lowrank r9", "rank 9 is above head_dim 8"},
           {" --lowrank r4", "give --profile"},
           {" --head-codec 0:0:lowrank-r4:", "give --profile"},
       }) {
    const CommandResult bad = RunCli(Base() + args);
    EXPECT_EQ(bad.exit_code, 1) << args << "\n" << bad.err;
    EXPECT_EQ(Lines(bad.err), 1) << args << "\n" << bad.err;
    EXPECT_NE(bad.err.find(message), std::string::npos) << args << "\n" << bad.err;
    EXPECT_TRUE(bad.out.empty()) << bad.out;
  }
}

TEST_F(SweepCliTest, CacheFlagsReachTheBaseConfig) {
  const CommandResult r = RunCli(Base() +
                                 " --k-codec f16 --v-codec f16 --sinks 4 --hadamard-keys "
                                 "--layer-codec 0:f32: --layer-codec 1::bf16 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  const auto& config = json["rows"][0]["config"];
  EXPECT_EQ(config["sink_tokens"], 4);
  EXPECT_EQ(config["hadamard_keys"], true);
  ASSERT_EQ(config["layer_codecs"].size(), 2u);
  EXPECT_EQ(config["layer_codecs"][0]["layer_idx"], 0);
  EXPECT_EQ(config["layer_codecs"][0]["k_codec"], "f32");
  EXPECT_EQ(config["layer_codecs"][0]["v_codec"], "");
  EXPECT_EQ(config["layer_codecs"][1]["v_codec"], "bf16");
  // Layer 0 keys at 32 bits, layer 1 values at 16: the mean over 5 layers moves off 16.
  EXPECT_DOUBLE_EQ(json["rows"][0]["bits_per_element"].get<double>(), (16.0 * 4 + 24.0) / 5);
  // The reference is plain F32: no overrides, no sinks, no rotation.
  EXPECT_TRUE(json["reference"]["config"]["layer_codecs"].empty());
  EXPECT_EQ(json["reference"]["config"]["sink_tokens"], 0);
}

// --recent is a grid dimension: one row per window for each codec pair, labelled with it. The
// window changes what the cache holds, not what it stores per encoded element: 32 more tokens
// of F32 K and V rows in a window of 64 are 32 * 32 / 64 = 16 more bits per element at ctx.
TEST_F(SweepCliTest, RecentWindowsAreAGridDimension) {
  const CommandResult r =
      RunCli(Base() +
             " --k-codec kivi4-g32,int8 --v-codec int4-g32 --block-size 32 --batch 16 "
             "--recent 0,32 --json " +
             dir_ + "/recent.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| kivi4-g32 / int4-g32 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| kivi4-g32 / int4-g32 recent=32 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| int8 / int4-g32 recent=32 |"), std::string::npos) << r.out;
  const auto rows = nlohmann::json::parse(Slurp(dir_ + "/recent.json"))["rows"];
  ASSERT_EQ(rows.size(), 4u);  // codec pair outer, window inner
  for (int pair = 0; pair < 2; ++pair) {
    const auto& without = rows[2 * pair];
    const auto& with = rows[2 * pair + 1];
    EXPECT_EQ(without["recent_tokens"], 0);
    EXPECT_EQ(with["recent_tokens"], 32);
    EXPECT_EQ(with["config"]["recent_tokens"], 32);
    EXPECT_EQ(with["bits_per_element"], without["bits_per_element"]);
    EXPECT_DOUBLE_EQ(with["bits_at_ctx"].get<double>() - without["bits_at_ctx"].get<double>(),
                     16.0);
  }
  // The frontier at this ctx weighs what the rows held: no row on it is beaten on both counts.
  EXPECT_NE(r.out.find("At this ctx (fewest bits held, F32 rows included): "), std::string::npos);
  int num_on_frontier = 0;
  for (const auto& a : rows) {
    if (!a["pareto_at_ctx"].get<bool>()) continue;
    ++num_on_frontier;
    const double bits = a["bits_at_ctx"].get<double>();
    const double loss = a["delta_ppl_pct"].get<double>();
    for (const auto& b : rows) {
      const double b_bits = b["bits_at_ctx"].get<double>();
      const double b_loss = b["delta_ppl_pct"].get<double>();
      EXPECT_FALSE(b_bits <= bits && b_loss <= loss && (b_bits < bits || b_loss < loss));
    }
  }
  EXPECT_GE(num_on_frontier, 1);

  // --plot-held draws the same rows against the bits held, with that frontier.
  const CommandResult plotted = RunCli(Base() +
                                       " --k-codec kivi4-g32 --v-codec int4-g32 --block-size 32 "
                                       "--batch 16 --recent 0,32 --plot-held --plot " +
                                       dir_ + "/held");
  ASSERT_EQ(plotted.exit_code, 0) << plotted.err;
  const std::string svg = Slurp(dir_ + "/held.svg");
  EXPECT_NE(svg.find("bits per element held at ctx 64"), std::string::npos);
  EXPECT_NE(svg.find("recent=32"), std::string::npos);
}

TEST_F(SweepCliTest, HeadCodecsGiveOneKvHeadItsOwnCodecs) {
  const std::string grid = Base() + " --k-codec int4 --v-codec int4 --json -";
  const CommandResult plain = RunCli(grid);
  const CommandResult mixed = RunCli(grid + " --head-codec 0:0:f32:f32");
  const CommandResult same = RunCli(grid + " --head-codec 0:0:int4:int4");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
  ASSERT_EQ(same.exit_code, 0) << same.err;
  const auto plain_row = nlohmann::json::parse(plain.out)["rows"][0];
  const auto mixed_json = nlohmann::json::parse(mixed.out);
  const auto mixed_row = mixed_json["rows"][0];
  const auto same_row = nlohmann::json::parse(same.out)["rows"][0];
  ASSERT_EQ(mixed_row["config"]["head_codecs"].size(), 1u);
  EXPECT_EQ(mixed_row["config"]["head_codecs"][0]["kv_head"], 0);
  EXPECT_EQ(mixed_row["config"]["head_codecs"][0]["k_codec"], "f32");
  EXPECT_TRUE(mixed_json["reference"]["config"]["head_codecs"].empty());
  // stories260K: 5 layers of 4 kv heads; one of the 20 (layer, head) pairs at 32 bits.
  const double int4_bits = plain_row["bits_per_element"].get<double>();
  EXPECT_DOUBLE_EQ(mixed_row["bits_per_element"].get<double>(), (19 * int4_bits + 32.0) / 20);
  // The head's own cache differs from the layer's; naming the layer's codec changes nothing.
  EXPECT_NE(mixed_row["ppl"].get<double>(), plain_row["ppl"].get<double>());
  EXPECT_EQ(same_row["ppl"].get<double>(), plain_row["ppl"].get<double>());
  EXPECT_EQ(same_row["bits_per_element"].get<double>(), int4_bits);
}

TEST_F(SweepCliTest, ProbeHeadsAddsOneRowPerKvHeadOfTheFirstConfiguration) {
  const CommandResult r = RunCli(
      Base() + " --pairs --k-codec int2,int8 --v-codec int2,int8 --probe-heads int8 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out)["rows"];
  // The grid's two rows, then one per (layer, kv head) of stories260K's 5 x 4, layer-major.
  ASSERT_EQ(rows.size(), 2u + 20u);
  const double int2_bits = rows[0]["bits_per_element"].get<double>();
  const double int8_bits = rows[1]["bits_per_element"].get<double>();
  double best_probe = rows[0]["delta_ppl_pct"].get<double>();
  for (int i = 0; i < 20; ++i) {
    const auto& row = rows[2 + i];
    SCOPED_TRACE(row["config"]["head_codecs"].dump());
    EXPECT_EQ(row["config"]["k_codec"], "int2");
    ASSERT_EQ(row["config"]["head_codecs"].size(), 1u);
    EXPECT_EQ(row["config"]["head_codecs"][0]["layer_idx"], i / 4);
    EXPECT_EQ(row["config"]["head_codecs"][0]["kv_head"], i % 4);
    EXPECT_EQ(row["config"]["head_codecs"][0]["v_codec"], "int8");
    EXPECT_DOUBLE_EQ(row["bits_per_element"].get<double>(), (19 * int2_bits + int8_bits) / 20);
    best_probe = std::min(best_probe, row["delta_ppl_pct"].get<double>());
  }
  // Some head is worth its 8 bits: int2 everywhere loses more than with that head in int8.
  EXPECT_LT(best_probe, rows[0]["delta_ppl_pct"].get<double>());
  const CommandResult table =
      RunCli(Base() + " --k-codec int2 --v-codec int2 --probe-heads int8:int4");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("| int2 / int2 head.4.3=int8/int4 |"), std::string::npos) << table.out;
}

TEST_F(SweepCliTest, BadInputGetsOneLineAndExitOne) {
  const std::string plot = dir_ + "/never";
  for (const std::string& args : {
           Base() + " --k-codec f16,no_such_codec --plot " + plot,  // unknown codec
           Base() + " --layer-codec 0:f16",                         // missing V field
           Base() + " --layer-codec x:f16:f16",                     // layer not a number
           Base() + " --head-codec 0:int8:int8",                    // missing H field
           Base() + " --head-codec 0:4:int8:int8",                  // no kv head 4
           Base() + " --head-codec 1:0:latent-r4:latent-r4",        // latent per head
           Base() + " --probe-heads int8:",                         // empty value codec
           Base() + " --probe-heads int8:int4:f16",                 // three fields
           Base() + " --probe-heads int9",                          // unknown codec
           Base() + " --pairs --k-codec f16,bf16 --v-codec f16",    // lists of unequal length
           Base() + " --csv /no/such/dir/out.csv",                  // unwritable output
           Base() + " --stream -5",                                 // negative stream
           Base() + " --recent -1",                                 // negative window
           Base() + " --k-codec kivi4-g32 --recent 0,8",            // not whole KIVI units
           Base() + " --stream 256 --plot-held --plot " + plot,     // no memory axis there
       }) {
    const CommandResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_EQ(Lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("kvstack: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(plot + ".png"));
  EXPECT_NE(RunCli(Base() + " --k-codec f16,no_such_codec").err.find("no_such_codec"),
            std::string::npos);
  EXPECT_NE(RunCli(Base() + " --layer-codec 0:f16").err.find("L:K:V"), std::string::npos);
  EXPECT_NE(RunCli(Base() + " --head-codec 0:int8:int8").err.find("L:H:K:V"), std::string::npos);
  EXPECT_NE(RunCli(Base() + " --head-codec 0:4:int8:int8").err.find("kv heads 0..3"),
            std::string::npos);
  // --segment sizes --stream's segments; alone it would be ignored, so it is refused.
  const CommandResult segment = RunCli(Base() + " --segment 64");
  EXPECT_EQ(segment.exit_code, 2) << segment.err;
  EXPECT_EQ(Lines(segment.err), 1) << segment.err;
  EXPECT_NE(segment.err.find("--segment requires --stream"), std::string::npos) << segment.err;
}

TEST_F(SweepCliTest, MissingGnuplotIsAClearErrorBeforeAnyWork) {
  const CommandResult r = RunCli(Base() + " --plot " + dir_ + "/nogp", "PATH=/nonexistent");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("gnuplot"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
