// Tests of KvConfig: the one-line description, layout names, validation of every field, and
// TOML parsing (top level and [kv], unknown keys, wrong types, syntax errors, files).
#include "kvstack/kv_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "support/scratch_dir.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

KvConfig::LayerCodecs Override(int layer_idx, std::string k_codec, std::string v_codec) {
  KvConfig::LayerCodecs entry;
  entry.layer_idx = layer_idx;
  entry.k_codec = std::move(k_codec);
  entry.v_codec = std::move(v_codec);
  return entry;
}

TEST(KvConfigTest, ToStringNamesEveryField) {
  KvConfig config;
  config.capacity = 512;
  EXPECT_EQ(config.ToString(),
            "layout=paged block_size=auto k=f16 v=f16 capacity=512 max_sequences=1 policy=full");
  config.block_size = 16;
  config.layout = LayoutKind::kRing;
  config.k_codec = "f32";
  config.v_codec = "bf16";
  config.max_sequences = 3;
  EXPECT_EQ(config.ToString(),
            "layout=ring block_size=16 k=f32 v=bf16 capacity=512 max_sequences=3 policy=full");
}

TEST(KvConfigTest, LayoutNamesRoundTrip) {
  for (const LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged, LayoutKind::kRing}) {
    auto parsed = ParseLayout(LayoutName(layout));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, layout);
  }
  EXPECT_EQ(LayoutName(LayoutKind::kContiguous), "contiguous");
  auto bad = ParseLayout("pagd");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Message(bad.status()), "unknown layout 'pagd'; allowed: contiguous, paged, ring");
}

TEST(KvConfigTest, DefaultsAreValid) { EXPECT_TRUE(ValidateKvConfig(KvConfig{}).ok()); }

TEST(KvConfigTest, ValidationNamesFieldAndAllowedValues) {
  struct Case {
    void (*mutate)(KvConfig*);
    const char* expected;
  };
  const Case cases[] = {
      {[](KvConfig* c) { c->block_size = -1; },
       "block_size -1 is out of range; allowed: 0 (sized to the codecs' units) or 1..65536"},
      {[](KvConfig* c) { c->block_size = 65537; }, "block_size 65537"},
      {[](KvConfig* c) { c->k_codec = "int4x"; }, "k_codec 'int4x' is invalid"},
      {[](KvConfig* c) { c->k_codec = "int4x"; }, "allowed: f32"},
      {[](KvConfig* c) { c->v_codec = ""; }, "v_codec '' is invalid"},
      {[](KvConfig* c) { c->capacity = -1; }, "capacity -1 is negative"},
      {[](KvConfig* c) { c->max_sequences = 0; },
       "max_sequences 0 is out of range; allowed: 1..4096"},
      {[](KvConfig* c) { c->max_sequences = 4097; }, "max_sequences 4097"},
      {[](KvConfig* c) { c->policy = "none"; }, "policy 'none' is unknown; allowed: full"},
      {[](KvConfig* c) { c->layout = static_cast<LayoutKind>(7); }, "layout value 7 is invalid"},
      {[](KvConfig* c) { c->sink_tokens = -1; },
       "sink_tokens -1 is out of range; allowed: 0..65536"},
      {[](KvConfig* c) { c->sink_tokens = 65537; }, "sink_tokens 65537"},
      {[](KvConfig* c) { c->layer_codecs = {Override(-1, "f32", "")}; },
       "layer_codecs[layer -1] has a negative layer index; allowed: layer_idx >= 0"},
      {[](KvConfig* c) {
         c->layer_codecs = {Override(2, "f32", ""), Override(2, "", "f32")};
       },
       "layer 2 has two overrides; allowed: one"},
      {[](KvConfig* c) { c->layer_codecs = {Override(1, "", "f17")}; },
       "layer_codecs[layer 1].v_codec 'f17' is invalid"},
      {[](KvConfig* c) { c->layer_codecs = {Override(0, "x", "")}; },
       "layer_codecs[layer 0].k_codec 'x' is invalid"},
  };
  for (const Case& c : cases) {
    KvConfig config;
    c.mutate(&config);
    const absl::Status status = ValidateKvConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(Message(status), HasSubstr(c.expected));
  }
  KvConfig edge;
  edge.block_size = 65536;
  edge.max_sequences = 4096;
  edge.capacity = 0;
  edge.sink_tokens = 65536;
  edge.layer_codecs = {Override(0, "bf16", ""), Override(7, "", "")};
  EXPECT_TRUE(ValidateKvConfig(edge).ok());
}

