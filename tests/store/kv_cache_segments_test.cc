// Tests of KvCache's representation features: codecs whose units hold several tokens (the
// pending F32 segment), F32 attention sinks, Hadamard-rotated keys and per-layer codecs. The
// conformance suite runs every layout with several codec set-ups through one check: every
// logical token read back through View() — sinks and pending from the F32 segments, arena
// tokens by decoding their whole unit at the address kv_view.h defines — equals what was
// written (exactly for F32, within the codec's rounding otherwise).
//
// Multi-token units come from PackedF32Codec (packed_test_codec.h): lossless, so a unit
// encoded before all its tokens arrived, or read at the wrong address, decodes to NaN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache_test_util.h"
#include "kvstack/kv_cache.h"
#include "packed_test_codec.h"
#include "represent/hadamard.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

using namespace cache_test;  // NOLINT: the shared shape and helpers of the cache suites

KvConfig::LayerCodecs Override(int layer_idx, std::string k_codec, std::string v_codec) {
  KvConfig::LayerCodecs entry;
  entry.layer_idx = layer_idx;
  entry.k_codec = std::move(k_codec);
  entry.v_codec = std::move(v_codec);
  return entry;
}

// Round-trip bound relative to |x| for values in the normal range, for the plain formats;
// quantising codecs have their own accuracy tests.
std::optional<double> Tolerance(std::string_view codec) {
  if (codec == "f16") return 0x1p-11;
  if (codec == "bf16") return 0x1p-8;
  if (codec == "f32" || codec.starts_with("packed")) return 0.0;
  return std::nullopt;
}

struct Setup {
  std::string name;
  std::string k_codec = "f32";
  std::string v_codec = "f32";
  PackedNames packed = {};
  std::vector<KvConfig::LayerCodecs> layer_codecs = {};
  int sink_tokens = 0;
  int recent_tokens = 0;
  bool hadamard = false;
  bool one_token_units = true;                   // whether the ring can run it
  std::array<int, kNumLayers> periods = {1, 1};  // lcm(Tk, Tv) per layer
};

const Setup kSetups[] = {
    {.name = "f32"},
    {.name = "f16_bf16_sinks3_hadamard",
     .k_codec = "f16",
     .v_codec = "bf16",
     .sink_tokens = 3,
     .hadamard = true},
    {.name = "bf16_per_layer_sinks1",
     .k_codec = "bf16",
     .v_codec = "f16",
     .layer_codecs = {Override(1, "f32", "")},
     .sink_tokens = 1},
    // Layer 0: K units of 4 tokens, V of 2 (period 4); layer 1: K one-token bf16, V packed2.
    {.name = "units4x2_layer1_units1x2",
     .k_codec = "f32",
     .v_codec = "f16",
     .packed = {{"f32", 4}, {"f16", 2}},
     .layer_codecs = {Override(1, "bf16", "")},
     .one_token_units = false,
     .periods = {4, 2}},
    // Period 8 with sinks that end inside the first unit, keys rotated, layer 0's V real f16.
    {.name = "units8_sinks5_hadamard",
     .k_codec = "f32",
     .v_codec = "bf16",
     .packed = {{"f32", 8}},
     .layer_codecs = {Override(0, "", "f16")},
     .sink_tokens = 5,
     .hadamard = true,
     .one_token_units = false,
     .periods = {8, 8}},
    // The real quantising codecs: KIVI keys per channel over 8 tokens, int4 groups of 16
    // elements spanning 4 tokens of head_dim 4 (period 8 in layer 0), int8 rows in layer 1.
    {.name = "kivi4g8_int4g16_layer1_int8",
     .k_codec = "kivi4-g8",
     .v_codec = "int4-g16",
     .layer_codecs = {Override(1, "int8", "int8")},
     .sink_tokens = 2,
     .hadamard = true,
     .one_token_units = false,
     .periods = {8, 1}},
    // KIVI's residual: the last 16 tokens stay F32, older whole units are encoded.
    {.name = "kivi4g8_recent16_sinks2",
     .k_codec = "kivi4-g8",
     .v_codec = "int4-g8",
     .sink_tokens = 2,
     .recent_tokens = 16,
     .one_token_units = false,
     .periods = {8, 8}},
    {.name = "int8_recent8",
     .k_codec = "int8",
     .v_codec = "int8",
     .recent_tokens = 8,
     .one_token_units = false},
    {.name = "int8_q4absmax_fp8_layer1",
     .k_codec = "int8",
     .v_codec = "q4_absmax",
     .layer_codecs = {Override(1, "fp8_e4m3", "fp8_e5m2")}},
};

