// Tests of per-kv-head codecs (KvConfig::head_codecs) in KvCache. Every kv head of a mixed
// layer must hold exactly what a cache of its own codecs would: each whole unit in the arena
// is, byte for byte, the head's codec encoding of the rows written to it (read at the address
// its one-head arena gives), and tokens not yet encoded are the rows as written. The suites run
// every layout with mixes of one-token and multi-token units, then check eviction (bytes moved
// and units re-encoded per head), copy-on-write of forks, the byte accounting against uniform
// caches, and the errors of impossible mixes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cache_test_util.h"
#include "kvstack/kv_cache.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

using namespace cache_test;  // NOLINT: the shared shape and helpers of the cache suites

// int4-g8 groups along one row only when a row has 8 elements.
constexpr int kDim = 8;

struct MixCase {
  std::string name;
  LayoutKind layout = LayoutKind::kPaged;
  int block_size = 16;
  int64_t capacity = 64;
  std::string k_codec;  // the layers' codecs
  std::string v_codec;
  std::vector<KvConfig::HeadCodecs> heads;  // overrides
  int sink_tokens = 0;
  int recent_tokens = 0;
};

void PrintTo(const MixCase& c, std::ostream* os) { *os << c.name; }

absl::StatusOr<std::unique_ptr<KvCache>> TryMakeCache(const MixCase& c) {
  KvCacheOptions options;
  options.num_layers = kNumLayers;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kDim;
  options.config.layout = c.layout;
  options.config.capacity = c.capacity;
  options.config.block_size = c.layout == LayoutKind::kPaged ? c.block_size : 0;
  options.config.max_sequences = 2;
  options.config.k_codec = c.k_codec;
  options.config.v_codec = c.v_codec;
  options.config.head_codecs = c.heads;
  options.config.sink_tokens = c.sink_tokens;
  options.config.recent_tokens = c.recent_tokens;
  return KvCache::Create(options);
}

std::unique_ptr<KvCache> MakeCache(const MixCase& c) {
  auto cache = TryMakeCache(c);
  KVS_CHECK(cache.ok());
  return std::move(*cache);
}

KvConfig::HeadCodecs Head(int layer_idx, int kv_head, std::string k, std::string v) {
  return {.layer_idx = layer_idx, .kv_head = kv_head, .k_codec = k, .v_codec = v};
}

// Where the expected F32 row of a head's logical token comes from: [kDim] floats.
using RowSource = std::function<std::vector<float>(bool keys, int logical)>;

// The rows as written of the appended tokens `ids` (logical order) of one head.
RowSource Written(const History& history, int layer_idx, int kv_head, std::vector<int> ids) {
  return [&history, layer_idx, kv_head, ids = std::move(ids)](bool keys, int logical) {
    const std::span<const float> row = keys ? history.KRow(layer_idx, ids[logical], kv_head, kDim)
                                            : history.VRow(layer_idx, ids[logical], kv_head, kDim);
    return std::vector<float>(row.begin(), row.end());
  };
}

// What kv head `h` holds now, logical order, as F32 rows: sinks and pending tokens as stored,
// arena tokens decoded with the head's codec from its own arena.
RowSource Held(const KvCache& cache, SeqId seq_id, int layer_idx, int h) {
  const KvLayerView head = cache.View(seq_id, layer_idx).HeadView(h);
  std::vector<std::vector<float>> k_rows, v_rows;
  for (const bool keys : {true, false}) {
    const KvArenaView& arena = keys ? head.k : head.v;
    std::vector<float> unit(static_cast<size_t>(arena.group_tokens) * kDim);
    for (int t = 0; t < head.num_tokens; ++t) {
      std::vector<float> row(kDim);
      if (t < head.sinks.end || t >= head.pending.begin) {
        const KvF32Segment& seg = t < head.sinks.end ? head.sinks : head.pending;
        const float* src = keys ? seg.KRow(t, 0, kDim) : seg.VRow(t, 0, kDim);
        std::copy(src, src + kDim, row.begin());
      } else {
        const int first = t - t % arena.group_tokens;
        arena.codec_impl->DecodeHead(h, {head.UnitOf(arena, first, 0), arena.unit_bytes}, unit);
        std::copy_n(unit.begin() + (t - first) * kDim, kDim, row.begin());
      }
      (keys ? k_rows : v_rows).push_back(std::move(row));
    }
  }
  return [k_rows, v_rows](bool keys, int logical) { return (keys ? k_rows : v_rows)[logical]; };
}

