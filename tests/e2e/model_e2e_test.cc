// End-to-end tests on the real model (../shared/models/stories260K.gguf): greedy generation
// reproduces the reference continuation, and perplexity on real text matches llama.cpp's
// figure and is the same through every cache layout.
#include "gtest/gtest.h"
#include "kvstack/engine.h"
#include "shared_model.h"

namespace kvstack {
namespace {

const LlamaModel& Model() { return e2e::SharedModel(); }

std::unique_ptr<Engine> MakeEngine(const KvConfig& kv, int context_tokens, int threads = 2) {
  EngineOptions options;
  options.kv = kv;
  options.context_tokens = context_tokens;
  options.num_threads = threads;
  auto engine = Engine::Create(Model(), options);
  KVS_CHECK(engine.ok());
  return std::move(engine).value();
}

std::vector<TokenId> GreedyIds(Engine& engine, std::span<const TokenId> prompt, int n) {
  std::vector<TokenId> out;
  GenerateOptions options;
  options.max_new_tokens = n;
  options.stop_at_eos = false;
  auto stats = Generate(engine, prompt, options, [&](TokenId id) { out.push_back(id); });
  EXPECT_TRUE(stats.ok()) << stats.status();
  return out;
}

TEST(ModelE2E, GreedyFromBosMatchesReferenceIds) {
  const std::vector<TokenId> expected = {403, 407, 261, 378, 432, 383, 286, 261,
                                         376, 298, 315, 421, 395, 317, 426, 338,
                                         401, 396, 267, 337, 410, 408, 419, 292};
  for (LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged, LayoutKind::kRing}) {
    KvConfig kv;
    kv.layout = layout;
    auto engine = MakeEngine(kv, 32);
    const TokenId bos = Model().tokenizer().bos_id();
    EXPECT_EQ(GreedyIds(*engine, std::span<const TokenId>(&bos, 1), 24), expected)
        << LayoutName(layout);
  }
}

TEST(ModelE2E, GreedyContinuationMatchesReferenceText) {
  const Tokenizer& tokenizer = Model().tokenizer();
  const std::vector<TokenId> prompt = tokenizer.Encode("Once upon a time", true);
  ASSERT_EQ(prompt, (std::vector<TokenId>{1, 403, 407, 261, 378}));
  auto engine = MakeEngine(KvConfig{}, 64);
  std::vector<TokenId> all = prompt;
  for (TokenId id : GreedyIds(*engine, prompt, 48)) all.push_back(id);
  EXPECT_EQ(tokenizer.Decode(all),
            "Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park. One day, she saw a big, red ball. She wanted to play with it,");
}

// Perplexity over the first max_windows windows of the text (0 = all of it). The llama.cpp
// figures need the whole text; layouts and codecs are compared on kCompareWindows windows,
// where the same code runs as in every other window (a whole-text pass takes over 2 min under
// the sanitizers).
constexpr int kCompareWindows = 24;
// The whole-text passes take 2-3 min each under the sanitizers, 5 of CI's 8 min of sanitizer
// tests. There they are left to the Release run of the same CI (scripts/test.sh runs both); the
// sanitizers check the same code on the comparison windows.
#ifdef KVS_SANITIZER_BUILD
constexpr bool kWholeTextPasses = false;
#else
constexpr bool kWholeTextPasses = true;
#endif

double PerplexityWith(const KvConfig& kv, int ctx, int max_windows = 0) {
  const std::vector<TokenId>& tokens = e2e::SharedTokens();
  auto engine = MakeEngine(kv, ctx);
  PerplexityOptions options;
  options.ctx = ctx;
  options.max_windows = max_windows;
  auto result = Perplexity(*engine, tokens, options, nullptr);
  KVS_CHECK(result.ok());
  const int64_t windows = max_windows > 0 ? max_windows : 127607 / ctx;
  EXPECT_EQ(result->tokens_scored, windows * (ctx - 1 - ctx / 2));
  return result->ppl;
}

TEST(ModelE2E, PerplexityAt512MatchesLlamaCppAndIsTheSameInEveryLayout) {
  // ../shared/reference/README.md: llama.cpp, F16 cache, ctx 512: PPL 4.1311.
  constexpr double kLlamaCppPpl = 4.1311;
  KvConfig paged;
  if (kWholeTextPasses) {
    EXPECT_NEAR(PerplexityWith(paged, 512), kLlamaCppPpl, 0.005 * kLlamaCppPpl);
  }

  const double ppl_paged = PerplexityWith(paged, 512, kCompareWindows);
  KvConfig contiguous;
  contiguous.layout = LayoutKind::kContiguous;
  EXPECT_NEAR(PerplexityWith(contiguous, 512, kCompareWindows), ppl_paged, 1e-4);

  KvConfig ring;  // holds the whole window
  ring.layout = LayoutKind::kRing;
  ring.capacity = 512;
  EXPECT_NEAR(PerplexityWith(ring, 512, kCompareWindows), ppl_paged, 1e-4);

  KvConfig small_blocks;
  small_blocks.block_size = 3;
  EXPECT_NEAR(PerplexityWith(small_blocks, 512, kCompareWindows), ppl_paged, 1e-4);
}

TEST(ModelE2E, F32CacheIsAtLeastAsGoodAsF16AndBf16IsClose) {
  KvConfig f16;
  KvConfig f32;
  f32.k_codec = f32.v_codec = "f32";
  KvConfig bf16;
  bf16.k_codec = bf16.v_codec = "bf16";
  // ../shared/reference/README.md: llama.cpp ctx 256: 4.1630.
  if (kWholeTextPasses) {
    EXPECT_NEAR(PerplexityWith(f32, 256), 4.1630, 0.005 * 4.1630);
  }
  const double p32 = PerplexityWith(f32, 256, kCompareWindows);
  EXPECT_NEAR(PerplexityWith(f16, 256, kCompareWindows), p32, 0.001 * p32);
  EXPECT_NEAR(PerplexityWith(bf16, 256, kCompareWindows), p32, 0.01 * p32);
}

TEST(ModelE2E, SingleAndMultiThreadedAgree) {
  auto one = MakeEngine(KvConfig{}, 300, 1);
  auto two = MakeEngine(KvConfig{}, 300, 2);
  const std::vector<TokenId> prompt = Model().tokenizer().Encode("Spot saw the shiny car", true);
  EXPECT_EQ(GreedyIds(*one, prompt, 200), GreedyIds(*two, prompt, 200));
}

TEST(ModelE2E, ContiguousCacheFullIsAnErrorNotACrash) {
  KvConfig kv;
  kv.layout = LayoutKind::kContiguous;
  kv.capacity = 8;
  auto engine = MakeEngine(kv, 8);
  auto seq = engine->NewSequence();
  ASSERT_TRUE(seq.ok());
  std::vector<TokenId> tokens(9, 300);
  std::vector<float> logits;
  const absl::Status status = engine->Forward(*seq, tokens, false, &logits);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(engine->Forward(*seq, std::vector<TokenId>{600}, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstack

namespace kvstack {
namespace {

TEST(ModelE2E, RingShorterThanTheSequenceMatchesFullCacheUntilItWraps) {
  KvConfig full;
  KvConfig ring;
  ring.layout = LayoutKind::kRing;
  ring.capacity = 64;
  auto full_engine = MakeEngine(full, 200);
  auto ring_engine = MakeEngine(ring, 200);
  const TokenId bos = Model().tokenizer().bos_id();
  const std::vector<TokenId> a = GreedyIds(*full_engine, std::span<const TokenId>(&bos, 1), 150);
  const std::vector<TokenId> b = GreedyIds(*ring_engine, std::span<const TokenId>(&bos, 1), 150);
  ASSERT_EQ(b.size(), 150u);
  // Token i is chosen from logits at position i, which see i+1 keys: identical while i < 64.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 64, b.begin()));
  EXPECT_EQ(ring_engine->cache().bytes_in_use(), 0u);  // freed after generation
}

}  // namespace
}  // namespace kvstack