struct Params {
  LayoutKind layout;
  Setup setup;
};

std::unique_ptr<KvCache> MakeCache(const Params& params, int64_t capacity, int max_sequences) {
  KvCacheOptions options;
  options.num_layers = kNumLayers;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kHeadDim;
  options.config.layout = params.layout;
  options.config.capacity = capacity;
  options.config.block_size = 8;
  options.config.max_sequences = max_sequences;
  options.config.k_codec = params.setup.k_codec;
  options.config.v_codec = params.setup.v_codec;
  options.config.layer_codecs = params.setup.layer_codecs;
  options.config.sink_tokens = params.setup.sink_tokens;
  options.config.recent_tokens = params.setup.recent_tokens;
  options.config.hadamard_keys = params.setup.hadamard;
  options.codec_factory = Factory(params.setup.packed);
  auto cache = KvCache::Create(options);
  KVS_CHECK(cache.ok());
  return std::move(*cache);
}

// One head's row of logical token i read from the arena: decodes the whole unit holding it.
std::vector<float> ArenaRow(const KvLayerView& view, const KvArenaView& arena, int logical,
                            int kv_head) {
  const int slot = (view.first_slot + logical) % view.num_slots();
  const int32_t block_id = view.block_table[slot / view.block_size];
  const int row = slot % view.block_size;
  std::vector<float> unit(static_cast<size_t>(arena.group_tokens) * kHeadDim);
  arena.codec_impl->DecodeHead(
      kv_head, {arena.Unit(block_id, row / arena.group_tokens, kv_head), arena.unit_bytes}, unit);
  const auto first = unit.begin() + (row % arena.group_tokens) * kHeadDim;
  return std::vector<float>(first, first + kHeadDim);
}

void ExpectRow(std::span<const float> got, std::span<const float> want, double tolerance,
               const std::string& where) {
  for (int c = 0; c < kHeadDim; ++c) {
    ASSERT_LE(std::abs(got[c] - want[c]), tolerance * std::abs(want[c]))
        << where << " channel " << c << ": got " << got[c] << " want " << want[c];
  }
}

