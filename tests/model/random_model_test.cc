// Tests for WriteRandomLlamaModel: the file loads as a llama model with the spec's shape, has
// the keys llama.cpp needs, its vocabulary and weights look as documented, the same spec gives
// the same bytes, and invalid specs are rejected naming the field.
#include "kvstack/random_model.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstack/gguf.h"
#include "kvstack/model.h"
#include "kvstack/numeric.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

RandomModelSpec TinySpec() {
  RandomModelSpec s;
  s.num_layers = 2;
  s.dim = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.ffn_dim = 96;
  s.vocab_size = 300;
  s.context_length = 4096;
  return s;
}

TEST(RandomModelTest, WritesALoadableLlamaModel) {
  const RandomModelSpec spec = TinySpec();
  const std::string path = TempPath("random_tiny");
  ASSERT_TRUE(WriteRandomLlamaModel(spec, path).ok());
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaModel& m = **model;
  const LlamaHparams& h = m.hparams();
  EXPECT_EQ(h.num_layers, 2);
  EXPECT_EQ(h.dim, 64);
  EXPECT_EQ(h.num_heads, 4);
  EXPECT_EQ(h.num_kv_heads, 2);
  EXPECT_EQ(h.head_dim, 16);
  EXPECT_EQ(h.ffn_dim, 96);
  EXPECT_EQ(h.vocab_size, 300);
  EXPECT_EQ(h.context_length, 4096);
  EXPECT_EQ(h.rope_dim, 16);
  EXPECT_EQ(h.rope_style, RopeStyle::kNormal);
  EXPECT_EQ(m.tokenizer().bos_id(), 1);
  EXPECT_EQ(m.tokenizer().eos_id(), 2);

  // Every key llama.cpp reads to load a llama model is present.
  const GgufFile& g = m.gguf();
  for (const char* key :
       {"general.architecture", "general.name", "general.file_type", "llama.context_length",
        "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
        "llama.rope.dimension_count", "llama.attention.head_count", "llama.attention.head_count_kv",
        "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base", "tokenizer.ggml.model",
        "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id"}) {
    EXPECT_NE(g.Find(key), nullptr) << key;
  }
  EXPECT_EQ(*g.GetInt("general.file_type"), 1);
  const std::vector<std::string> tokens = *g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 300u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());
  const std::vector<int64_t> types = *g.GetIntArray("tokenizer.ggml.token_type");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[100], 6);
  EXPECT_EQ(types[299], 1);
  const std::vector<float> scores = *g.GetFloatArray("tokenizer.ggml.scores");
  EXPECT_EQ(scores[259], 0.0f);
  EXPECT_EQ(scores[260], -1.0f);

  // Weights: F16 matrices, untied output, F32 norms of 1, values within +-sqrt(3/cols) and
  // not all equal.
  EXPECT_NE(m.output().data, m.token_embedding().data);
  const WeightMatrix& w_down = m.layer(1).w_down;
  ASSERT_EQ(w_down.type, WeightType::kF16);
  const float bound = std::sqrt(3.0f / 96) * 1.001f;
  double sum_sq = 0;
  const auto* halfs = static_cast<const uint16_t*>(w_down.data);
  for (int i = 0; i < w_down.rows * w_down.cols; ++i) {
    const float v = F16ToF32(halfs[i]);
    ASSERT_LE(std::fabs(v), bound) << i;
    sum_sq += double{v} * v;
  }
  // Uniform on [-b, b] has variance b^2 / 3 = 1 / cols.
  EXPECT_NEAR(sum_sq / (w_down.rows * w_down.cols), 1.0 / 96, 0.2 / 96);
  for (float x : m.layer(0).ffn_norm) EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(g.FindTensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);
}

// The benchmark shape (~43 MB, about 0.2 s to write in a Release build).
TEST(RandomModelTest, DefaultSpecIsTheBenchmarkShape) {
  const std::string path = TempPath("random_default");
  ASSERT_TRUE(WriteRandomLlamaModel(RandomModelSpec{}, path).ok());
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaHparams& h = (*model)->hparams();
  EXPECT_EQ(h.num_layers, 8);
  EXPECT_EQ(h.dim, 512);
  EXPECT_EQ(h.num_heads, 8);
  EXPECT_EQ(h.num_kv_heads, 8);
  EXPECT_EQ(h.head_dim, 64);
  EXPECT_EQ(h.ffn_dim, 1024);
  EXPECT_EQ(h.vocab_size, 512);
  EXPECT_EQ(h.context_length, 16384);
  // F16 matrices (2 bytes per element) plus two F32 norms per layer and output_norm.
  const size_t matrix_elems = 2 * 512 * 512 + 8 * (4 * 512 * 512 + 3 * 512 * 1024);
  EXPECT_EQ((*model)->weight_bytes(), matrix_elems * 2 + (2 * 8 + 1) * 512 * sizeof(float));
}

TEST(RandomModelTest, F32SpecWritesF32Matrices) {
  RandomModelSpec spec = TinySpec();
  spec.f16 = false;
  spec.num_layers = 1;
  const std::string path = TempPath("random_f32");
  ASSERT_TRUE(WriteRandomLlamaModel(spec, path).ok());
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->layer(0).wq.type, WeightType::kF32);
  EXPECT_EQ(*(*model)->gguf().GetInt("general.file_type"), 0);
}

TEST(RandomModelTest, SameSpecSameBytesOtherSeedOtherBytes) {
  RandomModelSpec spec = TinySpec();
  spec.num_layers = 1;
  const std::string a = TempPath("random_a"), b = TempPath("random_b"), c = TempPath("random_c");
  ASSERT_TRUE(WriteRandomLlamaModel(spec, a).ok());
  ASSERT_TRUE(WriteRandomLlamaModel(spec, b).ok());
  spec.seed = 2;
  ASSERT_TRUE(WriteRandomLlamaModel(spec, c).ok());
  auto fa = GgufFile::Open(a), fb = GgufFile::Open(b), fc = GgufFile::Open(c);
  ASSERT_TRUE(fa.ok() && fb.ok() && fc.ok());
  EXPECT_EQ((*fa)->ContentHash(), (*fb)->ContentHash());
  EXPECT_NE((*fa)->ContentHash(), (*fc)->ContentHash());
  for (const std::string& p : {a, b, c}) std::filesystem::remove(p);
}

TEST(RandomModelTest, InvalidSpecsAreRejected) {
  const std::string path = TempPath("random_invalid");
  struct Case {
    std::function<void(RandomModelSpec&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](RandomModelSpec& s) { s.num_layers = 0; }, "num_layers is 0"},
      {[](RandomModelSpec& s) { s.ffn_dim = -1; }, "ffn_dim is -1"},
      {[](RandomModelSpec& s) { s.dim = 66; }, "dim 66 is not a multiple of num_heads 4"},
      {[](RandomModelSpec& s) { s.num_kv_heads = 3; }, "num_heads 4 is not a multiple of num_kv"},
      {[](RandomModelSpec& s) { s.vocab_size = 258; },
       "vocab_size is 258; it must be at least 259"},
  };
  for (const Case& c : cases) {
    RandomModelSpec spec = TinySpec();
    c.edit(spec);
    const absl::Status s = WriteRandomLlamaModel(spec, path);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expected));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  const absl::Status s = WriteRandomLlamaModel(TinySpec(), "/nonexistent-dir/x.gguf");
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-dir/x.gguf"));
}

}  // namespace
}  // namespace kvstack
