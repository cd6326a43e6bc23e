// Tests of KvCache::RetainTokens (eviction, the cache's side). A small model of the cache —
// which appended token each logical token of each (layer, kv head) is — says what every head
// must hold after appends, evictions and ring wrap-around; every head is then read back
// through View() at the address kv_view.h defines (sinks from their F32 segment, arena rows
// decoded with the codec and the head's index) and compared with the codec's own round trip
// of the token as written. Since a one-token unit encodes the same row to the same bytes,
// "moved bytes" and "the kept tokens' previous decoded values" are the same thing, exactly.
// Conformance runs every layout (contiguous, paged 16 and 3, ring) with several codecs;
// further tests cover sinks, the rewrite callback, errors (nothing changes), forks
// (copy-on-write) and the byte accounting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cache_test_util.h"
#include "kvstack/kv_cache.h"
#include "kvstack/kv_profile.h"
#include "packed_test_codec.h"
#include "represent/hadamard.h"
#include "support/scratch_dir.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;
using Ids = std::vector<int>;

using namespace cache_test;  // NOLINT: the shared shape and helpers of the cache suites

// int4-g8 and q4_absmax group along one row only when a row has 8 elements.
constexpr int kDim = 8;
constexpr uint64_t kModelHash = 77;

struct LayoutCase {
  std::string name;
  LayoutKind layout;
  int block_size = 16;
  int64_t capacity = 48;
};

void PrintTo(const LayoutCase& layout, std::ostream* os) { *os << layout.name; }

const LayoutCase kLayouts[] = {
    {"contiguous", LayoutKind::kContiguous},
    {"paged16", LayoutKind::kPaged, 16},
    {"paged3", LayoutKind::kPaged, 3},
    {"ring", LayoutKind::kRing, 16, 24},
};

struct CacheCase {
  LayoutCase layout;
  std::string codec = "f32";
  std::string v_codec = "";  // empty: codec
  int sink_tokens = 0;
  int recent_tokens = 0;
  bool hadamard = false;
  int max_sequences = 2;
  PackedNames packed = {};  // codec names served by the lossless PackedF32Codec
};

// A calibration profile of random rows for the low-rank codec, written once per process.
std::string ProfilePath() {
  static const std::string path = [] {
    KvProfile profile(kModelHash, kNumLayers, kNumKvHeads, kDim);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> keys(200 * kNumKvHeads * kDim), values(keys.size());
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      for (float& x : keys) x = normal(rng);
      for (float& x : values) x = normal(rng);
      profile.Accumulate(layer_idx, keys, values);
    }
    KVS_CHECK(profile.Finalize().ok());
    const std::string file = testing_support::ScratchDir() + "/kv_cache_evict_test.profile";
    KVS_CHECK(profile.Save(file).ok());
    return file;
  }();
  return path;
}

absl::StatusOr<std::unique_ptr<KvCache>> TryMakeCache(const CacheCase& c) {
  KvCacheOptions options;
  options.num_layers = kNumLayers;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kDim;
  options.model_hash = kModelHash;
  options.config.layout = c.layout.layout;
  options.config.capacity = c.layout.capacity;
  options.config.block_size = c.layout.block_size;
  options.config.max_sequences = c.max_sequences;
  options.config.k_codec = c.codec;
  options.config.v_codec = c.v_codec.empty() ? c.codec : c.v_codec;
  options.config.sink_tokens = c.sink_tokens;
  options.config.recent_tokens = c.recent_tokens;
  options.config.hadamard_keys = c.hadamard;
  if (c.codec.starts_with("lowrank")) options.config.profile = ProfilePath();
  if (!c.packed.empty()) options.codec_factory = Factory(c.packed);
  return KvCache::Create(options);
}

std::unique_ptr<KvCache> MakeCache(const CacheCase& c) {
  auto cache = TryMakeCache(c);
  KVS_CHECK(cache.ok());
  return std::move(*cache);
}

// Which appended token each logical token of each (layer, kv head) is.
struct Model {
  int ring_capacity = 0;  // 0: not a ring
  int sink_tokens = 0;
  std::vector<int> ids[kNumLayers][kNumKvHeads];

  int NumTokens() const {
    size_t n = 0;
    for (const auto& layer : ids) {
      for (const std::vector<int>& head : layer) n = std::max(n, head.size());
    }
    return static_cast<int>(n);
  }
  // Tokens first_id.. appended to every head. A full ring drops as many of every head's oldest
  // non-sink tokens as the longest head overflows (its first_slot is shared).
  void Append(int first_id, int num_new) {
    const int n = NumTokens();
    const int dropped = ring_capacity == 0 ? 0 : std::max(0, n + num_new - ring_capacity);
    for (auto& layer : ids) {
      for (std::vector<int>& head : layer) {
        for (int j = 0; j < num_new; ++j) head.push_back(first_id + j);
        if (dropped > 0) {
          head.erase(head.begin() + sink_tokens, head.begin() + sink_tokens + dropped);
        }
      }
    }
  }
  void Retain(int layer_idx, int kv_head, const std::vector<int>& keep) {
    std::vector<int>& head = ids[layer_idx][kv_head];
    std::vector<int> kept;
    for (int i : keep) kept.push_back(head[i]);
    head = kept;
  }
};

