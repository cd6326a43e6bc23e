// The cache's side of the latent codec: a layer whose keys and values are latent-r<R> stores
// one unit per token and head (the value arena is empty, and the value view reads the key
// arena), encodes each token's key and value together, moves and re-encodes them together on
// eviction, and refuses any other pairing of a latent codec with a one-line error (and, like
// every key codec built from a profile, Hadamard-rotated keys).

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstack/kv_cache.h"
#include "kvstack/kv_profile.h"
#include "represent/latent_codec.h"
#include "support/scratch_dir.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

constexpr int kNumLayers = 2;
constexpr int kNumKvHeads = 2;
constexpr int kHeadDim = 8;
constexpr uint64_t kHash = 0x1a7e47;

std::vector<float> RandomRows(int num_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> rows(static_cast<size_t>(num_tokens) * kNumKvHeads * kHeadDim);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = normal(rng) * (1.0f + (i % kHeadDim));
  return rows;
}

const std::string& ProfilePath() {
  static const std::string path = [] {
    std::mt19937 rng(1);
    KvProfile profile(kHash, kNumLayers, kNumKvHeads, kHeadDim);
    for (int l = 0; l < kNumLayers; ++l) {
      profile.Accumulate(l, RandomRows(500, rng), RandomRows(500, rng));
    }
    KVS_CHECK(profile.Finalize().ok());
    const std::string p = testing_support::ScratchDir() + "/kv_cache_latent_test.kvsprof";
    KVS_CHECK(profile.Save(p).ok());
    return p;
  }();
  return path;
}

KvCacheOptions Options(const std::string& k_codec, const std::string& v_codec,
                       LayoutKind layout = LayoutKind::kPaged) {
  KvCacheOptions options;
  options.num_layers = kNumLayers;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kHeadDim;
  options.model_hash = kHash;
  options.config.layout = layout;
  options.config.block_size = 4;
  options.config.capacity = 32;
  options.config.max_sequences = 2;
  options.config.k_codec = k_codec;
  options.config.v_codec = v_codec;
  options.config.profile = ProfilePath();
  return options;
}

// Appends num_tokens random tokens to every layer; returns the rows written to layer 0.
struct Written {
  std::vector<float> k, v;
};
Written Append(KvCache& cache, SeqId seq, int num_tokens, std::mt19937& rng) {
  auto plan = cache.PlanAppend(seq, num_tokens);
  KVS_CHECK(plan.ok() && plan->fits);
  KVS_CHECK(cache.CommitAppend(*plan).ok());
  Written layer0;
  for (int l = 0; l < kNumLayers; ++l) {
    const std::vector<float> k = RandomRows(num_tokens, rng), v = RandomRows(num_tokens, rng);
    cache.Write(seq, l, cache.NumTokens(seq) - num_tokens, k, v);
    if (l == 0) layer0 = {k, v};
  }
  return layer0;
}

// One stored row of head h, logical t, decoded through the view's arena (keys or values).
std::vector<float> ViewRow(const KvLayerView& view, bool keys, int t, int h) {
  const KvArenaView& arena = keys ? view.k : view.v;
  std::vector<float> row(kHeadDim);
  view.ForEachRun(t, t + 1, [&](int, int, int32_t block_id, int r) {
    arena.codec_impl->DecodeHead(view.first_kv_head + h,
                                 {arena.Row(block_id, r, h), arena.unit_bytes}, row);
  });
  return row;
}

TEST(KvCacheLatent, OneUnitPerTokenHoldsKeyAndValue) {
  auto cache = KvCache::Create(Options("latent-r6", "latent-r6"));
  ASSERT_TRUE(cache.ok()) << cache.status();
  // 12 bytes per token and head (6 F16 coordinates) for keys and values together.
  EXPECT_DOUBLE_EQ((*cache)->bytes_per_token(), kNumLayers * kNumKvHeads * 12.0);
  EXPECT_DOUBLE_EQ((*cache)->bits_per_element(), 6.0);
  EXPECT_TRUE((*cache)->v_codec(1).joint());

  std::mt19937 rng(3);
  const SeqId seq = *(*cache)->AddSequence();
  const Written w = Append(**cache, seq, 11, rng);
  const KvLayerView view = (*cache)->View(seq, 0);
  EXPECT_EQ(view.v.base, view.k.base);
  EXPECT_EQ(view.v.codec, CodecId::kLatent);
  EXPECT_EQ(view.v.unit_bytes, 12u);

  // Every token decodes as the codec's own joint round trip of what was written.
  const Codec& k_codec = (*cache)->k_codec(0);
  const Codec& v_codec = (*cache)->v_codec(0);
  for (int t = 0; t < 11; ++t) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      const size_t at = (static_cast<size_t>(t) * kNumKvHeads + h) * kHeadDim;
      std::vector<std::byte> unit(12);
      k_codec.EncodeJointHead(h, std::span(w.k).subspan(at, kHeadDim),
                              std::span(w.v).subspan(at, kHeadDim), unit);
      std::vector<float> k(kHeadDim), v(kHeadDim);
      k_codec.DecodeHead(h, unit, k);
      v_codec.DecodeHead(h, unit, v);
      EXPECT_EQ(ViewRow(view, true, t, h), k) << t << " " << h;
      EXPECT_EQ(ViewRow(view, false, t, h), v) << t << " " << h;
    }
  }
}

