// Tests of the configuration evaluation behind `kvstack sweep`, on the real stories260K model
// and a few short perplexity windows of real text: the F32 configuration reproduces its
// reference exactly, lossy codecs give a small positive KL, sizes follow the codecs, and the
// Pareto frontier and the perplexity logits hook behave as their contracts say.
#include "run/evaluate.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace kvstack {
namespace {

const std::string kShared = KVS_SHARED_DIR;
constexpr int kCtx = 64;
constexpr int kMaxWindows = 3;
constexpr int kScoredPerWindow = kCtx - 1 - kCtx / 2;

class EvaluateTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = LlamaModel::Load(kShared + "/models/stories260K.gguf");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    std::ifstream in(kShared + "/data/tinystories_valid_head256k.txt", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    // More text than kMaxWindows windows, so that the limit is what stops the run.
    tokens_ = new std::vector<TokenId>(
        model_->tokenizer().Encode(text.str().substr(0, 4000), /*add_bos=*/true));
    ASSERT_GT(tokens_->size(), static_cast<size_t>(kCtx * (kMaxWindows + 1)));
    auto reference = RunReference(*model_, *tokens_, KvConfig{}, Options(), nullptr);
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = new ReferenceRun(*std::move(reference));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete tokens_;
    delete model_;
  }

  static EvaluateOptions Options() {
    EvaluateOptions options;
    options.ctx = kCtx;
    options.num_threads = 2;
    options.max_windows = kMaxWindows;
    options.decode_steps = 8;
    return options;
  }

  static KvConfig Codecs(const std::string& k, const std::string& v) {
    KvConfig config;
    config.k_codec = k;
    config.v_codec = v;
    return config;
  }

  static ConfigEvaluation Evaluate(const KvConfig& config) {
    auto result = EvaluateConfig(*model_, *tokens_, config, Options(), *reference_, nullptr);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ConfigEvaluation{};
  }

  static LlamaModel* model_;
  static std::vector<TokenId>* tokens_;
  static ReferenceRun* reference_;
};

LlamaModel* EvaluateTest::model_ = nullptr;
std::vector<TokenId>* EvaluateTest::tokens_ = nullptr;
ReferenceRun* EvaluateTest::reference_ = nullptr;

TEST_F(EvaluateTest, ReferenceHoldsOneNormalisedRowPerScoredPosition) {
  const int64_t num_positions = kMaxWindows * kScoredPerWindow;
  const int vocab = model_->hparams().vocab_size;
  EXPECT_EQ(reference_->num_windows, kMaxWindows);
  EXPECT_EQ(reference_->perplexity.tokens_scored, num_positions);
  EXPECT_EQ(reference_->config.k_codec, "f32");
  EXPECT_EQ(reference_->config.v_codec, "f32");
  ASSERT_EQ(reference_->log_probs.size(), static_cast<size_t>(num_positions) * vocab);
  ASSERT_EQ(reference_->top1.size(), static_cast<size_t>(num_positions));
  for (int64_t pos_idx : {int64_t{0}, num_positions / 2, num_positions - 1}) {
    double total = 0;
    int32_t best = 0;
    for (int v = 0; v < vocab; ++v) {
      const float lp = reference_->log_probs[pos_idx * vocab + v];
      total += std::exp(static_cast<double>(lp));
      if (lp > reference_->log_probs[pos_idx * vocab + best]) best = v;
    }
    EXPECT_NEAR(total, 1.0, 1e-4) << pos_idx;
    EXPECT_EQ(reference_->top1[pos_idx], best) << pos_idx;
  }
}

TEST_F(EvaluateTest, F32ConfigReproducesTheReferenceExactly) {
  const ConfigEvaluation e = Evaluate(Codecs("f32", "f32"));
  EXPECT_LT(std::abs(e.mean_kl), 1e-9);
  EXPECT_EQ(e.top1_agreement, 1.0);
  EXPECT_EQ(e.ppl, reference_->perplexity.ppl);
  EXPECT_EQ(e.delta_ppl_pct, 0.0);
  EXPECT_EQ(e.tokens_scored, kMaxWindows * kScoredPerWindow);
  EXPECT_EQ(e.num_windows, kMaxWindows);
}