// Appends tokens to the cache and the model alike.
void AppendBoth(KvCache& cache, SeqId seq_id, int num_new, std::mt19937& rng, History* history,
                Model* model) {
  const int first_id = history->num_appended();
  Append(cache, seq_id, num_new, rng, history);
  model->Append(first_id, num_new);
}

// A row as the cache stores it: rotated when keys are, then (in the arena) through the codec
// of kv head h. Sinks and pending tokens are kept as the rotated F32 row, and so are tokens in
// units of several rows: the suites use only the lossless PackedF32Codec for those.
std::vector<float> Stored(const Codec& codec, int kv_head, std::span<const float> row, bool rotate,
                          bool f32) {
  std::vector<float> x(row.begin(), row.end());
  if (rotate) HadamardRotate(x);
  if (f32 || codec.group_tokens() > 1) return x;
  std::vector<std::byte> bytes(codec.unit_bytes());
  codec.EncodeHead(kv_head, x, bytes);
  codec.DecodeHead(kv_head, bytes, x);
  return x;
}

// One head's logical token i as attention reads it, keys and values, from the segment that
// holds it in that head's view: sinks, pending (F32), or the arena (its whole unit decoded).
// Also says whether it came from an F32 segment.
struct ReadRows {
  std::vector<float> k, v;
  bool f32 = false;
};
ReadRows ReadToken(const KvLayerView& view, int kv_head, int i) {
  const KvLayerView one = view.HeadView(kv_head);
  ReadRows read{std::vector<float>(kDim), std::vector<float>(kDim)};
  const KvF32Segment* segment = i < one.sinks.end        ? &one.sinks
                                : i >= one.pending.begin ? &one.pending
                                                         : nullptr;
  if (segment != nullptr) {
    std::copy_n(segment->KRow(i, 0, kDim), kDim, read.k.begin());
    std::copy_n(segment->VRow(i, 0, kDim), kDim, read.v.begin());
    read.f32 = true;
    return read;
  }
  const int slot = (one.first_slot + i) % one.num_slots();
  const int32_t block_id = one.block_table[slot / one.block_size];
  const int row = slot % one.block_size;
  for (const bool key : {true, false}) {
    const KvArenaView& arena = key ? one.k : one.v;
    std::vector<float> unit(static_cast<size_t>(arena.group_tokens) * kDim);
    arena.codec_impl->DecodeHead(
        one.first_kv_head, {arena.Unit(block_id, row / arena.group_tokens, 0), arena.unit_bytes},
        unit);
    std::copy_n(unit.begin() + (row % arena.group_tokens) * kDim, kDim,
                (key ? read.k : read.v).begin());
  }
  return read;
}

// Checks every head of every layer against the model, and the counts.
void ExpectHolds(const KvCache& cache, SeqId seq_id, const History& history, const Model& model) {
  ASSERT_EQ(cache.NumTokens(seq_id), model.NumTokens());
  const bool rotate = cache.config().hadamard_keys;
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache.View(seq_id, layer_idx);
    ASSERT_EQ(view.num_tokens, model.NumTokens());
    for (int h = 0; h < kNumKvHeads; ++h) {
      const std::vector<int>& ids = model.ids[layer_idx][h];
      ASSERT_EQ(cache.HeadTokens(seq_id, layer_idx, h), static_cast<int>(ids.size()));
      ASSERT_EQ(view.HeadTokens(h), static_cast<int>(ids.size()));
      const KvLayerView one = view.HeadView(h);
      for (int i = 0; i < static_cast<int>(ids.size()); ++i) {
        const ReadRows read = ReadToken(view, h, i);
        for (const bool key : {true, false}) {
          const Codec& codec = key ? cache.k_codec(layer_idx) : cache.v_codec(layer_idx);
          const std::span<const float> row = key ? history.KRow(layer_idx, ids[i], h, kDim)
                                                 : history.VRow(layer_idx, ids[i], h, kDim);
          const bool rotated = key && rotate;
          const std::vector<float>& got = key ? read.k : read.v;
          // A token that was encoded, sent back to the pending rows by an eviction (as its
          // decoded row) and perhaps encoded again holds a row within two roundings of what
          // was written: the scale-searching codecs (int8, fp8) may round a decoded row again.
          const std::vector<float> written = Stored(codec, h, row, rotated, true);
          const std::vector<float> decoded = Stored(codec, h, row, rotated, false);
          float largest_error = 0;
          for (int c = 0; c < kDim; ++c) {
            largest_error = std::max(largest_error, std::fabs(decoded[c] - written[c]));
          }
          const bool as_written = got == Stored(codec, h, row, rotated, read.f32);
          bool as_decoded = i >= view.sinks.end;
          for (int c = 0; c < kDim; ++c) {
            as_decoded &= std::fabs(got[c] - written[c]) <= 3 * largest_error;
          }
          EXPECT_TRUE(as_written || as_decoded)
              << "layer " << layer_idx << " head " << h << " logical " << i << " token " << ids[i]
              << (key ? " key" : " value");
        }
        // The one-head view reads the same token.
        EXPECT_EQ(ReadToken(one, 0, i).k, read.k) << "head view, logical " << i;
      }
    }
  }
}

Ids Range(int begin, int end) {
  Ids ids(end - begin);
  std::iota(ids.begin(), ids.end(), begin);
  return ids;
}

