// End-to-end tests of the selection policies on the real model: the budget holds between
// forward calls for every policy, layout and codec; a window policy computes exactly what a
// ring cache of the same length computes; a budget that covers the context changes nothing;
// re-assigned positions keep a stream flat past the trained length where the full cache
// degrades; the retrieval probe tells a cache that kept the first copy from one that did not;
// and bad configurations fail with one line.
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstack/engine.h"
#include "kvstack/head_profile.h"
#include "run/head_calibration.h"
#include "run/long_context_eval.h"
#include "shared_model.h"
#include "support/scratch_dir.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

const LlamaModel& Model() { return e2e::SharedModel(); }

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const KvConfig& kv, int context_tokens,
                                                   int max_batch) {
  EngineOptions options;
  options.kv = kv;
  options.context_tokens = context_tokens;
  options.num_threads = 2;
  options.max_batch = max_batch;
  return Engine::Create(Model(), options);
}

KvConfig Evicting(std::string policy, int budget) {
  KvConfig kv;
  kv.policy = std::move(policy);
  kv.budget = KvBudget{KvBudget::Kind::kTokens, static_cast<double>(budget)};
  return kv;
}

// The most tokens any (layer, kv head) of the sequence holds.
int MaxHeadTokens(const Engine& engine, SeqId seq_id) {
  int most = 0;
  const LlamaHparams& hp = Model().hparams();
  for (int layer = 0; layer < hp.num_layers; ++layer) {
    for (int h = 0; h < hp.num_kv_heads; ++h) {
      most = std::max(most, engine.cache().HeadTokens(seq_id, layer, h));
    }
  }
  return most;
}

// Runs `tokens` in calls of `batch` and returns the last call's logits; checks after every
// call that no kv head holds more than `budget` tokens.
std::vector<float> RunChecked(Engine& engine, std::span<const TokenId> tokens, int batch,
                              int budget) {
  auto seq = engine.NewSequence();
  KVS_CHECK(seq.ok());
  std::vector<float> logits;
  for (size_t b = 0; b < tokens.size(); b += batch) {
    const size_t n = std::min<size_t>(batch, tokens.size() - b);
    const absl::Status status = engine.Forward(*seq, tokens.subspan(b, n), false, &logits);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) break;
    EXPECT_LE(MaxHeadTokens(engine, *seq), budget) << "after " << b + n << " tokens";
  }
  EXPECT_TRUE(engine.FreeSequence(*seq).ok());
  return logits;
}

std::span<const TokenId> Text(size_t n) {
  return std::span<const TokenId>(e2e::SharedTokens()).first(n);
}

TEST(EvictionE2E, EveryPolicyLayoutAndCodecStaysWithinItsBudget) {
  struct LayoutCase {
    LayoutKind layout;
    int block_size;
  };
  const LayoutCase layouts[] = {{LayoutKind::kContiguous, 16},
                                {LayoutKind::kPaged, 16},
                                {LayoutKind::kPaged, 3},
                                {LayoutKind::kRing, 16}};
  for (const std::string policy : {"window", "streaming", "h2o", "tova", "snapkv"}) {
    for (const LayoutCase& layout : layouts) {
      for (const std::string codec : {"f32", "f16", "int8", "int4-g8", "fp8_e4m3"}) {
        KvConfig kv = Evicting(policy, 48);
        kv.layout = layout.layout;
        kv.block_size = layout.block_size;
        kv.k_codec = codec;
        kv.v_codec = codec;
        SCOPED_TRACE(kv.ToString());
        auto engine = MakeEngine(kv, 200, 8);
        ASSERT_TRUE(engine.ok()) << engine.status();
        const std::vector<float> logits = RunChecked(**engine, Text(200), 8, 48);
        ASSERT_FALSE(logits.empty());
        for (float l : logits) ASSERT_TRUE(std::isfinite(l));
      }
    }
  }
}