TEST_F(EvaluateTest, HalfPrecisionCodecsGiveSmallPositiveKlOrderedByPrecision) {
  const ConfigEvaluation f16 = Evaluate(Codecs("f16", "f16"));
  const ConfigEvaluation bf16 = Evaluate(Codecs("bf16", "bf16"));
  for (const ConfigEvaluation* e : {&f16, &bf16}) {
    EXPECT_GT(e->mean_kl, 0.0) << e->config.k_codec;
    EXPECT_LT(e->mean_kl, 1e-2) << e->config.k_codec;
    EXPECT_GT(e->top1_agreement, 0.9) << e->config.k_codec;
    EXPECT_LE(e->top1_agreement, 1.0) << e->config.k_codec;
    EXPECT_LT(std::abs(e->delta_ppl_pct), 5.0) << e->config.k_codec;
    EXPECT_NE(e->ppl, reference_->perplexity.ppl) << e->config.k_codec;
  }
  // BF16 keeps 8 significant bits to F16's 11, so it must lose more information.
  EXPECT_GT(bf16.mean_kl, f16.mean_kl);
}

TEST_F(EvaluateTest, DeltaPplIsRelativeToTheReference) {
  const ConfigEvaluation e = Evaluate(Codecs("bf16", "f32"));
  EXPECT_NEAR(e.delta_ppl_pct, 100.0 * (e.ppl / reference_->perplexity.ppl - 1.0), 1e-12);
  EXPECT_GE(e.mean_kl, 0.0);
}

TEST_F(EvaluateTest, SizesFollowTheCodecs) {
  const LlamaHparams& hp = model_->hparams();
  const double f16_bytes = 2.0 * 2 * hp.head_dim * hp.num_kv_heads;  // K and V, 2 bytes each
  const ConfigEvaluation f16 = Evaluate(Codecs("f16", "f16"));
  EXPECT_EQ(f16.bits_per_element, 16.0);
  EXPECT_EQ(f16.bytes_per_token_per_layer, f16_bytes);
  EXPECT_EQ(f16.compression_vs_f16, 1.0);

  const ConfigEvaluation mixed = Evaluate(Codecs("f32", "bf16"));
  EXPECT_EQ(mixed.bits_per_element, (32.0 + 16.0) / 2);
  EXPECT_EQ(mixed.bytes_per_token_per_layer, (4.0 + 2.0) * hp.head_dim * hp.num_kv_heads);
  EXPECT_DOUBLE_EQ(mixed.compression_vs_f16, 4.0 / 6.0);
}

TEST_F(EvaluateTest, SizesAverageOverLayersWhenLayerCodecsDiffer) {
  const LlamaHparams& hp = model_->hparams();
  ASSERT_GE(hp.num_layers, 2);
  KvConfig config = Codecs("f16", "f16");
  config.layer_codecs.push_back(
      {.layer_idx = 0, .k_codec = "f32", .v_codec = "", .policy = ""});  // layer 0: F32 keys only
  const ConfigEvaluation e = Evaluate(config);
  const int n = hp.num_layers;
  EXPECT_DOUBLE_EQ(e.bits_per_element, ((32.0 + 16.0) / 2 + 16.0 * (n - 1)) / n);
  EXPECT_DOUBLE_EQ(e.bytes_per_token_per_layer,
                   ((4.0 + 2.0) + 4.0 * (n - 1)) * hp.head_dim * hp.num_kv_heads / n);
}