Ids Concat(std::initializer_list<Ids> parts) {
  Ids all;
  for (const Ids& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

// Every `stride`-th token plus the newest `tail`, with the sinks.
std::vector<int> Spread(int held, int stride, int tail, int sinks) {
  std::vector<int> keep;
  for (int i = 0; i < held; ++i) {
    if (i < sinks || i % stride == 0 || i >= held - tail) keep.push_back(i);
  }
  return keep;
}

size_t SideBytes(const KvCache& cache, int num_sequences) {
  return static_cast<size_t>(num_sequences) * kNumLayers * 2 * kNumKvHeads * kDim *
         cache.config().sink_tokens * sizeof(float);
}

void ExpectBytesInUse(const KvCache& cache, int num_sequences) {
  const BlockPool& pool = cache.pool();
  EXPECT_EQ(cache.bytes_in_use(),
            (pool.num_blocks() - pool.num_free()) * (cache.bytes_reserved() / pool.num_blocks()) +
                SideBytes(cache, num_sequences));
}

Model NewModel(const KvCache& cache) {
  Model model;
  if (cache.config().layout == LayoutKind::kRing) {
    model.ring_capacity = static_cast<int>(cache.config().capacity);
  }
  model.sink_tokens = cache.config().sink_tokens;
  return model;
}

// Blocks a paged sequence of n tokens holds.
int BlocksFor(const KvCache& cache, int n) {
  const int block_size = cache.config().block_size;
  return (n + block_size - 1) / block_size;
}

// ---- Conformance: every layout, several codecs -------------------------------------------

using ConformanceParam = std::tuple<LayoutCase, std::string>;

class EvictConformanceTest : public ::testing::TestWithParam<ConformanceParam> {};

TEST_P(EvictConformanceTest, KeptTokensMoveForwardAndAppendsLandNewest) {
  const auto& [layout, codec] = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache({.layout = layout, .codec = codec});
  const bool paged = layout.layout == LayoutKind::kPaged;
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(11);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 7, rng, &history, &model);
  AppendBoth(*cache, seq, 23, rng, &history, &model);  // the ring (24) wraps
  ExpectHolds(*cache, seq, history, model);
  const int n = cache->NumTokens(seq);
  const size_t peak_before_eviction = cache->peak_bytes_in_use();
  EXPECT_EQ(peak_before_eviction, cache->bytes_in_use());

  // One head: the others and the other layer are untouched, NumTokens stays.
  const std::vector<int> keep01 = Spread(n, 3, 4, 0);
  ASSERT_TRUE(cache->RetainTokens(seq, 0, 1, keep01).ok());
  model.Retain(0, 1, keep01);
  ExpectHolds(*cache, seq, history, model);
  EXPECT_EQ(cache->NumTokens(seq), n);
  EXPECT_FALSE(cache->View(seq, 0).uniform_heads());
  EXPECT_TRUE(cache->View(seq, 1).uniform_heads());

  // Every head: NumTokens becomes the largest count and (paged) the blocks above it go back.
  const std::vector<int> keep00 = Spread(n, 2, 0, 0);
  std::vector<int> keep10(n / 3);
  std::iota(keep10.begin(), keep10.end(), 0);
  const std::vector<int> keep11 = {n - 1};
  for (const auto& [layer_idx, kv_head, keep] :
       {std::tuple(0, 0, keep00), std::tuple(1, 0, keep10), std::tuple(1, 1, keep11)}) {
    ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, kv_head, keep).ok());
    model.Retain(layer_idx, kv_head, keep);
    ExpectHolds(*cache, seq, history, model);
  }
  EXPECT_EQ(cache->NumTokens(seq), static_cast<int>(std::max(keep00.size(), keep01.size())));
  if (paged) {
    EXPECT_EQ(cache->pool().num_blocks() - cache->pool().num_free(),
              BlocksFor(*cache, cache->NumTokens(seq)));
  }
  ExpectBytesInUse(*cache, 1);
  // The blocks that went back still count in the peak: the sequence needed them.
  EXPECT_EQ(cache->peak_bytes_in_use(), peak_before_eviction);
  if (paged) {
    EXPECT_LT(cache->bytes_in_use(), peak_before_eviction);
  }

  // Appends grow every head as its newest tokens (the ring wraps again and drops the oldest).
  AppendBoth(*cache, seq, 9, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);
  const std::vector<int> keep10b = Spread(cache->HeadTokens(seq, 1, 0), 2, 1, 0);
  ASSERT_TRUE(cache->RetainTokens(seq, 1, 0, keep10b).ok());
  model.Retain(1, 0, keep10b);
  AppendBoth(*cache, seq, 3, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);
  ExpectBytesInUse(*cache, 1);
}

TEST_P(EvictConformanceTest, KeepingEverythingChangesNothing) {
  const auto& [layout, codec] = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache({.layout = layout, .codec = codec});
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(12);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 20, rng, &history, &model);
  std::vector<int> all(20);
  std::iota(all.begin(), all.end(), 0);
  const int num_free = cache->pool().num_free();
  ASSERT_TRUE(cache->RetainTokens(seq, 1, 1, all).ok());
  ExpectHolds(*cache, seq, history, model);
  EXPECT_TRUE(cache->View(seq, 1).head_tokens.empty());
  EXPECT_EQ(cache->pool().num_free(), num_free);
}