// Codecs whose units group tokens (KIVI keys over 32 tokens, int4 groups of 16 elements =
// 2 tokens of head_dim 8) and KIVI's F32 recent window evict too: their kept tokens are
// re-encoded in their new units.
TEST(EvictionE2E, UnitsOfSeveralTokensAndRecentWindowsEvictWithinTheBudget) {
  struct CodecCase {
    std::string k_codec, v_codec;
    int recent_tokens;
  };
  const CodecCase codecs[] = {
      {"kivi4", "int4-g16", 0}, {"kivi2", "kivi2", 32}, {"int8", "int8", 16}};
  for (const std::string policy : {"window", "h2o", "snapkv"}) {
    for (const LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged}) {
      for (const CodecCase& codec : codecs) {
        KvConfig kv = Evicting(policy, 64);
        kv.layout = layout;
        kv.block_size = 32;
        kv.k_codec = codec.k_codec;
        kv.v_codec = codec.v_codec;
        kv.recent_tokens = codec.recent_tokens;
        SCOPED_TRACE(kv.ToString());
        auto engine = MakeEngine(kv, 200, 8);
        ASSERT_TRUE(engine.ok()) << engine.status();
        const std::vector<float> logits = RunChecked(**engine, Text(200), 8, 64);
        ASSERT_FALSE(logits.empty());
        for (float l : logits) ASSERT_TRUE(std::isfinite(l));
      }
    }
  }
}

TEST(EvictionE2E, AdaptiveHeadsAndPyramidLayersStayWithinTheirBudgets) {
  KvConfig kv = Evicting("h2o", 32);
  kv.layer_budget = "pyramid";
  kv.head_budget = "adaptive";
  auto engine = MakeEngine(kv, 160, 8);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto seq = (*engine)->NewSequence();
  ASSERT_TRUE(seq.ok());
  const LlamaHparams& hp = Model().hparams();
  std::vector<float> logits;
  for (int b = 0; b < 160; b += 8) {
    ASSERT_TRUE((*engine)->Forward(*seq, Text(160).subspan(b, 8), false, &logits).ok());
    // Pyramid: layer budgets average 32 with the lower layers keeping more; adaptive: each
    // layer's heads share layer_budget * heads tokens.
    int total = 0;
    for (int layer = 0; layer < hp.num_layers; ++layer) {
      int layer_total = 0;
      for (int h = 0; h < hp.num_kv_heads; ++h) {
        layer_total += (*engine)->cache().HeadTokens(*seq, layer, h);
      }
      total += layer_total;
      EXPECT_LE(layer_total, 2 * 32 * hp.num_kv_heads);
    }
    EXPECT_LE(total, hp.num_layers * hp.num_kv_heads * 32) << "after " << b + 8;
  }
}

TEST(EvictionE2E, WindowPolicyDecodesExactlyAsARingOfTheSameLength) {
  // Decoding one token per call, a window of B tokens attends the B kept tokens plus the new
  // one: what a ring of B + 1 slots holds. Two independent mechanisms, one answer.
  const int budget = 40;
  KvConfig window = Evicting("window", budget);
  window.evict_step = 1;  // exactly B tokens after every step
  window.k_codec = window.v_codec = "f32";
  KvConfig ring;
  ring.layout = LayoutKind::kRing;
  ring.capacity = budget + 1;
  ring.k_codec = ring.v_codec = "f32";
  auto window_engine = MakeEngine(window, 120, 1);
  auto ring_engine = MakeEngine(ring, 120, 1);
  ASSERT_TRUE(window_engine.ok()) << window_engine.status();
  ASSERT_TRUE(ring_engine.ok()) << ring_engine.status();
  const std::vector<float> a = RunChecked(**window_engine, Text(120), 1, budget);
  const std::vector<float> b = RunChecked(**ring_engine, Text(120), 1, budget + 1);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i;
}

TEST(EvictionE2E, ABudgetCoveringTheContextChangesNothing) {
  KvConfig full;
  full.k_codec = full.v_codec = "f32";
  auto full_engine = MakeEngine(full, 96, 16);
  ASSERT_TRUE(full_engine.ok());
  const std::vector<float> expected = RunChecked(**full_engine, Text(96), 16, 96);
  for (const std::string policy : {"window", "h2o", "tova", "snapkv", "streaming"}) {
    KvConfig kv = Evicting(policy, 96);
    kv.k_codec = kv.v_codec = "f32";
    auto engine = MakeEngine(kv, 96, 16);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::vector<float> got = RunChecked(**engine, Text(96), 16, 96);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-4) << policy;
  }
}