// Checks every logical token of the sequence in every layer against the history: logical
// token i is appended token i for sinks (i < S) and appended token num_appended -
// num_tokens + i otherwise (the two agree until a ring wraps). F32 segments must hold the
// tokens exactly; an arena token must equal the codec's own round trip of the unit that
// holds it (so the cache stored the right tokens in the right unit) and, for the plain
// formats, lie within their rounding of the token.
void ExpectContents(const KvCache& cache, SeqId seq_id, const History& history) {
  const int num_tokens = cache.NumTokens(seq_id);
  const int sink_tokens = cache.config().sink_tokens;
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache.View(seq_id, layer_idx);
    ASSERT_EQ(view.num_tokens, num_tokens);
    ASSERT_EQ(view.keys_rotated, cache.config().hadamard_keys);
    const int period = std::max(view.k.group_tokens, view.v.group_tokens);
    EXPECT_EQ(view.sinks.begin, 0);
    EXPECT_EQ(view.sinks.end, std::min(sink_tokens, num_tokens));
    // The pending buffer is circular from logical 0; it starts after the last whole unit
    // older than the recent window.
    const int recent = cache.config().recent_tokens;
    const int settled = std::max(0, num_tokens - recent);
    EXPECT_EQ(view.pending.origin, 0);
    EXPECT_EQ(view.pending.begin, std::max(settled - settled % period, view.sinks.end));
    EXPECT_EQ(view.pending.end, num_tokens);
    EXPECT_EQ(view.pending.num_tokens() == 0,
              (recent == 0 && num_tokens % period == 0) || num_tokens <= sink_tokens)
        << "layer " << layer_idx << " num_tokens " << num_tokens;
    // Head-major arenas: [head][block][units].
    const size_t num_blocks = static_cast<size_t>(cache.pool().num_blocks());
    EXPECT_EQ(view.k.block_stride,
              static_cast<size_t>(view.block_size / view.k.group_tokens) * view.k.unit_bytes);
    EXPECT_EQ(view.v.block_stride,
              static_cast<size_t>(view.block_size / view.v.group_tokens) * view.v.unit_bytes);
    EXPECT_EQ(view.k.head_stride, num_blocks * view.k.block_stride);
    EXPECT_EQ(view.v.head_stride, num_blocks * view.v.block_stride);

    // The row written for logical token i, head h (keys rotated as the cache must store them).
    auto want = [&](bool key, int i, int h) {
      const int appended = i < sink_tokens ? i : history.num_appended() - num_tokens + i;
      const std::vector<float>& all = key ? history.k[layer_idx] : history.v[layer_idx];
      const auto first = all.begin() + (static_cast<size_t>(appended) * kNumKvHeads + h) * kHeadDim;
      std::vector<float> row(first, first + kHeadDim);
      if (key && view.keys_rotated) HadamardRotate(row);
      return row;
    };
    // What the arena must hold for token i: its unit's tokens encoded and decoded by the codec.
    // Arena units of a non-ring layout start at logical multiples of T (first_slot is 0 and
    // blocks hold whole units); the ring has T = 1.
    // Sink tokens in a multi-token period are encoded as the period's last token (they are
    // read from their F32 copies, and must not widen the scales the others share).
    auto round_trip = [&](bool key, const KvArenaView& arena, int i, int h) {
      const int unit_first = i - i % arena.group_tokens;
      const int period_last = i - i % period + period - 1;
      std::vector<float> unit;
      for (int t = unit_first; t < unit_first + arena.group_tokens; ++t) {
        const std::vector<float> row =
            want(key, period > 1 && t < sink_tokens ? period_last : t, h);
        unit.insert(unit.end(), row.begin(), row.end());
      }
      std::vector<std::byte> bytes(arena.unit_bytes);
      arena.codec_impl->EncodeHead(h, unit, bytes);
      arena.codec_impl->DecodeHead(h, bytes, unit);
      const auto first = unit.begin() + (i - unit_first) * kHeadDim;
      return std::vector<float>(first, first + kHeadDim);
    };

    for (int i = 0; i < num_tokens; ++i) {
      for (int h = 0; h < kNumKvHeads; ++h) {
        const std::string where = "layer " + std::to_string(layer_idx) + " token " +
                                  std::to_string(i) + " head " + std::to_string(h);
        if (i < view.sinks.end) {
          ExpectRow({view.sinks.KRow(i, h, kHeadDim), kHeadDim}, want(true, i, h), 0.0,
                    where + " sink k");
          ExpectRow({view.sinks.VRow(i, h, kHeadDim), kHeadDim}, want(false, i, h), 0.0,
                    where + " sink v");
        } else if (i >= view.pending.begin) {
          ExpectRow({view.pending.KRow(i, h, kHeadDim), kHeadDim}, want(true, i, h), 0.0,
                    where + " pending k");
          ExpectRow({view.pending.VRow(i, h, kHeadDim), kHeadDim}, want(false, i, h), 0.0,
                    where + " pending v");
        } else {
          ASSERT_GE(i, view.arena_begin());
          ASSERT_LT(i, view.arena_end());
          for (const bool key : {true, false}) {
            const KvArenaView& arena = key ? view.k : view.v;
            const std::vector<float> got = ArenaRow(view, arena, i, h);
            const std::string what = where + (key ? " arena k" : " arena v");
            ExpectRow(got, round_trip(key, arena, i, h), 0.0, what + " (codec round trip)");
            if (const std::optional<double> tolerance = Tolerance(arena.codec_impl->name())) {
              ExpectRow(got, want(key, i, h), *tolerance, what);
            }
          }
        }
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

class KvCacheSegmentsTest : public ::testing::TestWithParam<Params> {
 protected:
  bool ring() const { return GetParam().layout == LayoutKind::kRing; }
  // The ring is short enough to wrap; appends stay within its capacity.
  int64_t Capacity() const { return ring() ? 20 : 64; }
  std::vector<int> Appends() const {
    if (ring()) return {1, 7, 13, 1, 1, 2, 9, 20, 3};
    return {1, 7, 33, 1, 1, 2, 9};
  }
  std::mt19937 rng_{23};
};

TEST_P(KvCacheSegmentsTest, EveryLogicalTokenReadsBackAsWritten) {
  auto cache = MakeCache(GetParam(), Capacity(), 1);
  const SeqId seq_id = *cache->AddSequence();
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache->View(seq_id, layer_idx);
    EXPECT_EQ(std::max(view.k.group_tokens, view.v.group_tokens),
              GetParam().setup.periods[layer_idx])
        << "layer " << layer_idx;
  }
  History history;
  for (const int num_new : Appends()) {
    ASSERT_NO_FATAL_FAILURE(Append(*cache, seq_id, num_new, rng_, &history));
    ASSERT_NO_FATAL_FAILURE(ExpectContents(*cache, seq_id, history));
  }
}

TEST_P(KvCacheSegmentsTest, PrefillInOneWriteEqualsTokenByTokenWrites) {
  auto whole = MakeCache(GetParam(), Capacity(), 1);
  auto single = MakeCache(GetParam(), Capacity(), 1);
  const SeqId a = *whole->AddSequence();
  const SeqId b = *single->AddSequence();
  std::mt19937 rng_a(9);
  std::mt19937 rng_b(9);
  History history_a;
  History history_b;
  ASSERT_NO_FATAL_FAILURE(Append(*whole, a, 19, rng_a, &history_a));
  for (int t = 0; t < 19; ++t) ASSERT_NO_FATAL_FAILURE(Append(*single, b, 1, rng_b, &history_b));
  ASSERT_NO_FATAL_FAILURE(ExpectContents(*whole, a, history_a));
  ASSERT_NO_FATAL_FAILURE(ExpectContents(*single, b, history_b));
}

TEST_P(KvCacheSegmentsTest, ForkCopiesSinksAndPendingTokens) {
  auto cache = MakeCache(GetParam(), Capacity(), 2);
  const SeqId parent = *cache->AddSequence();
  History parent_history;
  ASSERT_NO_FATAL_FAILURE(Append(*cache, parent, 11, rng_, &parent_history));  // mid-unit
  const SeqId child = *cache->ForkSequence(parent);
  History child_history = parent_history;
  ASSERT_NO_FATAL_FAILURE(ExpectContents(*cache, child, child_history));
  // Each completes the open unit with different tokens; neither sees the other's.
  ASSERT_NO_FATAL_FAILURE(Append(*cache, parent, 6, rng_, &parent_history));
  ASSERT_NO_FATAL_FAILURE(Append(*cache, child, 5, rng_, &child_history));
  ASSERT_NO_FATAL_FAILURE(ExpectContents(*cache, parent, parent_history));
  ASSERT_NO_FATAL_FAILURE(ExpectContents(*cache, child, child_history));
}

std::vector<Params> AllParams() {
  std::vector<Params> params;
  for (const LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged, LayoutKind::kRing}) {
    for (const Setup& setup : kSetups) {
      if (layout == LayoutKind::kRing && !setup.one_token_units) continue;
      params.push_back({layout, setup});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndCodecs, KvCacheSegmentsTest, ::testing::ValuesIn(AllParams()),
                         [](const auto& info) {
                           return std::string(LayoutName(info.param.layout)) + "_" +
                                  info.param.setup.name;
                         });

// Tokens whose values name them: channel c of head h of appended token p is p*100 + h*10 + c.
std::vector<float> NamedTokens(int first, int count) {
  std::vector<float> out;
  for (int p = first; p < first + count; ++p) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      for (int c = 0; c < kHeadDim; ++c) out.push_back(p * 100.0f + h * 10 + c);
    }
  }
  return out;
}

TEST(KvCacheSinksTest, WrappedRingHoldsTheSinksThenTheMostRecentTokens) {
  Params params{.layout = LayoutKind::kRing, .setup = {.name = "ring", .sink_tokens = 2}};
  auto cache = MakeCache(params, 6, 1);
  const SeqId seq_id = *cache->AddSequence();
  int appended = 0;
  for (const int num_new : {4, 5}) {
    ASSERT_TRUE(cache->CommitAppend(*cache->PlanAppend(seq_id, num_new)).ok());
    const std::vector<float> tokens = NamedTokens(appended, num_new);
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      cache->Write(seq_id, layer_idx, cache->NumTokens(seq_id) - num_new, tokens, tokens);
    }
    appended += num_new;
  }
  // 9 appended into 6 slots: sinks 0, 1, then the 4 most recent: 5, 6, 7, 8.
  const KvLayerView view = cache->View(seq_id, 1);
  ASSERT_EQ(view.num_tokens, 6);
  EXPECT_EQ(view.arena_begin(), 2);
  EXPECT_EQ(view.arena_end(), 6);
  const int expected[] = {0, 1, 5, 6, 7, 8};
  for (int i = 0; i < 6; ++i) {
    const float* row = i < view.sinks.end ? view.sinks.VRow(i, 1, kHeadDim) : nullptr;
    std::vector<float> arena_row;
    if (row == nullptr) {
      arena_row = ArenaRow(view, view.v, i, 1);
      row = arena_row.data();
    }
    EXPECT_EQ(row[2], expected[i] * 100.0f + 12) << "logical " << i;
  }
}

