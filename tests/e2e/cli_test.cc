// The kvstack CLI as a user runs it: real binary, real model, real files. Checks outputs,
// JSON shapes and that bad input gets one clear line and a non-zero exit, never a crash.
#include <sys/wait.h>

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

TEST(Cli, GenerateGreedyPrintsReferenceTextAndJsonStats) {
  const CommandResult r =
      RunCli("generate --model " + kModel + " --prompt 'Once upon a time' -n 48 --temp 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park. One day, she saw a big, red ball. She wanted to play with it,\n");
  const auto stats = nlohmann::json::parse(r.err);
  EXPECT_GT(stats["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(stats["decode_tokens_per_s"].get<double>(), 0);
  // 53 tokens (BOS + 4 + 48) x 5 layers x 4 kv heads x 8 dims x 2 (K, V) x 2 bytes, rounded
  // up to whole blocks of 16: 4 blocks = 64 tokens x 640 B.
  EXPECT_EQ(stats["kv_bytes"].get<size_t>(), 64u * 640u);
  EXPECT_EQ(stats["kv_bytes_per_token"].get<size_t>(), 640u);
  EXPECT_EQ(stats["kv_f32_row_bytes"].get<size_t>(), 0u);
  EXPECT_EQ(stats["kv_peak_bytes"].get<size_t>(), 64u * 640u);  // the full cache only grows
  EXPECT_EQ(stats["config"]["layout"], "paged");
  EXPECT_EQ(stats["config"]["k_codec"], "f16");
}

TEST(Cli, GenerateCountsTheF32RowsApartFromTheBlocks) {
  const std::string args =
      "generate --model " + kModel + " --prompt 'Once upon a time' -n 48 " + "--temp 0 --sinks 4";
  const CommandResult r = RunCli(args + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto stats = nlohmann::json::parse(r.err);
  // 4 sink rows per layer, K and V, of 4 kv heads x 8 F32 dims: 5 x 2 x 4 x 4 x 8 x 4 bytes,
  // beside the same 4 blocks as without sinks.
  EXPECT_EQ(stats["kv_f32_row_bytes"].get<size_t>(), 5u * 2 * 4 * 4 * 8 * 4);
  EXPECT_EQ(stats["kv_bytes"].get<size_t>(), 64u * 640u + 5u * 2 * 4 * 4 * 8 * 4);
  const CommandResult line = RunCli(args);
  ASSERT_EQ(line.exit_code, 0) << line.err;
  EXPECT_NE(line.err.find("KV 46080 bytes in use (at most 46080): 40960 in blocks (640.00 "
                          "B/token, "),
            std::string::npos)
      << line.err;
  EXPECT_NE(line.err.find(", 5120 in F32 sink and recent rows |"), std::string::npos) << line.err;
}

// An evicting cache ends with what its budget keeps, but held more in between: the newest
// token before the policy trims it back.
TEST(Cli, GenerateReportsThePeakAnEvictingCacheReached) {
  const CommandResult r = RunCli("generate --model " + kModel +
                                 " --prompt 'Once upon a time' -n 48 --temp 0 --policy window "
                                 "--budget 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto stats = nlohmann::json::parse(r.err);
  // 16 tokens kept: one block of 16 x 640 B; 17 before each trim: two.
  EXPECT_EQ(stats["kv_bytes"].get<size_t>(), 16u * 640u);
  EXPECT_EQ(stats["kv_peak_bytes"].get<size_t>(), 32u * 640u);
}

TEST(Cli, GenerateWithPromptFileTomlConfigAndSampling) {
  const std::string dir = ScratchDir();
  std::ofstream(dir + "/prompt.txt") << "The cat";
  std::ofstream(dir + "/kv.toml") << "[kv]\nlayout = \"ring\"\ncapacity = 40\nk_codec = \"bf16\"\n";
  const CommandResult r = RunCli("generate -m " + kModel + " --prompt-file " + dir +
                                 "/prompt.txt -n 60 --temp 0.8 --top-k 40 --top-p 0.9 --seed 3 "
                                 "--kv-config " +
                                 dir + "/kv.toml --v-codec f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("The cat", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), 40u);
  EXPECT_NE(r.err.find("layout=ring"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("k=bf16"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("v=f32"), std::string::npos) << r.err;
  // Same seed, same text.
  const CommandResult again = RunCli("generate -m " + kModel + " --prompt-file " + dir +
                                     "/prompt.txt -n 60 --temp 0.8 --top-k 40 --top-p 0.9 "
                                     "--seed 3 --kv-config " +
                                     dir + "/kv.toml --v-codec f32");
  EXPECT_EQ(again.out, r.out);
}

// The first 20,000 characters of the real text in a scratch file: a slice keeps the perplexity
// runs quick (the full-file figure is checked in model_e2e_test).
std::string TextSlice() {
  const std::string path = ScratchDir() + "/slice.txt";
  std::ofstream(path) << Slurp(kShared + "/data/tinystories_valid_head256k.txt").substr(0, 20000);
  return path;
}

TEST(Cli, PerplexityJson) {
  const CommandResult r = RunCli("perplexity -m " + kModel + " -f " + TextSlice() +
                                 " --ctx 256 --batch 64 --layout contiguous --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  EXPECT_GT(result["ppl"].get<double>(), 2.0);
  EXPECT_LT(result["ppl"].get<double>(), 8.0);
  EXPECT_GT(result["ppl_stderr"].get<double>(), 0.0);
  EXPECT_EQ(result["tokens_scored"].get<int>() % 127, 0);
  EXPECT_EQ(result["config"]["layout"], "contiguous");
  // F16 K and V: 256 tokens x 5 layers x 4 kv heads x 8 dims x 2 x 2 bytes, 16 bits each.
  EXPECT_EQ(result["peak_cache_bytes"], 256 * 5 * 4 * 8 * 2 * 2);
  EXPECT_EQ(result["bits_at_ctx"], 16.0);
}

// With no --block-size, the paged blocks are sized to the codecs' units: KIVI-2 keys of 32
// tokens get blocks of 32, and the run reports the size it used.
TEST(Cli, DefaultBlockSizeFitsTheCodecsUnits) {
  const CommandResult r = RunCli("perplexity -m " + kModel + " -f " + TextSlice() +
                                 " --ctx 256 --k-codec kivi2 --v-codec kivi2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  EXPECT_EQ(result["config"]["block_size"], 32);
  EXPECT_EQ(result["config"]["k_codec"], "kivi2");
  // 4.5 bits per element in the blocks, plus room for a 32-token unit still filling in F32:
  // 32 bits for 32 of the 256 tokens.
  EXPECT_DOUBLE_EQ(result["bits_at_ctx"].get<double>(), 4.5 + 32.0 * 32 / 256);
  EXPECT_GT(result["ppl"].get<double>(), 2.0);
  EXPECT_LT(result["ppl"].get<double>(), 12.0);
}

// bench on the real model at two small depths: every figure present and positive, and the
// cache's peak bytes those of depth + decode tokens in whole blocks of 16 (F16: 640 B a token).
TEST(Cli, BenchReportsSpeedBandwidthAndPeakCacheBytesPerDepth) {
  const CommandResult r = RunCli("bench -m " + kModel +
                                 " --depths 64,256 --decode 4 --bandwidth-mib 16 --threads 2 "
                                 "--json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  EXPECT_GT(result["bandwidth_bytes_per_s"].get<double>(), 0);
  const auto& depths = result["depths"];
  ASSERT_EQ(depths.size(), 2u);
  EXPECT_EQ(depths[0]["depth"], 64);
  EXPECT_EQ(depths[1]["depth"], 256);
  for (const auto& depth : depths) {
    for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "step_ms",
                            "attention_ms", "cache_bytes_per_step"}) {
      EXPECT_GT(depth[key].get<double>(), 0) << key;
    }
  }
  EXPECT_EQ(depths[0]["peak_cache_bytes"], 80 * 640);   // 68 tokens
  EXPECT_EQ(depths[1]["peak_cache_bytes"], 272 * 640);  // 260 tokens
  // Every decode step reads the whole cache: a deeper one reads more.
  EXPECT_GT(depths[1]["cache_bytes_per_step"].get<double>(),
            depths[0]["cache_bytes_per_step"].get<double>());
}

TEST(Cli, InspectShowsMetadataAndTensors) {
  const CommandResult r = RunCli("inspect " + kModel);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama.block_count"), std::string::npos);
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos);
  EXPECT_NE(r.out.find("8 heads, 4 kv heads, head_dim 8"), std::string::npos) << r.out;
}

TEST(Cli, MakeModelWritesALoadableModel) {
  const std::string path = ScratchDir() + "/tiny.gguf";
  CommandResult r = RunCli("make-model --out " + path +
                           " --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 300 "
                           "--context 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli("generate -m " + path + " -p 'hello' -n 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCli("inspect " + path);
  EXPECT_NE(r.out.find("2 layers, dim 64, 4 heads, 2 kv heads, head_dim 16"), std::string::npos)
      << r.out;
}

TEST(Cli, EverySubcommandHasHelp) {
  for (const char* sub : {"generate", "perplexity", "inspect", "make-model", "bench"}) {
    const CommandResult r = RunCli(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
}

// Bad input: exit code non-zero, exactly one line on stderr naming the problem, and nothing
// on stdout (no partial output).
void ExpectOneLineError(const std::string& args, const std::string& needle) {
  const CommandResult r = RunCli(args);
  EXPECT_NE(r.exit_code, 0) << args;
  EXPECT_LT(r.exit_code, 128) << "crashed: " << args;
  EXPECT_EQ(Lines(r.err), 1) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.out, "") << args;
}

TEST(Cli, BadInputGetsOneClearLine) {
  ExpectOneLineError("generate -m /nonexistent.gguf -p hi", "/nonexistent.gguf");
  ExpectOneLineError("generate -m " + kModel + " -p hi --k-codec int3", "int3");
  ExpectOneLineError("generate -m " + kModel + " -p hi --layout spiral", "spiral");
  ExpectOneLineError("generate -m " + kModel + " -p hi --block-size -1", "block_size");
  ExpectOneLineError("generate -m " + kModel + " -p hi --k-codec kivi2 --block-size 16",
                     "allowed: a multiple of 32");
  ExpectOneLineError("generate -m " + kModel + " -p hi --temp -1", "temperature");
  ExpectOneLineError("generate -m " + kModel + " -p hi --top-p 0", "top_p");
  ExpectOneLineError("generate -m " + kModel + " -p hi --top-k -1", "top_k");
  ExpectOneLineError("generate -m " + kModel + " -p hi -n -5", "--n-predict must be >= 0");
  ExpectOneLineError("generate -m " + kModel + " -p hi -n 2147483647", "--n-predict 2147483647");
  ExpectOneLineError("generate -m " + kModel, "--prompt");
  ExpectOneLineError("generate -m " + kModel + " -p hi --kv-config /nonexistent.toml",
                     "/nonexistent.toml");
  ExpectOneLineError("perplexity -m " + kModel + " -f /nonexistent.txt", "/nonexistent.txt");
  ExpectOneLineError("perplexity -m " + kModel + " -f " + kModel + " --ctx 2", "--ctx");
  // A window or stream longer than the text: refused before a cache that long is allocated.
  const std::string text = " -f " + kShared + "/data/tinystories_valid_head256k.txt";
  ExpectOneLineError("perplexity -m " + kModel + text + " --ctx 99999999",
                     "fewer than one window of --ctx 99999999");
  ExpectOneLineError("sweep -m " + kModel + text + " --ctx 99999999",
                     "fewer than one window of --ctx 99999999");
  ExpectOneLineError("sweep -m " + kModel + text + " --stream 99999999",
                     "fewer than --stream 99999999");
  ExpectOneLineError("inspect " + std::string(KVS_SOURCE_DIR) + "/CMakeLists.txt", "gguf");
  ExpectOneLineError("frobnicate", "frobnicate");
}

}  // namespace