// Retaining the same tokens in every head returns the cache to uniform heads.
TEST_P(EvictConformanceTest, EvictingEveryHeadAlikeShrinksTheSequence) {
  const auto& [layout, codec] = GetParam();
  std::unique_ptr<KvCache> cache = MakeCache({.layout = layout, .codec = codec});
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(13);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 10, rng, &history, &model);
  AppendBoth(*cache, seq, 20, rng, &history, &model);
  const std::vector<int> keep = Spread(cache->NumTokens(seq), 4, 2, 0);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, h, keep).ok());
      model.Retain(layer_idx, h, keep);
    }
  }
  ExpectHolds(*cache, seq, history, model);
  EXPECT_EQ(cache->NumTokens(seq), static_cast<int>(keep.size()));
  EXPECT_TRUE(cache->View(seq, 0).head_tokens.empty());
  // The room eviction made is usable: a contiguous sequence takes tokens up to capacity again.
  AppendBoth(*cache, seq, static_cast<int>(layout.capacity) - cache->NumTokens(seq), rng, &history,
             &model);
  ExpectHolds(*cache, seq, history, model);
}

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceParam>& info) {
  std::string codec = std::get<1>(info.param);
  std::replace(codec.begin(), codec.end(), '-', '_');
  return std::get<0>(info.param).name + "_" + codec;
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndCodecs, EvictConformanceTest,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::Values("f32", "f16", "int8", "int4-g8",
                                                              "fp8_e4m3", "q4_absmax",
                                                              "lowrank-r4")),
                         ConformanceName);

// ---- Per layout: sinks, rewrite, errors, forks ------------------------------------------

class EvictLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

// Sinks never move; in a ring that has wrapped they still read from their F32 copies, and
// the tokens the ring drops are each head's oldest after the sinks.
TEST_P(EvictLayoutTest, SinksStayAndRetainedViewsReadRight) {
  std::unique_ptr<KvCache> cache = MakeCache({.layout = GetParam(),
                                              .codec = "f16",
                                              .v_codec = "int8",
                                              .sink_tokens = 3,
                                              .hadamard = true});
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(21);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 10, rng, &history, &model);
  AppendBoth(*cache, seq, 20, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);
  const int n = cache->NumTokens(seq);
  ASSERT_TRUE(cache->RetainTokens(seq, 0, 0, Spread(n, 5, 2, 3)).ok());
  model.Retain(0, 0, Spread(n, 5, 2, 3));
  // The sinks and the newest token: in a full ring this head then holds the newest one.
  ASSERT_TRUE(cache->RetainTokens(seq, 1, 1, Ids{0, 1, 2, n - 1}).ok());
  model.Retain(1, 1, {0, 1, 2, n - 1});
  ExpectHolds(*cache, seq, history, model);
  if (GetParam().layout == LayoutKind::kRing) {
    const absl::Status status = cache->RetainTokens(seq, 1, 0, Ids{0, 1, 2});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("allowed in a ring: at least 4"));
  }
  for (int round = 0; round < 3; ++round) {
    AppendBoth(*cache, seq, 6, rng, &history, &model);
    ExpectHolds(*cache, seq, history, model);
  }
  ExpectBytesInUse(*cache, 1);
}

// The callback sees each moving key as the model wrote it (Hadamard undone) with its old and
// new index; what it writes is what the cache then stores. Values move untouched.
TEST_P(EvictLayoutTest, RewriteSeesFloatKeysAndItsChangesAreStored) {
  for (const bool hadamard : {false, true}) {
    for (const std::string codec : {"f32", "int8"}) {
      SCOPED_TRACE(codec + (hadamard ? " hadamard" : ""));
      std::unique_ptr<KvCache> cache =
          MakeCache({.layout = GetParam(), .codec = codec, .sink_tokens = 2, .hadamard = hadamard});
      const SeqId seq = *cache->AddSequence();
      std::mt19937 rng(31);
      History history;
      Model model = NewModel(*cache);
      AppendBoth(*cache, seq, 8, rng, &history, &model);
      AppendBoth(*cache, seq, 20, rng, &history, &model);
      const int n = cache->NumTokens(seq);
      const std::vector<int> keep = {0, 1, 2, 7, 8, 15, n - 1};
      const std::vector<int> ids = model.ids[1][0];
      std::vector<std::pair<int, int>> calls;
      auto rewrite = [&](int old_index, int new_index, std::span<float> key) {
        calls.emplace_back(old_index, new_index);
        // What the cache held for that token, unrotated again.
        std::vector<float> want =
            Stored(cache->k_codec(1), 0, history.KRow(1, ids[old_index], 0, kDim), hadamard, false);
        if (hadamard) HadamardRotate(want);
        for (int c = 0; c < kDim; ++c) {
          EXPECT_NEAR(key[c], want[c], 1e-5 * (1.0 + std::fabs(want[c]))) << old_index;
          key[c] = 0.5f * new_index - 0.25f * c;
        }
      };
      ASSERT_TRUE(cache->RetainTokens(seq, 1, 0, keep, rewrite).ok());
      // Only keys that move are rewritten: sinks and token 2 keep their place and bytes.
      EXPECT_EQ(calls, (std::vector<std::pair<int, int>>{{7, 3}, {8, 4}, {15, 5}, {n - 1, 6}}));
      model.Retain(1, 0, keep);
      const KvLayerView view = cache->View(seq, 1);
      for (int i = 0; i < static_cast<int>(keep.size()); ++i) {
        const ReadRows read = ReadToken(view, 0, i);
        const std::vector<float>& k = read.k;
        const std::vector<float>& v = read.v;
        std::vector<float> want_k;
        if (i < 3) {
          want_k = Stored(cache->k_codec(1), 0, history.KRow(1, model.ids[1][0][i], 0, kDim),
                          hadamard, i < 2);
        } else {
          std::vector<float> written(kDim);
          for (int c = 0; c < kDim; ++c) written[c] = 0.5f * i - 0.25f * c;
          want_k = Stored(cache->k_codec(1), 0, written, hadamard, false);
        }
        EXPECT_EQ(k, want_k) << i;
        EXPECT_EQ(v, Stored(cache->v_codec(1), 0, history.VRow(1, model.ids[1][0][i], 0, kDim),
                            false, i < 2))
            << i;
      }
    }
  }
}