TEST(KvCacheHadamardTest, StoredKeyIsHTimesKeyAndValuesAreNotRotated) {
  Params params{.layout = LayoutKind::kPaged, .setup = {.name = "h", .hadamard = true}};
  auto cache = MakeCache(params, 16, 1);
  const SeqId seq_id = *cache->AddSequence();
  ASSERT_TRUE(cache->CommitAppend(*cache->PlanAppend(seq_id, 1)).ok());
  const std::vector<float> k = {1.0f, 2.0f, -3.0f, 0.5f, 4.0f, 0.0f, 1.0f, -2.0f};
  const std::vector<float> v = {5.0f, 6.0f, 7.0f, 8.0f, -1.0f, -2.0f, -3.0f, -4.0f};
  cache->Write(seq_id, 0, 0, k, v);
  // The orthonormal 4x4 Sylvester Hadamard matrix, written out.
  const float h4[4][4] = {{1, 1, 1, 1}, {1, -1, 1, -1}, {1, 1, -1, -1}, {1, -1, -1, 1}};
  const KvLayerView view = cache->View(seq_id, 0);
  EXPECT_TRUE(view.keys_rotated);
  for (int h = 0; h < kNumKvHeads; ++h) {
    std::vector<float> stored = ArenaRow(view, view.k, 0, h);
    for (int r = 0; r < 4; ++r) {
      float want = 0.0f;
      for (int c = 0; c < 4; ++c) want += 0.5f * h4[r][c] * k[h * 4 + c];
      EXPECT_NEAR(stored[r], want, 1e-6f) << "head " << h << " row " << r;
    }
    HadamardRotate(stored);  // H is its own inverse
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(stored[c], k[h * 4 + c], 1e-6f);
    const std::vector<float> stored_v = ArenaRow(view, view.v, 0, h);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(stored_v[c], v[h * 4 + c]);
  }
}