TEST(EvictionE2E, ReassignedPositionsKeepAStreamFlatPastTheTrainedLength) {
  // stories260K was trained on 512-token windows. Streaming 2048 tokens: the full cache's
  // perplexity explodes once positions leave the trained range; sinks + window with
  // re-assigned positions never sees a position above its budget.
  StreamingOptions options;
  options.total_tokens = 2048;
  options.segment_tokens = 512;
  options.num_threads = 2;
  KvConfig full;
  full.k_codec = full.v_codec = "f32";
  auto full_stream = StreamingPerplexity(Model(), e2e::SharedTokens(), full, options);
  ASSERT_TRUE(full_stream.ok()) << full_stream.status();
  KvConfig streaming = Evicting("streaming", 256);
  streaming.positions = "reassign";
  auto sink_stream = StreamingPerplexity(Model(), e2e::SharedTokens(), streaming, options);
  ASSERT_TRUE(sink_stream.ok()) << sink_stream.status();
  const std::vector<double>& f = full_stream->segment_ppl;
  const std::vector<double>& s = sink_stream->segment_ppl;
  ASSERT_EQ(s.size(), 4u);
  EXPECT_LT(s.back(), 1.15 * s.front());
  EXPECT_GT(f.back(), 1.3 * f.front());
  EXPECT_LT(s.back(), f.back());
}

TEST(EvictionE2E, RetrievalProbeSeparatesACacheThatKeptTheFirstCopy) {
  RetrievalProbeOptions options;
  options.num_threads = 2;
  KvConfig full;
  full.k_codec = full.v_codec = "f32";
  auto kept = RetrievalProbe(Model(), e2e::SharedTokens(), full, options);
  ASSERT_TRUE(kept.ok()) << kept.status();
  // The model copies: the second reading of the passage is easier than the first.
  EXPECT_LT(kept->second_copy_nll, kept->first_copy_nll - 0.05);
  // A 64-token window has long lost the first copy when the second arrives.
  auto lost = RetrievalProbe(Model(), e2e::SharedTokens(), Evicting("window", 64), options);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_GT(lost->second_copy_nll, kept->second_copy_nll + 0.05);
}

TEST(EvictionE2E, BadConfigurationsFailWithOneLine) {
  auto expect_error = [](const KvConfig& kv, int context, const std::string& needle) {
    auto engine = MakeEngine(kv, context, 16);
    ASSERT_FALSE(engine.ok()) << kv.ToString();
    EXPECT_THAT(std::string(engine.status().message()), HasSubstr(needle));
    EXPECT_EQ(std::string(engine.status().message()).find('\n'), std::string::npos);
  };
  KvConfig unknown;
  unknown.policy = "h3o";
  expect_error(unknown, 64, "allowed");
  KvConfig no_budget;
  no_budget.policy = "h2o";
  expect_error(no_budget, 64, "needs a budget");
  expect_error(Evicting("h2o", 128), 64, "more than the context");
  KvConfig duo = Evicting("duo", 32);
  expect_error(duo, 64, "head profile");
  // A head profile measured on another model.
  const std::string path = testing_support::ScratchDir() + "/other_model.heads";
  const LlamaHparams& hp = Model().hparams();
  ASSERT_TRUE(HeadProfile(0x1234, hp.num_layers, hp.num_kv_heads).Save(path).ok());
  duo.head_profile = path;
  expect_error(duo, 64, "another model");
}