TEST_P(EvictLayoutTest, BadKeepListsChangeNothing) {
  std::unique_ptr<KvCache> cache =
      MakeCache({.layout = GetParam(), .codec = "int8", .sink_tokens = 2});
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(41);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 20, rng, &history, &model);
  ASSERT_TRUE(cache->RetainTokens(seq, 0, 1, Ids{0, 1, 4, 9, 12}).ok());
  model.Retain(0, 1, {0, 1, 4, 9, 12});
  const int num_free = cache->pool().num_free();
  const size_t bytes = cache->bytes_in_use();
  struct Bad {
    int layer_idx;
    int kv_head;
    std::vector<int> keep;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {0, 0, {0, 1, 5, 3}, "ascending, distinct logical tokens in [0, 20)"},
      {0, 0, {0, 1, 3, 3}, "keep[3] = 3"},
      {0, 0, {0, 1, 20}, "keep[2] = 20"},
      {0, 1, {0, 1, 4, 5}, "in [0, 5)"},  // the head holds 5 now
      {0, 0, {-1, 0, 1}, "keep[0] = -1"},
      {0, 0, {0, 2, 3}, "drops a sink token; allowed: lists that keep logical 0..1"},
      {1, 1, {}, "drops a sink token"},
      {2, 0, {0, 1}, "allowed: layers 0..1, kv heads 0..1"},
      {0, -1, {0, 1}, "allowed: layers 0..1, kv heads 0..1"},
  };
  for (const Bad& b : bad) {
    const absl::Status status = cache->RetainTokens(seq, b.layer_idx, b.kv_head, b.keep);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(status.message(), HasSubstr(b.message));
    EXPECT_EQ(status.message().find('\n'), std::string_view::npos);
  }
  EXPECT_EQ(cache->RetainTokens(seq + 100, 0, 0, Ids{0, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectHolds(*cache, seq, history, model);
  EXPECT_EQ(cache->pool().num_free(), num_free);
  EXPECT_EQ(cache->bytes_in_use(), bytes);
}

// A fork shares the blocks every head has filled; retaining or appending in either sequence
// afterwards never changes the other.
TEST_P(EvictLayoutTest, ForksAreUnaffectedByEachOthersEvictions) {
  std::unique_ptr<KvCache> cache = MakeCache({.layout = GetParam(), .codec = "fp8_e4m3"});
  const SeqId parent = *cache->AddSequence();
  std::mt19937 rng(51);
  History parent_history;
  Model parent_model = NewModel(*cache);
  AppendBoth(*cache, parent, 20, rng, &parent_history, &parent_model);
  // The parent has evicted before the fork: a head holding fewer tokens appends inside blocks
  // that look full by NumTokens, so the fork must not share those.
  ASSERT_TRUE(cache->RetainTokens(parent, 1, 0, Spread(20, 4, 0, 0)).ok());
  parent_model.Retain(1, 0, Spread(20, 4, 0, 0));
  const SeqId child = *cache->ForkSequence(parent);
  History child_history = parent_history;
  Model child_model = parent_model;
  ExpectHolds(*cache, child, child_history, child_model);
  ExpectBytesInUse(*cache, 2);
  AppendBoth(*cache, child, 2, rng, &child_history, &child_model);
  AppendBoth(*cache, parent, 1, rng, &parent_history, &parent_model);
  ExpectHolds(*cache, parent, parent_history, parent_model);
  ExpectHolds(*cache, child, child_history, child_model);

  // A pure truncation (no row moves) in the child, then appends into its tail.
  std::vector<int> prefix(5);
  std::iota(prefix.begin(), prefix.end(), 0);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      ASSERT_TRUE(cache->RetainTokens(child, layer_idx, h, prefix).ok());
      child_model.Retain(layer_idx, h, prefix);
    }
  }
  AppendBoth(*cache, child, 6, rng, &child_history, &child_model);
  ExpectHolds(*cache, parent, parent_history, parent_model);
  ExpectHolds(*cache, child, child_history, child_model);

  // Moves in the parent and appends to both.
  ASSERT_TRUE(cache->RetainTokens(parent, 0, 1, Ids{2, 3, 9, 20}).ok());
  parent_model.Retain(0, 1, {2, 3, 9, 20});
  AppendBoth(*cache, parent, 4, rng, &parent_history, &parent_model);
  AppendBoth(*cache, child, 2, rng, &child_history, &child_model);
  ExpectHolds(*cache, parent, parent_history, parent_model);
  ExpectHolds(*cache, child, child_history, child_model);
  ExpectBytesInUse(*cache, 2);

  ASSERT_TRUE(cache->RemoveSequence(child).ok());
  ASSERT_TRUE(cache->RemoveSequence(parent).ok());
  EXPECT_EQ(cache->pool().num_free(), cache->pool().num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Layouts, EvictLayoutTest, ::testing::ValuesIn(kLayouts),
                         [](const auto& info) { return info.param.name; });

// ---- Paged specifics and refusals ---------------------------------------------------------

// A retain in a fork first copies every shared block from the one holding the first row it
// moves (those rows change, and the head's next appends write above its new count); the
// parent keeps its bytes and trimmed blocks go back to the pool once nobody holds them.
TEST(EvictPagedTest, CopiesSharedBlocksOnWriteAndFreesTrimmedOnes) {
  std::unique_ptr<KvCache> cache = MakeCache({.layout = kLayouts[2], .codec = "f32"});  // paged3
  const BlockPool& pool = cache->pool();
  const SeqId parent = *cache->AddSequence();
  std::mt19937 rng(61);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, parent, 18, rng, &history, &model);  // six full blocks
  const SeqId child = *cache->ForkSequence(parent);
  EXPECT_EQ(pool.num_blocks() - pool.num_free(), 6);  // all shared
  // Keeping {0, 1, 2, 4} moves row 4 to row 3: blocks 1..5 get copies, block 0 stays shared.
  ASSERT_TRUE(cache->RetainTokens(child, 0, 0, Ids{0, 1, 2, 4}).ok());
  EXPECT_EQ(pool.num_blocks() - pool.num_free(), 11);
  Model child_model = model;
  child_model.Retain(0, 0, {0, 1, 2, 4});
  // Every other head of the child down to 7 tokens: its copies of blocks 3..5 go back.
  std::vector<int> seven(7);
  std::iota(seven.begin(), seven.end(), 0);
  for (const auto& [layer_idx, h] : {std::pair(0, 1), std::pair(1, 0), std::pair(1, 1)}) {
    ASSERT_TRUE(cache->RetainTokens(child, layer_idx, h, seven).ok());
    child_model.Retain(layer_idx, h, seven);
  }
  EXPECT_EQ(cache->NumTokens(child), 7);
  EXPECT_EQ(pool.num_blocks() - pool.num_free(), 8);
  History child_history = history;
  AppendBoth(*cache, child, 2, rng, &child_history, &child_model);
  ExpectHolds(*cache, parent, history, model);
  ExpectHolds(*cache, child, child_history, child_model);
  ExpectBytesInUse(*cache, 2);
  // The parent down to one token: it copies block 0 (its next append writes row 1 there) and
  // frees blocks 1..5, which only it held.
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      ASSERT_TRUE(cache->RetainTokens(parent, layer_idx, h, Ids{0}).ok());
      model.Retain(layer_idx, h, {0});
    }
  }
  EXPECT_EQ(pool.num_blocks() - pool.num_free(), 4);  // parent: 0'; child: 0, 1', 2'
  AppendBoth(*cache, parent, 2, rng, &history, &model);
  ExpectHolds(*cache, parent, history, model);
  ExpectHolds(*cache, child, child_history, child_model);
  ExpectBytesInUse(*cache, 2);
}