TEST(KvConfigTest, LayerOverridesReplaceOnlyWhatTheyName) {
  KvConfig config;
  config.k_codec = "f16";
  config.v_codec = "bf16";
  config.layer_codecs = {Override(1, "f32", ""), Override(3, "", "f32")};
  EXPECT_EQ(config.KCodecOf(0), "f16");
  EXPECT_EQ(config.VCodecOf(0), "bf16");
  EXPECT_EQ(config.KCodecOf(1), "f32");
  EXPECT_EQ(config.VCodecOf(1), "bf16");
  EXPECT_EQ(config.KCodecOf(3), "f16");
  EXPECT_EQ(config.VCodecOf(3), "f32");
}

TEST(KvConfigTest, HeadOverridesWinOverTheirLayersForWhatTheyName) {
  KvConfig config;
  config.k_codec = "f16";
  config.v_codec = "bf16";
  config.layer_codecs = {Override(1, "int8", "")};
  config.head_codecs = {{.layer_idx = 1, .kv_head = 2, .k_codec = "f32", .v_codec = ""},
                        {.layer_idx = 0, .kv_head = 0, .k_codec = "", .v_codec = "int4"}};
  EXPECT_EQ(config.KCodecOf(1, 2), "f32");
  EXPECT_EQ(config.VCodecOf(1, 2), "bf16");
  EXPECT_EQ(config.KCodecOf(1, 0), "int8");  // another head: the layer's override
  EXPECT_EQ(config.KCodecOf(0, 0), "f16");
  EXPECT_EQ(config.VCodecOf(0, 0), "int4");
  EXPECT_EQ(config.VCodecOf(0, 1), "bf16");
  EXPECT_EQ(config.ToString().substr(config.ToString().find(" layer.1=")),
            " layer.1=int8/bf16 head.1.2=f32/bf16 head.0.0=f16/int4");
  EXPECT_TRUE(ValidateKvConfig(config).ok());
}

TEST(KvConfigTest, HeadOverridesAreValidated) {
  struct Case {
    KvConfig::HeadCodecs head;
    std::string k_codec;  // the layers'
    const char* expected;
  };
  const Case cases[] = {
      {{.layer_idx = 0, .kv_head = -1, .k_codec = "int8", .v_codec = ""}, "f16", "negative index"},
      {{.layer_idx = 0, .kv_head = 0, .k_codec = "", .v_codec = ""}, "f16", "names no codec"},
      {{.layer_idx = 2, .kv_head = 1, .k_codec = "", .v_codec = "int5"},
       "f16",
       "head_codecs[layer 2 head 1].v_codec 'int5' is invalid"},
      {{.layer_idx = 0, .kv_head = 0, .k_codec = "latent-r4", .v_codec = "latent-r4"},
       "f16",
       "latent codecs per layer only"},
      {{.layer_idx = 0, .kv_head = 0, .k_codec = "int8", .v_codec = ""},
       "latent-r4",
       "layer 0 is latent ('latent-r4')"},
  };
  for (const Case& c : cases) {
    KvConfig config;
    config.k_codec = config.v_codec = c.k_codec;
    config.head_codecs = {c.head};
    const absl::Status status = ValidateKvConfig(config);
    ASSERT_FALSE(status.ok()) << c.expected;
    EXPECT_THAT(Message(status), HasSubstr(c.expected));
  }
  KvConfig twice;
  twice.head_codecs = {{.layer_idx = 1, .kv_head = 1, .k_codec = "int8", .v_codec = ""},
                       {.layer_idx = 1, .kv_head = 1, .k_codec = "", .v_codec = "int8"}};
  EXPECT_THAT(Message(ValidateKvConfig(twice)), HasSubstr("kv head 1 of layer 1 has two"));
}

TEST(KvConfigTest, ToStringAddsSinksHadamardAndOverridesOnlyWhenSet) {
  KvConfig config;
  config.capacity = 64;
  const std::string plain = config.ToString();
  config.sink_tokens = 4;
  config.hadamard_keys = true;
  config.layer_codecs = {Override(0, "f32", ""), Override(5, "", "bf16")};
  EXPECT_EQ(config.ToString(), plain + " sinks=4 hadamard layer.0=f32/f16 layer.5=f16/bf16");
}