TEST(KvCacheAccountingTest, FractionalBytesPerTokenSideBuffersAndPeakInUse) {
  // K: 8-token units of 8*4 floats + a 4-byte checksum = 132 bytes; V: bf16, 8 bytes a token.
  Params params{
      .layout = LayoutKind::kPaged,
      .setup = {.name = "acct", .v_codec = "bf16", .packed = {{"f32", 8}}, .sink_tokens = 2}};
  auto cache = MakeCache(params, 64, 1);  // 8 blocks of 8
  const double per_head = 132.0 / 8 + 8.0;
  EXPECT_DOUBLE_EQ(cache->bytes_per_token(), kNumLayers * kNumKvHeads * per_head);
  EXPECT_DOUBLE_EQ(cache->bits_per_element(), 8.0 * per_head / (2 * kHeadDim));
  const size_t block_bytes = kNumLayers * kNumKvHeads * (132 + 8 * 8);
  EXPECT_EQ(cache->bytes_reserved(), 8 * block_bytes);
  EXPECT_EQ(cache->bytes_in_use(), 0u);

  const SeqId seq_id = *cache->AddSequence();
  // Per layer: K and V buffers of num_kv_heads x (2 sinks + 8 pending) rows of head_dim F32.
  const size_t side_bytes = kNumLayers * 2 * kNumKvHeads * (2 + 8) * kHeadDim * sizeof(float);
  EXPECT_EQ(cache->bytes_in_use(), side_bytes);
  EXPECT_EQ(cache->f32_row_bytes_in_use(), side_bytes);
  std::mt19937 rng(2);
  History history;
  Append(*cache, seq_id, 9, rng, &history);
  EXPECT_EQ(cache->bytes_in_use(), 2 * block_bytes + side_bytes);
  EXPECT_EQ(cache->f32_row_bytes_in_use(), side_bytes);
  const KvLayerView view = cache->View(seq_id, 0);
  EXPECT_EQ(view.k.group_tokens, 8);
  EXPECT_EQ(view.k.unit_bytes, 132u);
  EXPECT_EQ(view.k.block_stride, 132u);  // head-major: one head's units of a block
  EXPECT_EQ(view.v.block_stride, 8u * 8);
  EXPECT_EQ(view.k.head_stride, 8 * 132u);  // then the next head, 8 blocks on
  EXPECT_EQ(cache->peak_bytes_in_use(), cache->bytes_in_use());
  ASSERT_TRUE(cache->RemoveSequence(seq_id).ok());
  EXPECT_EQ(cache->bytes_in_use(), 0u);
  EXPECT_EQ(cache->f32_row_bytes_in_use(), 0u);
  // The peak remembers the sequence at its longest until it is reset.
  EXPECT_EQ(cache->peak_bytes_in_use(), 2 * block_bytes + side_bytes);
  cache->ResetPeakBytesInUse();
  EXPECT_EQ(cache->peak_bytes_in_use(), 0u);
  const SeqId next = *cache->AddSequence();
  EXPECT_EQ(cache->peak_bytes_in_use(), side_bytes);
  Append(*cache, next, 17, rng, &history);
  EXPECT_EQ(cache->peak_bytes_in_use(), 3 * block_bytes + side_bytes);
}