// Checks that kv head `h` of a layer holds `num_tokens` tokens whose rows `source` gives: each
// whole unit in the arena is, byte for byte, the head codec's encoding of its tokens' rows
// (with the rows of sink tokens replaced by their period's last row, as the cache encodes a
// period: the sinks are read from F32); sinks and pending tokens are the rows themselves.
void ExpectHeadHolds(const KvCache& cache, SeqId seq_id, int layer_idx, int h, int num_tokens,
                     const RowSource& source) {
  const KvLayerView head = cache.View(seq_id, layer_idx).HeadView(h);
  ASSERT_EQ(head.num_tokens, num_tokens);
  const int period = cache.unit_period(layer_idx);
  const int sinks = cache.config().sink_tokens;
  for (const bool keys : {true, false}) {
    const KvArenaView& arena = keys ? head.k : head.v;
    const Codec& codec = keys ? cache.k_codec(layer_idx, h) : cache.v_codec(layer_idx, h);
    ASSERT_EQ(arena.codec_impl, &codec);
    const int tokens = arena.group_tokens;
    for (int first = head.arena_begin() - head.arena_begin() % tokens; first < head.arena_end();
         first += tokens) {
      std::vector<float> rows;
      for (int t = first; t < first + tokens; ++t) {
        const bool replaced = period > 1 && t < sinks;
        const std::vector<float> row = source(keys, replaced ? t - t % period + period - 1 : t);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      std::vector<std::byte> want(arena.unit_bytes);
      codec.EncodeHead(h, rows, want);
      ASSERT_EQ(std::memcmp(head.UnitOf(arena, first, 0), want.data(), want.size()), 0)
          << (keys ? "key" : "value") << " unit of tokens " << first << ".." << first + tokens - 1
          << ", layer " << layer_idx << " head " << h << " (" << codec.name() << ")";
    }
    for (int t = 0; t < head.num_tokens; ++t) {
      if (t >= head.sinks.end && t < head.pending.begin) continue;
      const KvF32Segment& seg = t < head.sinks.end ? head.sinks : head.pending;
      const float* got = keys ? seg.KRow(t, 0, kDim) : seg.VRow(t, 0, kDim);
      const std::vector<float> want = source(keys, t);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), got))
          << "F32 token " << t << " layer " << layer_idx << " head " << h;
    }
  }
}

std::vector<int> Iota(int begin, int end) {
  std::vector<int> ids;
  for (int i = begin; i < end; ++i) ids.push_back(i);
  return ids;
}

const MixCase kMixes[] = {
    // One-token units: int8 keys with f16 or int4 values, every token encoded as it arrives.
    {.name = "paged_rows",
     .k_codec = "int4-g8",
     .v_codec = "int4-g8",
     .heads = {Head(0, 1, "int8", "f16"), Head(1, 0, "", "int8")}},
    {.name = "contiguous_rows",
     .layout = LayoutKind::kContiguous,
     .k_codec = "bf16",
     .v_codec = "fp8_e4m3",
     .heads = {Head(0, 0, "int8", "int2-g8"), Head(1, 1, "q4_absmax", "")}},
    {.name = "ring_rows",
     .layout = LayoutKind::kRing,
     .capacity = 24,
     .k_codec = "int8",
     .v_codec = "int8",
     .heads = {Head(0, 1, "f32", "int4-g8"), Head(1, 0, "fp8_e5m2", "bf16")},
     .sink_tokens = 2},
    // KIVI keys (16-token units) in one head, one-token rows in the other: the layer's
    // period is 16, so the row head's tokens too wait in F32 until a period fills.
    {.name = "paged_kivi_and_rows",
     .block_size = 32,
     .k_codec = "int8",
     .v_codec = "int8",
     .heads = {Head(0, 0, "kivi2-g16", "kivi2-g16"), Head(1, 1, "kivi4-g8", "int4-g8")},
     .sink_tokens = 3,
     .recent_tokens = 16},
    {.name = "contiguous_kivi_and_rows",
     .layout = LayoutKind::kContiguous,
     .k_codec = "kivi4-g16",
     .v_codec = "int4-g8",
     .heads = {Head(0, 1, "int8", "int8"), Head(1, 0, "f16", "")}},
};

class HeadCodecsTest : public ::testing::TestWithParam<MixCase> {};