// ---- Units of several tokens and recent windows ------------------------------------------

struct UnitsCase {
  std::string name;
  CacheCase c;
};

void PrintTo(const UnitsCase& units, std::ostream* os) { *os << units.name; }

// Lossless packed units (every token read back must equal what was written, bit for bit) and
// recent windows, in the contiguous and paged layouts (a ring needs one-token units and no
// recent window).
const LayoutCase kPaged4 = {"paged4", LayoutKind::kPaged, 4};
const UnitsCase kUnitsCases[] = {
    {"packed4k_packed2v_contiguous",
     {.layout = kLayouts[0], .codec = "f32", .v_codec = "f16", .packed = {{"f32", 4}, {"f16", 2}}}},
    {"packed8_sinks3_hadamard_paged16",
     {.layout = kLayouts[1],
      .codec = "f32",
      .sink_tokens = 3,
      .hadamard = true,
      .packed = {{"f32", 8}}}},
    {"packed4k_f16v_recent8_sinks2_paged4",
     {.layout = kPaged4,
      .codec = "f32",
      .v_codec = "f16",
      .sink_tokens = 2,
      .recent_tokens = 8,
      .packed = {{"f32", 4}}}},
    {"int8_recent6_paged3", {.layout = kLayouts[2], .codec = "int8", .recent_tokens = 6}},
};

class EvictUnitsTest : public ::testing::TestWithParam<UnitsCase> {};