TEST(KvCacheUnitsTest, ContiguousRegionIsRoundedUpToWholePeriods) {
  Params params{.layout = LayoutKind::kContiguous, .setup = {.name = "c", .packed = {{"f32", 8}}}};
  auto cache = MakeCache(params, 20, 1);
  const SeqId seq_id = *cache->AddSequence();
  EXPECT_EQ(cache->View(seq_id, 0).block_size, 24);
  EXPECT_TRUE(cache->PlanAppend(seq_id, 20)->fits);
  EXPECT_FALSE(cache->PlanAppend(seq_id, 21)->fits);  // capacity stays what was asked for
}

TEST(KvCacheUnitsTest, BlockSizeZeroIsSizedToEveryLayersUnits) {
  struct Case {
    std::string k_codec;
    std::vector<KvConfig::LayerCodecs> layer_codecs;
    int expected;
  };
  for (const Case& c : {
           Case{"f16", {}, kDefaultBlockSize}, Case{"kivi4-g8", {}, 16}, Case{"kivi2-g32", {}, 32},
           Case{"kivi4-g24", {}, 24},
           Case{"kivi4-g8", {Override(1, "kivi2-g12", "")}, 24},  // lcm(8, 12) = 24 >= 16
       }) {
    KvCacheOptions options;
    options.num_layers = kNumLayers;
    options.num_kv_heads = kNumKvHeads;
    options.head_dim = kHeadDim;
    options.config.capacity = 100;
    options.config.k_codec = c.k_codec;
    options.config.layer_codecs = c.layer_codecs;
    ASSERT_EQ(options.config.block_size, 0);  // the default
    auto cache = KvCache::Create(options);
    ASSERT_TRUE(cache.ok()) << c.k_codec << ": " << cache.status();
    EXPECT_EQ((*cache)->config().block_size, c.expected) << c.k_codec;
    const SeqId seq_id = *(*cache)->AddSequence();
    ASSERT_TRUE((*cache)->CommitAppend(*(*cache)->PlanAppend(seq_id, 1)).ok());
    EXPECT_EQ((*cache)->View(seq_id, 0).block_size, c.expected) << c.k_codec;
  }
}