TEST(KvConfigTomlTest, TopLevelKeys) {
  auto config = ParseKvConfigToml(R"(
layout = "contiguous"
block_size = 32
k_codec = "f32"
v_codec = "bf16"
capacity = 1024
max_sequences = 4
policy = "full"
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ToString(),
            "layout=contiguous block_size=32 k=f32 v=bf16 capacity=1024 max_sequences=4 "
            "policy=full");
}

TEST(KvConfigTomlTest, KvTableAndDefaults) {
  auto config = ParseKvConfigToml("[kv]\nlayout = \"ring\"\ncapacity = 64\n");
  ASSERT_TRUE(config.ok()) << config.status();
  KvConfig expected;
  expected.layout = LayoutKind::kRing;
  expected.capacity = 64;
  EXPECT_EQ(config->ToString(), expected.ToString());

  auto empty = ParseKvConfigToml("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->ToString(), KvConfig{}.ToString());
}

TEST(KvConfigTomlTest, KeySetTwiceIsAnError) {
  auto config = ParseKvConfigToml("block_size = 8\n[kv]\nblock_size = 16\n");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()), HasSubstr("'block_size' is set both"));
}

TEST(KvConfigTomlTest, UnknownKeyNamesItAndListsAllowed) {
  for (const char* text : {"blocksize = 8\n", "[kv]\nblocksize = 8\n"}) {
    auto config = ParseKvConfigToml(text);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(config.status()),
                HasSubstr("unknown key 'blocksize'; allowed: layout, block_size, k_codec, "
                          "v_codec, capacity, max_sequences, policy, sink_tokens, "
                          "hadamard_keys, layer"));
  }
}

TEST(KvConfigTomlTest, WrongTypeNamesKeyAndExpectedType) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"block_size = \"16\"", "key 'block_size' must be an integer"},
      {"capacity = 1.5", "key 'capacity' must be an integer"},
      {"max_sequences = true", "key 'max_sequences' must be an integer"},
      {"k_codec = 16", "key 'k_codec' must be a string"},
      {"layout = [\"paged\"]", "key 'layout' must be a string"},
      {"policy = 1", "key 'policy' must be a string"},
      {"kv = 3", "key 'kv' must be a table"},
      {"sink_tokens = \"4\"", "key 'sink_tokens' must be an integer"},
      {"hadamard_keys = 1", "key 'hadamard_keys' must be a boolean"},
      {"layer = 1", "key 'layer' must be a table of [layer.N] tables"},
      {"[kv.layer]\n0 = \"f32\"", "key 'layer.0' must be a table"},
      {"[kv.layer.0]\nk_codec = 4", "key 'layer.0.k_codec' must be a string"},
      {"[kv.layer.0]\nkcodec = \"f32\"", "unknown key 'layer.0.kcodec'; allowed: k_codec, v_codec"},
      {"[kv.layer.x1]\nk_codec = \"f32\"", "[layer.x1] is not a layer index"},
      {"[kv.layer.-1]\nk_codec = \"f32\"", "[layer.-1] is not a layer index"},
      {"[kv.layer.0]\nhead = 1", "key 'layer.0.head' must be a table of [layer.0.head.H] tables"},
      {"[kv.layer.0.head]\n1 = \"int8\"", "key 'layer.0.head.1' must be a table"},
      {"[kv.layer.0.head.x]\nk_codec = \"f32\"", "[layer.0.head.x] is not a kv head index"},
      {"[kv.layer.1.head.0]\npolicy = \"h2o\"",
       "unknown key 'layer.1.head.0.policy'; allowed: k_codec, v_codec"},
      {"[kv.layer.1.head.0]\nv_codec = 8", "key 'layer.1.head.0.v_codec' must be a string"},
      {"block_size = 9999999999", "key 'block_size' = 9999999999 does not fit"},
  };
  for (const Case& c : cases) {
    auto config = ParseKvConfigToml(c.text);
    ASSERT_FALSE(config.ok()) << c.text;
    EXPECT_THAT(Message(config.status()), HasSubstr(c.expected)) << c.text;
  }
}

TEST(KvConfigTomlTest, ParsedValuesAreValidated) {
  auto layout = ParseKvConfigToml("layout = \"tree\"");
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(Message(layout.status()), HasSubstr("unknown layout 'tree'"));
  auto codec = ParseKvConfigToml("v_codec = \"f8\"");
  ASSERT_FALSE(codec.ok());
  EXPECT_THAT(Message(codec.status()), HasSubstr("v_codec 'f8' is invalid"));
  auto sinks = ParseKvConfigToml("sink_tokens = 70000");
  ASSERT_FALSE(sinks.ok());
  EXPECT_THAT(Message(sinks.status()), HasSubstr("sink_tokens 70000 is out of range"));
  auto layer = ParseKvConfigToml("[kv.layer.3]\nv_codec = \"f8\"");
  ASSERT_FALSE(layer.ok());
  EXPECT_THAT(Message(layer.status()), HasSubstr("layer_codecs[layer 3].v_codec 'f8' is invalid"));
}