TEST(EvictionE2E, DuoKeepsEverythingInRetrievalHeadsOnly) {
  const LlamaHparams& hp = Model().hparams();
  HeadProfile profile(Model().gguf().ContentHash(), hp.num_layers, hp.num_kv_heads);
  profile.set_score(0, 1, 0.9);  // the one retrieval head at fraction 1 / (layers * heads)
  const std::string path = testing_support::ScratchDir() + "/duo.heads";
  ASSERT_TRUE(profile.Save(path).ok());
  KvConfig kv = Evicting("duo", 32);
  kv.evict_step = 1;  // exactly the budget
  kv.head_profile = path;
  kv.retrieval_fraction = 1.0 / (hp.num_layers * hp.num_kv_heads);
  auto engine = MakeEngine(kv, 128, 16);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto seq = (*engine)->NewSequence();
  ASSERT_TRUE(seq.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*engine)->Forward(*seq, Text(128), false, &logits).ok());
  for (int layer = 0; layer < hp.num_layers; ++layer) {
    for (int h = 0; h < hp.num_kv_heads; ++h) {
      const int expected = layer == 0 && h == 1 ? 128 : 32;
      EXPECT_EQ((*engine)->cache().HeadTokens(*seq, layer, h), expected) << layer << "," << h;
    }
  }
}

}  // namespace
}  // namespace kvstack

namespace kvstack {
namespace {

TEST(HeadCalibrationE2E, MeasuresHeadsThatDifferAndDuoRunsWithTheProfile) {
  HeadCalibrationOptions options;
  options.ctx = 256;
  options.max_windows = 2;
  options.num_threads = 2;
  auto profile = MeasureHeadProfile(Model(), e2e::SharedTokens(), options);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_TRUE(profile
                  ->CheckMatches(Model().gguf().ContentHash(), Model().hparams().num_layers,
                                 Model().hparams().num_kv_heads)
                  .ok());
  // Scores are shares of attention mass; stories260K's heads differ in how far back they look.
  const auto [lowest, highest] =
      std::minmax_element(profile->scores().begin(), profile->scores().end());
  EXPECT_GE(*lowest, 0.0);
  EXPECT_LE(*highest, 1.0);
  EXPECT_GT(*highest, 2 * *lowest + 0.01);

  // With the measured profile, duo runs and keeps everything only in the retrieval heads.
  const std::string path = testing_support::ScratchDir() + "/measured.heads";
  ASSERT_TRUE(profile->Save(path).ok());
  KvConfig kv = Evicting("duo", 48);
  kv.head_profile = path;
  kv.retrieval_fraction = 0.25;
  auto engine = MakeEngine(kv, 160, 16);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<float> logits = RunChecked(**engine, Text(160), 16, 160);
  for (float l : logits) ASSERT_TRUE(std::isfinite(l));
}

TEST(HeadCalibrationE2E, BadOptionsAreOneLine) {
  HeadCalibrationOptions options;
  options.ctx = 32;
  options.recent_tokens = 64;
  auto profile = MeasureHeadProfile(Model(), e2e::SharedTokens(), options);
  ASSERT_FALSE(profile.ok());
  EXPECT_THAT(std::string(profile.status().message()), HasSubstr("ctx > sinks + window"));
}

}  // namespace
}  // namespace kvstack

namespace kvstack {
namespace {

TEST(EvictionE2E, EvictStepCutsBelowTheBudgetOncePerStepTokens) {
  // Decoding one token per call with budget 48 and evict_step 8: a head grows to 49, one
  // eviction cuts it to 41, then it grows again; the rows move once per 8 steps.
  KvConfig kv = Evicting("h2o", 48);
  kv.evict_step = 8;
  auto engine = MakeEngine(kv, 160, 1);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto seq = (*engine)->NewSequence();
  ASSERT_TRUE(seq.ok());
  std::vector<float> logits;
  int evictions = 0, previous = 0;
  for (int t = 0; t < 160; ++t) {
    ASSERT_TRUE((*engine)->Forward(*seq, Text(160).subspan(t, 1), false, &logits).ok());
    const int held = (*engine)->cache().HeadTokens(*seq, 0, 0);
    EXPECT_LE(held, 48);
    if (t >= 48) {
      EXPECT_GE(held, 41) << t;
    }
    evictions += held < previous;
    previous = held;
  }
  EXPECT_EQ(evictions, (160 - 48) / 8);
}

}  // namespace
}  // namespace kvstack