struct ErrorCase {
  std::string what;
  LayoutKind layout = LayoutKind::kPaged;
  int block_size = 8;
  int64_t capacity = 32;
  int head_dim = kHeadDim;
  PackedNames packed = {};
  std::string k_codec = "f32";
  std::string v_codec = "f32";
  std::vector<KvConfig::LayerCodecs> layer_codecs = {};
  int sink_tokens = 0;
  bool hadamard = false;
  std::string expected;
};

TEST(KvCacheUnitsTest, CreateNamesWhatIsWrong) {
  const ErrorCase cases[] = {
      {.what = "override past the last layer",
       .layer_codecs = {Override(2, "f16", "")},
       .expected = "layer_codecs names layer 2 but num_layers is 2; allowed: layers 0..1"},
      {.what = "units that do not nest",
       .packed = {{"f32", 3}, {"f16", 2}},
       .v_codec = "f16",
       .expected = "layer 0: codec 'packed3' groups 3 tokens and codec 'packed2' groups 2; "
                   "allowed: unit sizes of which one is a multiple of the other"},
      {.what = "block not a multiple of the period",
       .block_size = 12,
       .packed = {{"f16", 8}},
       .layer_codecs = {Override(1, "", "f16")},
       .expected = "block_size 12 is not a multiple of the 8-token units of codec 'packed8' "
                   "(layer 1); allowed: a multiple of 8"},
      {.what = "ring with multi-token units",
       .layout = LayoutKind::kRing,
       .packed = {{"f32", 4}},
       .expected = "the ring layout needs one-token units; codec 'packed4' groups 4 tokens"},
      {.what = "hadamard on a head_dim that is not a power of two",
       .head_dim = 6,
       .hadamard = true,
       .expected = "hadamard_keys needs head_dim a power of two; head_dim is 6"},
      {.what = "ring filled by sinks",
       .layout = LayoutKind::kRing,
       .capacity = 4,
       .sink_tokens = 4,
       .expected = "sink_tokens 4 leaves no room in a ring of capacity 4; allowed: sink_tokens < "
                   "capacity"},
      {.what = "bad sink count reaches ValidateKvConfig",
       .sink_tokens = -2,
       .expected = "sink_tokens -2 is out of range"},
  };
  for (const ErrorCase& c : cases) {
    KvCacheOptions options;
    options.num_layers = kNumLayers;
    options.num_kv_heads = kNumKvHeads;
    options.head_dim = c.head_dim;
    options.config.layout = c.layout;
    options.config.block_size = c.block_size;
    options.config.capacity = c.capacity;
    options.config.k_codec = c.k_codec;
    options.config.v_codec = c.v_codec;
    options.config.layer_codecs = c.layer_codecs;
    options.config.sink_tokens = c.sink_tokens;
    options.config.hadamard_keys = c.hadamard;
    options.codec_factory = Factory(c.packed);
    auto cache = KvCache::Create(options);
    ASSERT_FALSE(cache.ok()) << c.what;
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(cache.status().message()), HasSubstr(c.expected)) << c.what;
  }
}

}  // namespace
}  // namespace kvstack