TEST_P(HeadCodecsTest, EveryHeadHoldsItsOwnCodecsEncoding) {
  const MixCase& c = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache(c);
  std::mt19937 rng(11);
  History history;
  auto seq = cache->AddSequence();
  ASSERT_TRUE(seq.ok());
  // Uneven appends (a prefill, then single tokens and small batches) cross units and blocks.
  for (int n : {13, 1, 1, 7, 20, 1, 5}) {
    if (cache->NumTokens(*seq) + n > c.capacity && c.layout != LayoutKind::kRing) break;
    Append(*cache, *seq, n, rng, &history);
  }
  const int held = cache->NumTokens(*seq);
  const int appended = history.num_appended();
  // A wrapped ring keeps its sinks and drops the oldest tokens after them.
  std::vector<int> ids = Iota(0, std::min(c.sink_tokens, held));
  const std::vector<int> tail = Iota(appended - (held - static_cast<int>(ids.size())), appended);
  ids.insert(ids.end(), tail.begin(), tail.end());
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache->View(*seq, layer_idx);
    EXPECT_TRUE(view.mixed_codecs()) << "layer " << layer_idx;
    EXPECT_FALSE(view.uniform_heads());
    for (int h = 0; h < kNumKvHeads; ++h) {
      SCOPED_TRACE(testing::Message() << "layer " << layer_idx << " head " << h);
      EXPECT_EQ(cache->k_codec(layer_idx, h).name(), cache->config().KCodecOf(layer_idx, h));
      EXPECT_EQ(cache->v_codec(layer_idx, h).name(), cache->config().VCodecOf(layer_idx, h));
      ExpectHeadHolds(*cache, *seq, layer_idx, h, held, Written(history, layer_idx, h, ids));
    }
  }
}

// The layouts that do not wrap (this test's token ids assume every appended token is held).
class HeadCodecsEvictTest : public HeadCodecsTest {};

TEST_P(HeadCodecsEvictTest, EvictionMovesEachHeadInItsOwnFormat) {
  const MixCase& c = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache(c);
  std::mt19937 rng(12);
  History history;
  auto seq = cache->AddSequence();
  ASSERT_TRUE(seq.ok());
  Append(*cache, *seq, 48, rng, &history);
  // Head 1 of layer 0 keeps whole units (moved as bytes); head 0 of layer 1 loses scattered
  // tokens (units that lost some are encoded again from F32, and stay its codec's encoding).
  std::vector<int> whole = Iota(0, std::max(c.sink_tokens, 1));
  const std::vector<int> last = Iota(32, 48);
  whole.insert(whole.end(), last.begin(), last.end());
  std::vector<int> scattered;
  for (int i = 0; i < 48; ++i) {
    if (i < c.sink_tokens || i % 3 != 1) scattered.push_back(i);
  }
  // What the evicted heads held: a layer of one-token units moves their bytes (the kept tokens
  // are still the encoding of the rows as written); a layer of longer periods encodes every
  // period from the first moved token on again, from the F32 values the head held.
  auto kept_source = [&](int layer_idx, int h, const std::vector<int>& keep) -> RowSource {
    if (cache->unit_period(layer_idx) == 1) return Written(history, layer_idx, h, keep);
    RowSource before = Held(*cache, *seq, layer_idx, h);
    return [before, keep](bool keys, int logical) { return before(keys, keep[logical]); };
  };
  const RowSource kept_01 = kept_source(0, 1, whole), kept_10 = kept_source(1, 0, scattered);
  ASSERT_TRUE(cache->RetainTokens(*seq, 0, 1, whole).ok());
  ASSERT_TRUE(cache->RetainTokens(*seq, 1, 0, scattered).ok());
  auto fork = cache->ForkSequence(*seq);
  ASSERT_TRUE(fork.ok());
  // The fork holds what the parent held; the parent's appends (after each head's kept tokens,
  // through copies of the blocks they share) leave it so.
  Append(*cache, *seq, 4, rng, &history);
  auto then = [&](const RowSource& kept, int num_kept, int layer_idx, int h) -> RowSource {
    const RowSource appended = Written(history, layer_idx, h, Iota(48 - num_kept, 52));
    return [=](bool keys, int logical) {
      return logical < num_kept ? kept(keys, logical) : appended(keys, logical);
    };
  };
  const int num_whole = static_cast<int>(whole.size());
  const int num_scattered = static_cast<int>(scattered.size());
  ExpectHeadHolds(*cache, *seq, 0, 0, 52, Written(history, 0, 0, Iota(0, 52)));
  ExpectHeadHolds(*cache, *seq, 0, 1, num_whole + 4, then(kept_01, num_whole, 0, 1));
  ExpectHeadHolds(*cache, *seq, 1, 0, num_scattered + 4, then(kept_10, num_scattered, 1, 0));
  ExpectHeadHolds(*cache, *seq, 1, 1, 52, Written(history, 1, 1, Iota(0, 52)));
  ExpectHeadHolds(*cache, *fork, 0, 1, num_whole, kept_01);
  ExpectHeadHolds(*cache, *fork, 1, 0, num_scattered, kept_10);
  ExpectHeadHolds(*cache, *fork, 1, 1, 48, Written(history, 1, 1, Iota(0, 48)));
}