TEST_F(EvaluateTest, BitsAtCtxCountTheBlocksInUseAndTheF32Rows) {
  const LlamaHparams& hp = model_->hparams();
  const size_t row_floats = static_cast<size_t>(hp.num_kv_heads) * hp.head_dim;
  const size_t f32_window_bytes = kCtx * hp.num_layers * 2 * row_floats * sizeof(float);
  EXPECT_EQ(reference_->perplexity.peak_cache_bytes, f32_window_bytes);

  KvConfig f16 = Codecs("f16", "f16");
  f16.block_size = 16;  // kCtx tokens fill whole blocks
  const ConfigEvaluation whole = Evaluate(f16);
  EXPECT_EQ(whole.peak_cache_bytes, f32_window_bytes / 2);
  EXPECT_EQ(whole.bits_at_ctx, 16.0);

  // With a recent window the newest tokens wait in F32 rows (room for the window plus one
  // unit, in every layer), on top of the blocks, which hold a slot for every token of the
  // sequence, the waiting ones' included.
  KvConfig windowed = Codecs("int8", "int8");
  windowed.block_size = 16;
  windowed.recent_tokens = 16;
  const ConfigEvaluation e = Evaluate(windowed);
  const size_t block_bytes =
      static_cast<size_t>(kCtx * e.bytes_per_token_per_layer) * hp.num_layers;
  const size_t f32_row_bytes = static_cast<size_t>(windowed.recent_tokens + 1) * hp.num_layers * 2 *
                               row_floats * 4;  // int8's unit: 1
  EXPECT_EQ(e.peak_cache_bytes, block_bytes + f32_row_bytes);
  EXPECT_DOUBLE_EQ(e.bits_at_ctx, BitsPerElementOfContext(hp, block_bytes + f32_row_bytes, kCtx));
  EXPECT_GT(e.bits_at_ctx, e.bits_per_element);
  EXPECT_EQ(e.memory_bits, e.bits_per_element);  // the encoded tokens' figure leaves them out
}

TEST(BitsPerElementOfContextTest, DividesBitsByTheKAndVElementsOfTheContext) {
  const LlamaHparams hp{.num_layers = 2, .num_heads = 3, .num_kv_heads = 3, .head_dim = 4};
  // 100 tokens x 2 layers x 3 heads x 4 dims x K and V = 4800 elements.
  EXPECT_DOUBLE_EQ(BitsPerElementOfContext(hp, 4800, 100), 8.0);
  EXPECT_DOUBLE_EQ(BitsPerElementOfContext(hp, 600, 100), 1.0);
  EXPECT_EQ(BitsPerElementOfContext(hp, 0, 100), 0.0);
}

TEST_F(EvaluateTest, DecodeAttentionIsTimed) {
  const ConfigEvaluation e = Evaluate(Codecs("f16", "f16"));
  EXPECT_GT(e.decode_attention_us_per_token, 0.0);
  EvaluateOptions options = Options();
  options.decode_steps = 0;
  auto untimed =
      EvaluateConfig(*model_, *tokens_, Codecs("f16", "f16"), options, *reference_, nullptr);
  ASSERT_TRUE(untimed.ok()) << untimed.status();
  EXPECT_EQ(untimed->decode_attention_us_per_token, 0.0);
}

TEST_F(EvaluateTest, RunsThatDoNotMatchTheReferenceAreRejected) {
  EvaluateOptions options = Options();
  options.max_windows = kMaxWindows - 1;
  auto fewer = EvaluateConfig(*model_, *tokens_, KvConfig{}, options, *reference_, nullptr);
  EXPECT_EQ(fewer.status().code(), absl::StatusCode::kInvalidArgument);
  options = Options();
  options.ctx = kCtx / 2;
  auto shorter = EvaluateConfig(*model_, *tokens_, KvConfig{}, options, *reference_, nullptr);
  EXPECT_EQ(shorter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shorter.status().message().find("ctx"), std::string::npos) << shorter.status();
}

TEST_F(EvaluateTest, UnknownCodecIsAnError) {
  auto result = EvaluateConfig(*model_, *tokens_, Codecs("f16", "no_such_codec"), Options(),
                               *reference_, nullptr);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("no_such_codec"), std::string::npos) << result.status();
}