TEST(KvConfigTomlTest, SinksHadamardAndLayerTables) {
  auto config = ParseKvConfigToml(R"(
[kv]
k_codec = "f16"
sink_tokens = 4
hadamard_keys = true
[kv.layer.2]
k_codec = "f32"
v_codec = "bf16"
[kv.layer.10]
v_codec = "f32"
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sink_tokens, 4);
  EXPECT_TRUE(config->hadamard_keys);
  ASSERT_EQ(config->layer_codecs.size(), 2u);
  EXPECT_EQ(config->KCodecOf(2), "f32");
  EXPECT_EQ(config->VCodecOf(2), "bf16");
  EXPECT_EQ(config->KCodecOf(10), "f16");
  EXPECT_EQ(config->VCodecOf(10), "f32");
  EXPECT_EQ(config->KCodecOf(0), "f16");
  // Top level works as for every other key.
  auto top = ParseKvConfigToml("sink_tokens = 2\n[layer.1]\nk_codec = \"bf16\"\n");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->sink_tokens, 2);
  EXPECT_EQ(top->KCodecOf(1), "bf16");
}

TEST(KvConfigTomlTest, HeadTablesInsideLayerTables) {
  auto config = ParseKvConfigToml(R"(
[kv]
k_codec = "int4"
v_codec = "int4"
[kv.layer.2]
v_codec = "int8"
[kv.layer.2.head.1]
k_codec = "int8"
[kv.layer.3.head.0]
k_codec = "bf16"
v_codec = "f16"
)");
  ASSERT_TRUE(config.ok()) << config.status();
  // Layer 3's table holds only a head table: it overrides nothing of the layer itself.
  ASSERT_EQ(config->layer_codecs.size(), 1u);
  ASSERT_EQ(config->head_codecs.size(), 2u);
  EXPECT_EQ(config->KCodecOf(2, 1), "int8");
  EXPECT_EQ(config->VCodecOf(2, 1), "int8");  // the layer's
  EXPECT_EQ(config->KCodecOf(2, 0), "int4");
  EXPECT_EQ(config->KCodecOf(3, 0), "bf16");
  EXPECT_EQ(config->VCodecOf(3, 0), "f16");
  EXPECT_EQ(config->VCodecOf(3, 1), "int4");
  auto bad = ParseKvConfigToml("[kv.layer.0.head.0]\nk_codec = \"int3\"");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Message(bad.status()), HasSubstr("head_codecs[layer 0 head 0].k_codec 'int3'"));
}

