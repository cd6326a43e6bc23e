// Tests of KvConfig: the one-line description, layout names, validation of every field, and
// TOML parsing (top level and [kv], unknown keys, wrong types, syntax errors, files).
#include "kvstack/kv_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvstack {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(KvConfigTest, ToStringNamesEveryField) {
  KvConfig config;
  config.capacity = 512;
  EXPECT_EQ(config.ToString(),
            "layout=paged block_size=16 k=f16 v=f16 capacity=512 max_sequences=1 policy=full");
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
      {[](KvConfig* c) { c->block_size = 0; }, "block_size 0 is out of range; allowed: 1..65536"},
      {[](KvConfig* c) { c->block_size = 65537; }, "block_size 65537"},
      {[](KvConfig* c) { c->k_codec = "int4x"; }, "k_codec 'int4x' is unknown; allowed: f32"},
      {[](KvConfig* c) { c->v_codec = ""; }, "v_codec '' is unknown"},
      {[](KvConfig* c) { c->capacity = -1; }, "capacity -1 is negative"},
      {[](KvConfig* c) { c->max_sequences = 0; },
       "max_sequences 0 is out of range; allowed: 1..4096"},
      {[](KvConfig* c) { c->max_sequences = 4097; }, "max_sequences 4097"},
      {[](KvConfig* c) { c->policy = "none"; }, "policy 'none' is unknown; allowed: full"},
      {[](KvConfig* c) { c->layout = static_cast<LayoutKind>(7); }, "layout value 7 is invalid"},
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
  EXPECT_TRUE(ValidateKvConfig(edge).ok());
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
                          "v_codec, capacity, max_sequences, policy"));
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
  EXPECT_THAT(Message(codec.status()), HasSubstr("v_codec 'f8' is unknown"));
}

TEST(KvConfigTomlTest, SyntaxErrorIsAStatusWithLocation) {
  auto config = ParseKvConfigToml("layout = \"paged\"\nblock_size = = 3\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()), HasSubstr("<string>:2:"));
  EXPECT_THAT(Message(config.status()), HasSubstr("TOML syntax error"));
}

TEST(KvConfigFileTest, LoadsFileAndNamesPathInErrors) {
  const std::string path = ::testing::TempDir() + "kv_config_test.toml";
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