TEST(KvCacheLatent, EvictionMovesAndRewritesKeyAndValueTogether) {
  auto cache = KvCache::Create(Options("latent-r16", "latent-r16", LayoutKind::kContiguous));
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::mt19937 rng(4);
  const SeqId seq = *(*cache)->AddSequence();
  Append(**cache, seq, 9, rng);
  const KvLayerView before = (*cache)->View(seq, 0);
  std::vector<std::vector<float>> k_before, v_before;
  for (int t = 0; t < 9; ++t) {
    k_before.push_back(ViewRow(before, true, t, 1));
    v_before.push_back(ViewRow(before, false, t, 1));
  }
  // Moved as bytes: exactly the kept tokens' keys and values.
  const std::vector<int> keep = {0, 2, 5, 8};
  ASSERT_TRUE((*cache)->RetainTokens(seq, 0, 1, keep).ok());
  KvLayerView after = (*cache)->View(seq, 0).HeadView(1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ViewRow(after, true, i, 0), k_before[keep[i]]) << i;
    EXPECT_EQ(ViewRow(after, false, i, 0), v_before[keep[i]]) << i;
  }
  // Re-encoded with a changed key: the value stays (full rank: to F16 rounding).
  const std::vector<int> keep2 = {1, 3};
  ASSERT_TRUE((*cache)
                  ->RetainTokens(seq, 0, 1, keep2,
                                 [](int, int, std::span<float> key) {
                                   for (float& x : key) x += 1.0f;
                                 })
                  .ok());
  after = (*cache)->View(seq, 0).HeadView(1);
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> k = ViewRow(after, true, i, 0), v = ViewRow(after, false, i, 0);
    for (int c = 0; c < kHeadDim; ++c) {
      EXPECT_NEAR(k[c], k_before[keep[keep2[i]]][c] + 1.0f, 0.05f) << i << " " << c;
      EXPECT_NEAR(v[c], v_before[keep[keep2[i]]][c], 0.05f) << i << " " << c;
    }
  }
}

TEST(KvCacheLatent, ForkedSequencesShareTheLatentUnits) {
  auto cache = KvCache::Create(Options("latent-r4-int4", "latent-r4-int4"));
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::mt19937 rng(5);
  const SeqId seq = *(*cache)->AddSequence();
  Append(**cache, seq, 6, rng);
  auto fork = (*cache)->ForkSequence(seq);
  ASSERT_TRUE(fork.ok()) << fork.status();
  const KvLayerView a = (*cache)->View(seq, 1), b = (*cache)->View(*fork, 1);
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(ViewRow(a, false, t, 0), ViewRow(b, false, t, 0)) << t;
  }
}

TEST(KvCacheLatent, OtherPairingsAreRefused) {
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"latent-r4", "f16"}, {"int4", "latent-r4"}, {"latent-r4", "latent-r8"}}) {
    auto cache = KvCache::Create(Options(k, v));
    ASSERT_FALSE(cache.ok()) << k << " " << v;
    EXPECT_THAT(std::string(cache.status().message()),
                HasSubstr("allowed: the same latent-r<rank>[-int4] for both"));
  }
  // A per-layer override that leaves one side latent.
  KvCacheOptions options = Options("latent-r4", "latent-r4");
  options.config.layer_codecs.push_back(
      {.layer_idx = 1, .k_codec = "f16", .v_codec = "", .policy = ""});
  auto mixed = KvCache::Create(options);
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(std::string(mixed.status().message()), HasSubstr("k='f16' v='latent-r4'"));
  auto too_big = KvCache::Create(Options("latent-r17", "latent-r17"));
  ASSERT_FALSE(too_big.ok());
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("above 2*head_dim 16"));
  // Keys rotated by a Hadamard matrix would not be in the calibrated basis.
  options = Options("latent-r4", "latent-r4");
  options.config.hadamard_keys = true;
  EXPECT_THAT(std::string(KvCache::Create(options).status().message()),
              HasSubstr("calibrated on unrotated keys"));
  options = Options("lowrank-r4", "f16");
  options.config.hadamard_keys = true;
  EXPECT_FALSE(KvCache::Create(options).ok());
  options = Options("f16", "lowrank-r4");  // values are never rotated
  options.config.hadamard_keys = true;
  EXPECT_TRUE(KvCache::Create(options).ok());
  // Without a profile, or with another model's.
  options = Options("latent-r4", "latent-r4");
  options.config.profile.clear();
  EXPECT_THAT(std::string(KvCache::Create(options).status().message()),
              HasSubstr("need a calibration profile"));
  options = Options("latent-r4", "latent-r4");
  options.model_hash = kHash + 1;
  EXPECT_THAT(std::string(KvCache::Create(options).status().message()), HasSubstr("another model"));
}

}  // namespace
}  // namespace kvstack