TEST_P(EvictUnitsTest, KeptTokensMoveForwardThroughUnitsAndPendingRows) {
  std::unique_ptr<KvCache> cache = MakeCache(GetParam().c);
  const int sinks = GetParam().c.sink_tokens;
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(91);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 7, rng, &history, &model);
  AppendBoth(*cache, seq, 23, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);
  const int n = cache->NumTokens(seq);

  // Single heads, in the middle of units, in the pending rows, and a pure truncation.
  std::vector<int> prefix(n - 5);
  std::iota(prefix.begin(), prefix.end(), 0);
  for (const auto& [layer_idx, kv_head, keep] :
       {std::tuple(0, 1, Spread(n, 3, 4, sinks)), std::tuple(1, 0, Spread(n, 2, 0, sinks)),
        std::tuple(1, 1, prefix)}) {
    ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, kv_head, keep).ok());
    model.Retain(layer_idx, kv_head, keep);
    ExpectHolds(*cache, seq, history, model);
  }
  // Appends fill each head's units and pending rows at its own count.
  for (const int num_new : {1, 5, 2}) {
    AppendBoth(*cache, seq, num_new, rng, &history, &model);
    ExpectHolds(*cache, seq, history, model);
  }
  // Retains again, every head, then appends past several periods.
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      const std::vector<int> keep =
          Spread(cache->HeadTokens(seq, layer_idx, h), 2 + h + layer_idx, 3, sinks);
      ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, h, keep).ok());
      model.Retain(layer_idx, h, keep);
    }
  }
  ExpectHolds(*cache, seq, history, model);
  AppendBoth(*cache, seq, 11, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);

  // A fork shares only what every head holds encoded; evictions in either leave the other.
  const SeqId child = *cache->ForkSequence(seq);
  History child_history = history;
  Model child_model = model;
  ASSERT_TRUE(
      cache->RetainTokens(child, 0, 0, Spread(cache->HeadTokens(child, 0, 0), 3, 1, sinks)).ok());
  child_model.Retain(0, 0, Spread(cache->HeadTokens(seq, 0, 0), 3, 1, sinks));
  AppendBoth(*cache, child, 3, rng, &child_history, &child_model);
  AppendBoth(*cache, seq, 2, rng, &history, &model);
  ExpectHolds(*cache, seq, history, model);
  ExpectHolds(*cache, child, child_history, child_model);
}

// The rewrite callback sees each moving key in F32 as stored (Hadamard undone), and what it
// writes is what the cache then holds, in units and pending rows alike.
TEST_P(EvictUnitsTest, RewrittenKeysAreStored) {
  std::unique_ptr<KvCache> cache = MakeCache(GetParam().c);
  const int sinks = GetParam().c.sink_tokens;
  const bool hadamard = GetParam().c.hadamard;
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(92);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 30, rng, &history, &model);
  const std::vector<int> keep = Spread(30, 3, 5, sinks);
  const std::vector<int> ids = model.ids[0][1];
  std::vector<int> moved;
  auto rewrite = [&](int old_index, int new_index, std::span<float> key) {
    moved.push_back(new_index);
    // The key as written (a pending token) or as its unit decodes it (an encoded one).
    bool near_one = false;
    for (const bool f32 : {true, false}) {
      std::vector<float> want =
          Stored(cache->k_codec(0), 1, history.KRow(0, ids[old_index], 1, kDim), hadamard, f32);
      if (hadamard) HadamardRotate(want);
      bool near = true;
      for (int c = 0; c < kDim; ++c)
        near &= std::fabs(key[c] - want[c]) <= 1e-5 * (1 + std::fabs(want[c]));
      near_one |= near;
    }
    EXPECT_TRUE(near_one) << old_index;
    for (int c = 0; c < kDim; ++c) key[c] = 0.5f * new_index - 0.25f * c;
  };
  ASSERT_TRUE(cache->RetainTokens(seq, 0, 1, keep, rewrite).ok());
  model.Retain(0, 1, keep);
  ASSERT_FALSE(moved.empty());
  const KvLayerView view = cache->View(seq, 0);
  for (int i = 0; i < static_cast<int>(keep.size()); ++i) {
    const ReadRows read = ReadToken(view, 1, i);
    std::vector<float> written(kDim);
    for (int c = 0; c < kDim; ++c) written[c] = 0.5f * i - 0.25f * c;
    const bool was_moved = std::find(moved.begin(), moved.end(), i) != moved.end();
    EXPECT_EQ(was_moved, keep[i] != i) << i;
    const std::span<const float> original = history.KRow(0, model.ids[0][1][i], 1, kDim);
    EXPECT_EQ(read.k,
              Stored(cache->k_codec(0), 1, was_moved ? std::span<const float>(written) : original,
                     hadamard, read.f32))
        << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Units, EvictUnitsTest, ::testing::ValuesIn(kUnitsCases),
                         [](const auto& info) { return info.param.name; });