TEST_P(HeadCodecsTest, BytesAreTheSumOfTheHeadsCodecs) {
  const MixCase& c = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache(c);
  double want_per_token = 0.0;
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      for (const Codec* codec : {&cache->k_codec(layer_idx, h), &cache->v_codec(layer_idx, h)}) {
        want_per_token += static_cast<double>(codec->unit_bytes()) / codec->group_tokens();
      }
    }
  }
  EXPECT_DOUBLE_EQ(cache->bytes_per_token(), want_per_token);
  EXPECT_DOUBLE_EQ(cache->bits_per_element(),
                   8.0 * want_per_token / (2.0 * kNumLayers * kNumKvHeads * kDim));
  // Every slot holds bytes_per_token bytes: no padding between the heads' regions. (Regions
  // of the other layouts are `capacity` slots, a multiple of every case's period.)
  const int slots_per_block =
      c.layout == LayoutKind::kPaged ? cache->config().block_size : static_cast<int>(c.capacity);
  EXPECT_DOUBLE_EQ(
      static_cast<double>(cache->bytes_reserved()),
      static_cast<double>(cache->pool().num_blocks()) * slots_per_block * want_per_token);
}

INSTANTIATE_TEST_SUITE_P(Mixes, HeadCodecsTest, ::testing::ValuesIn(kMixes),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Mixes, HeadCodecsEvictTest, ::testing::ValuesIn([] {
                           std::vector<MixCase> unwrapped;
                           for (const MixCase& c : kMixes) {
                             if (c.layout != LayoutKind::kRing) unwrapped.push_back(c);
                           }
                           return unwrapped;
                         }()),
                         [](const auto& info) { return info.param.name; });

// A cache of mix `c` after `num_tokens` appended: every layer is one codec per side for all its
// kv heads (one object, so attention reads the layer in one call), and its view not mixed.
void ExpectOneCodecPerLayer(const MixCase& c, int num_tokens) {
  std::unique_ptr<KvCache> cache = MakeCache(c);
  auto seq = cache->AddSequence();
  ASSERT_TRUE(seq.ok());
  std::mt19937 rng(3);
  History history;
  Append(*cache, *seq, num_tokens, rng, &history);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache->View(*seq, layer_idx);
    EXPECT_FALSE(view.mixed_codecs());
    EXPECT_TRUE(view.uniform_heads());
    for (int h = 1; h < kNumKvHeads; ++h) {
      EXPECT_EQ(&cache->k_codec(layer_idx, 0), &cache->k_codec(layer_idx, h));
      EXPECT_EQ(&cache->v_codec(layer_idx, 0), &cache->v_codec(layer_idx, h));
    }
  }
}

TEST(HeadCodecsUniformTest, OverridesNamingTheLayersCodecsLeaveItUniform) {
  ExpectOneCodecPerLayer({.name = "same",
                          .k_codec = "int8",
                          .v_codec = "int4-g8",
                          .heads = {Head(0, 0, "int8", "int4-g8"), Head(1, 1, "", "int4-g8")}},
                         5);
}

// "int4" is int4-g32 and "int2" int2-g32: a layer named by a short name, and a head naming the
// long one, share one codec (Attention refuses a mixed view).
TEST(HeadCodecsUniformTest, CodecNamesWithDefaultGroupsAreTheSameCodec) {
  ExpectOneCodecPerLayer({.name = "aliases",
                          .k_codec = "int4",
                          .v_codec = "int2",
                          .heads = {Head(0, 1, "int4-g32", "int2-g32")}},
                         70);
}

TEST(HeadCodecsErrorTest, ImpossibleMixesAreOneLineErrors) {
  struct Bad {
    std::vector<KvConfig::HeadCodecs> heads;
    std::string k_codec = "int8";
    std::string message;
  };
  const Bad cases[] = {
      {{Head(0, 2, "int8", "")}, "int8", "kv heads 0..1"},
      {{Head(2, 0, "int8", "")}, "int8", "layers 0..1"},
      {{Head(0, 0, "kivi2-g32", ""), Head(0, 1, "kivi2-g48", "")},
       "int8",
       "unit sizes of which one is a multiple of the other"},
      {{Head(1, 0, "latent-r4", "latent-r4")}, "int8", "latent codecs per layer only"},
      {{Head(1, 0, "int8", "")}, "latent-r4", "head overrides in layers whose codecs are not"},
      {{Head(0, 0, "", "")}, "int8", "names no codec"},
      {{Head(0, 0, "int7", "")}, "int8", "head_codecs[layer 0 head 0].k_codec 'int7'"},
      {{Head(0, 1, "int8", ""), Head(0, 1, "f16", "")}, "int8", "two overrides"},
      {{Head(-1, 0, "int8", "")}, "int8", "negative index"},
  };
  for (const Bad& bad : cases) {
    MixCase c{.name = "bad", .k_codec = bad.k_codec, .v_codec = bad.k_codec, .heads = bad.heads};
    auto cache = TryMakeCache(c);
    ASSERT_FALSE(cache.ok()) << bad.message;
    EXPECT_THAT(std::string(cache.status().message()), HasSubstr(bad.message));
    EXPECT_EQ(std::string(cache.status().message()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace kvstack