TEST(KvConfigTomlTest, SyntaxErrorIsAStatusWithLocation) {
  auto config = ParseKvConfigToml("layout = \"paged\"\nblock_size = = 3\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()), HasSubstr("<string>:2:"));
  EXPECT_THAT(Message(config.status()), HasSubstr("TOML syntax error"));
}

// The override lists in index order: TOML tables are keyed by index, so a document says
// nothing about the order the overrides were given in.
KvConfig SortedOverrides(KvConfig config) {
  std::sort(config.layer_codecs.begin(), config.layer_codecs.end(),
            [](const auto& a, const auto& b) { return a.layer_idx < b.layer_idx; });
  std::sort(config.head_codecs.begin(), config.head_codecs.end(), [](const auto& a, const auto& b) {
    return std::pair(a.layer_idx, a.kv_head) < std::pair(b.layer_idx, b.kv_head);
  });
  return config;
}

void ExpectTomlRoundTrip(const KvConfig& config) {
  ASSERT_TRUE(ValidateKvConfig(config).ok()) << ValidateKvConfig(config);
  const std::string toml = KvConfigToml(config);
  auto parsed = ParseKvConfigToml(toml);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << toml;
  EXPECT_EQ(SortedOverrides(*parsed), SortedOverrides(config)) << toml;
  EXPECT_EQ(SortedOverrides(*parsed).ToString(), SortedOverrides(config).ToString());
}

TEST(KvConfigTomlWriterTest, DefaultsRoundTrip) {
  ExpectTomlRoundTrip(KvConfig{});
  const std::string toml = KvConfigToml(KvConfig{});
  EXPECT_EQ(toml.substr(0, 5), "[kv]\n");
  EXPECT_THAT(toml, Not(HasSubstr("budget = \"")));  // an unset budget is not written
}

TEST(KvConfigTomlWriterTest, EveryFieldChangedRoundTrips) {
  KvConfig config;
  config.layout = LayoutKind::kContiguous;
  config.block_size = 64;
  config.k_codec = "kivi2-g32";
  config.v_codec = "int2-g16";
  config.capacity = 4096;
  config.max_sequences = 3;
  config.policy = "snapkv";
  config.budget = {KvBudget::Kind::kTokens, 256};
  config.layer_budget = "pyramid";
  config.head_budget = "adaptive";
  config.evict_step = 4;
  config.policy_sinks = 2;
  config.policy_recent = 8;
  config.observation_window = 16;
  config.pool_kernel = 5;
  config.score_aggregation = "mean";
  config.sink_tokens = 4;
  config.recent_tokens = 64;
  config.hadamard_keys = true;
  // A path needing every kind of escape TOML has: quotes, backslashes, a newline, non-ASCII.
  config.profile = "/tmp/a \"quoted\" dir\\x\nnext line é.kvsprof";
  // Layers and heads out of order, and indices whose text sorts differently from their value.
  config.layer_codecs = {{.layer_idx = 10, .k_codec = "int8", .v_codec = "", .policy = ""},
                         {.layer_idx = 2, .k_codec = "", .v_codec = "f16", .policy = "full"}};
  config.head_codecs = {{.layer_idx = 2, .kv_head = 1, .k_codec = "bf16", .v_codec = ""},
                        {.layer_idx = 11, .kv_head = 0, .k_codec = "", .v_codec = "int4-g8"},
                        {.layer_idx = 2, .kv_head = 0, .k_codec = "fp8_e4m3", .v_codec = "int8"}};
  ExpectTomlRoundTrip(config);
}

TEST(KvConfigTomlWriterTest, EveryBudgetKindRoundTripsExactly) {
  KvConfig config;
  config.policy = "h2o";
  for (const KvBudget budget :
       {KvBudget{KvBudget::Kind::kTokens, 1}, KvBudget{KvBudget::Kind::kTokens, 65536},
        KvBudget{KvBudget::Kind::kFraction, 1.0 / 3.0}, KvBudget{KvBudget::Kind::kFraction, 0.1},
        KvBudget{KvBudget::Kind::kFraction, 1.0}, KvBudget{KvBudget::Kind::kBytes, 65536},
        KvBudget{KvBudget::Kind::kBytes, 1000003}}) {
    config.budget = budget;
    SCOPED_TRACE(budget.ToString());
    ExpectTomlRoundTrip(config);
  }
}

TEST(KvConfigTomlWriterTest, DuoAndReassignedPositionsRoundTrip) {
  KvConfig config;
  config.layout = LayoutKind::kRing;
  config.policy = "duo";
  config.budget = {KvBudget::Kind::kFraction, 0.25};
  config.head_profile = "../shared/heads.kvsheads";
  config.retrieval_fraction = 0.1;
  ExpectTomlRoundTrip(config);
  config.policy = "streaming";
  config.positions = "reassign";
  config.layer_codecs = {{.layer_idx = 0, .k_codec = "", .v_codec = "", .policy = "full"}};
  ExpectTomlRoundTrip(config);
}

TEST(KvConfigFileTest, LoadsFileAndNamesPathInErrors) {
  const std::string path = testing_support::ScratchDir() + "/kv_config_test.toml";
  {
    std::ofstream out(path);
    out << "[kv]\nlayout = \"paged\"\nblock_size = 8\ncapacity = 128\n";
  }
  auto config = LoadKvConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->block_size, 8);
  EXPECT_EQ(config->capacity, 128);

  {
    std::ofstream out(path);
    out << "capacity = -5\n";
  }
  auto invalid = LoadKvConfigFile(path);
  ASSERT_FALSE(invalid.ok());
  EXPECT_THAT(Message(invalid.status()), HasSubstr(path));
  EXPECT_THAT(Message(invalid.status()), HasSubstr("capacity -5"));
  std::remove(path.c_str());

  auto missing = LoadKvConfigFile(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr(path));
}

}  // namespace
}  // namespace kvstack