// The real codecs that group tokens: KIVI keys (per channel over 8 tokens) and int4 groups of
// 16 elements (2 tokens of 8), with sinks and a recent window. Re-encoded tokens are
// re-rounded (also those an eviction sends back to the pending rows), so each token must lie
// within the rounding of the encodes it went through (at most three here, each half a step of
// range / 15) of what was written; sinks exactly.
TEST(EvictRealUnitsTest, KiviAndLongGroupsStayWithinTheirRounding) {
  for (const LayoutCase& layout : {kLayouts[0], kLayouts[1]}) {
    SCOPED_TRACE(layout.name);
    std::unique_ptr<KvCache> cache = MakeCache({.layout = layout,
                                                .codec = "kivi4-g8",
                                                .v_codec = "int4-g16",
                                                .sink_tokens = 2,
                                                .recent_tokens = 8});
    const SeqId seq = *cache->AddSequence();
    std::mt19937 rng(93);
    History history;
    Model model = NewModel(*cache);
    AppendBoth(*cache, seq, 36, rng, &history, &model);
    for (const int round : {0, 1}) {
      for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
        for (int h = 0; h < kNumKvHeads; ++h) {
          const std::vector<int> keep =
              Spread(cache->HeadTokens(seq, layer_idx, h), 2 + h + round, 2, 2);
          ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, h, keep).ok());
          model.Retain(layer_idx, h, keep);
        }
      }
      AppendBoth(*cache, seq, 5, rng, &history, &model);
    }
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      const KvLayerView view = cache->View(seq, layer_idx);
      for (int h = 0; h < kNumKvHeads; ++h) {
        const std::vector<int>& ids = model.ids[layer_idx][h];
        for (const bool key : {true, false}) {
          float lo = 0, hi = 0;
          for (int id = 0; id < history.num_appended(); ++id) {
            for (float x : key ? history.KRow(layer_idx, id, h, kDim)
                               : history.VRow(layer_idx, id, h, kDim)) {
              lo = std::min(lo, x);
              hi = std::max(hi, x);
            }
          }
          const float bound = 3 * 0.5f * (hi - lo) / 15;
          for (int i = 0; i < static_cast<int>(ids.size()); ++i) {
            const ReadRows read = ReadToken(view, h, i);
            const std::span<const float> want = key ? history.KRow(layer_idx, ids[i], h, kDim)
                                                    : history.VRow(layer_idx, ids[i], h, kDim);
            const std::vector<float>& got = key ? read.k : read.v;
            for (int c = 0; c < kDim; ++c) {
              ASSERT_NEAR(got[c], want[c], i < view.sinks.end ? 0.0f : bound)
                  << "layer " << layer_idx << " head " << h << " logical " << i
                  << (key ? " key" : " value") << " channel " << c;
            }
          }
        }
      }
    }
  }
}

// A keep list of whole encoded units (what the Evictor asks for with such codecs) moves them
// as bytes: every kept token reads back exactly as before — units that move, units that stay,
// a unit that the new count sends back to the pending rows, and pending rows.
TEST(EvictRealUnitsTest, WholeUnitsMoveExactly) {
  for (const LayoutCase& layout : {kLayouts[0], kLayouts[1]}) {
    SCOPED_TRACE(layout.name);
    std::unique_ptr<KvCache> cache = MakeCache({.layout = layout,
                                                .codec = "kivi2-g8",
                                                .v_codec = "int4-g16",
                                                .sink_tokens = 2,
                                                .recent_tokens = 8});
    const SeqId seq = *cache->AddSequence();
    std::mt19937 rng(94);
    History history;
    Append(*cache, seq, 45, rng, &history);  // units [0, 32), pending [32, 45)
    // Layer 0: units 0 and 2 and the pending rows; layer 1: units 0-3 and the newest 5.
    const Ids keeps[kNumLayers] = {Concat({Range(0, 8), Range(16, 24), Range(32, 45)}),
                                   Concat({Range(0, 32), Range(40, 45)})};
    std::vector<ReadRows> before[kNumLayers][kNumKvHeads];
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      for (int h = 0; h < kNumKvHeads; ++h) {
        const KvLayerView view = cache->View(seq, layer_idx);  // a retain invalidates views
        for (int i = 0; i < 45; ++i) before[layer_idx][h].push_back(ReadToken(view, h, i));
        ASSERT_TRUE(cache->RetainTokens(seq, layer_idx, h, keeps[layer_idx]).ok());
      }
    }
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      const KvLayerView view = cache->View(seq, layer_idx);
      const Ids& keep = keeps[layer_idx];
      for (int h = 0; h < kNumKvHeads; ++h) {
        for (int j = 0; j < static_cast<int>(keep.size()); ++j) {
          const ReadRows read = ReadToken(view, h, j);
          EXPECT_EQ(read.k, before[layer_idx][h][keep[j]].k) << layer_idx << " " << h << " " << j;
          EXPECT_EQ(read.v, before[layer_idx][h][keep[j]].v) << layer_idx << " " << h << " " << j;
        }
      }
    }
  }
}

// The low-rank codec has a basis per kv head: rows moved as bytes and rewritten keys must
// both decode with their own head's basis.
TEST(EvictLowRankTest, RewrittenKeysUseTheirHeadsBasis) {
  std::unique_ptr<KvCache> cache = MakeCache({.layout = kLayouts[1], .codec = "lowrank-r4"});
  const SeqId seq = *cache->AddSequence();
  std::mt19937 rng(81);
  History history;
  Model model = NewModel(*cache);
  AppendBoth(*cache, seq, 12, rng, &history, &model);
  const std::vector<int> ids = model.ids[0][1];
  const auto identity = [&](int old_index, int, std::span<float> key) {
    const std::vector<float> want =
        Stored(cache->k_codec(0), 1, history.KRow(0, ids[old_index], 1, kDim), false, false);
    for (int c = 0; c < kDim; ++c) EXPECT_FLOAT_EQ(key[c], want[c]);
  };
  ASSERT_TRUE(cache->RetainTokens(seq, 0, 1, Ids{1, 5, 11}, identity).ok());
  model.Retain(0, 1, {1, 5, 11});
  // Re-encoding a decoded low-rank key gives it back up to rounding.
  const KvLayerView view = cache->View(seq, 0);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> k = ReadToken(view, 1, i).k;
    const std::vector<float> want =
        Stored(cache->k_codec(0), 1, history.KRow(0, model.ids[0][1][i], 1, kDim), false, false);
    for (int c = 0; c < kDim; ++c) EXPECT_NEAR(k[c], want[c], 1e-3 * (1 + std::fabs(want[c])));
  }
}

}  // namespace
}  // namespace kvstack