TEST_F(EvaluateTest, CheckConfigCatchesWhatTheRunWouldRejectBeforeRunning) {
  EXPECT_TRUE(CheckConfig(*model_, Codecs("f16", "bf16"), Options()).ok());
  EXPECT_FALSE(CheckConfig(*model_, Codecs("f16", "no_such_codec"), Options()).ok());
  EvaluateOptions tiny = Options();
  tiny.ctx = 2;
  EXPECT_EQ(CheckConfig(*model_, Codecs("f16", "f16"), tiny).code(),
            absl::StatusCode::kInvalidArgument);
  // Only building the cache finds this one: KIVI keys come in units of 32 tokens, which
  // blocks of 16 cannot hold; blocks of 32 can.
  KvConfig kivi = Codecs("kivi2", "f16");
  kivi.block_size = 16;
  const absl::Status status = CheckConfig(*model_, kivi, Options());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("block_size"), std::string::npos) << status;
  kivi.block_size = 32;
  EXPECT_TRUE(CheckConfig(*model_, kivi, Options()).ok());
}

TEST_F(EvaluateTest, ProgressCountsWindows) {
  std::vector<std::pair<int, int>> calls;
  auto result = EvaluateConfig(*model_, *tokens_, Codecs("f16", "f16"), Options(), *reference_,
                               [&](int done, int total) { calls.emplace_back(done, total); });
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(calls.size(), static_cast<size_t>(kMaxWindows));
  EXPECT_EQ(calls.back(), std::make_pair(kMaxWindows, kMaxWindows));
}

// The hook Perplexity offers: one call per window, the logits of every position, and the
// limit on windows. Recomputing the NLL from the hook's logits must give Perplexity's figure.
TEST_F(EvaluateTest, PerplexityHookSeesEveryWindowsLogits) {
  EngineOptions engine_options;
  engine_options.context_tokens = kCtx;
  engine_options.num_threads = 2;
  auto engine = Engine::Create(*model_, engine_options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int vocab = model_->hparams().vocab_size;
  PerplexityOptions options;
  options.ctx = kCtx;
  options.max_windows = 2;
  std::vector<int> windows;
  double nll_sum = 0;
  options.on_window_logits = [&](int window_idx, std::span<const float> logits) {
    windows.push_back(window_idx);
    ASSERT_EQ(logits.size(), static_cast<size_t>(kCtx) * vocab);
    for (int j = kCtx / 2; j < kCtx - 1; ++j) {
      const std::span<const float> row = logits.subspan(static_cast<size_t>(j) * vocab, vocab);
      double sum = 0;
      for (float l : row) sum += std::exp(static_cast<double>(l));
      const TokenId target = (*tokens_)[static_cast<size_t>(window_idx) * kCtx + j + 1];
      nll_sum += std::log(sum) - row[target];
    }
  };
  auto result = Perplexity(**engine, *tokens_, options, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(windows, (std::vector<int>{0, 1}));
  EXPECT_EQ(result->num_windows, 2);
  EXPECT_NEAR(nll_sum / result->tokens_scored, result->mean_nll, 1e-6);

  options.max_windows = -1;
  EXPECT_EQ(Perplexity(**engine, *tokens_, options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParetoFrontierTest, KeepsFewestBitsForEachLoss) {
  //                          0     1    2    3    4     5
  const std::vector<double> bits = {16, 8, 4, 8, 2, 32};
  const std::vector<double> loss = {0.01, 0.5, 3, 0.4, 50, 0.02};
  // 1 is beaten by 3 (same bits, lower loss); 5 by 0 (fewer bits, lower loss).
  EXPECT_EQ(ParetoFrontier(bits, loss), (std::vector<int>{4, 2, 3, 0}));
}

TEST(ParetoFrontierTest, NegativeLossTiesAndEmptyInput) {
  // A configuration that scores better than the reference (negative loss) dominates all
  // costlier ones; of two equal points only the first is kept.
  const std::vector<double> bits = {4, 4, 8, 16};
  const std::vector<double> loss = {-0.5, -0.5, 1.0, -1.0};
  EXPECT_EQ(ParetoFrontier(bits, loss), (std::vector<int>{0, 3}));
  EXPECT_TRUE(ParetoFrontier({}, {}).empty());
}

}  // namespace
}  // namespace kvstack
