// Tests of KvCache. The conformance part runs every layout through the same checks: what is
// written reads back through View() (decoded with the codec, addressed with the formula in
// kv_view.h, not with the cache's own helper), planning is side-effect free, stale plans are
// refused, blocks come back, forks share or copy, and the byte accounting is exact. Layout-
// specific tests cover paged exhaustion and ring wrap-around.
#include "kvstack/kv_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache_test_util.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

using namespace cache_test;  // NOLINT: the shared shape and helpers of the cache suites

// Round-trip bound relative to |x| for values in the normal range.
double Tolerance(const std::string& codec) {
  static const std::map<std::string, double> tolerances = {
      {"f32", 0.0}, {"f16", 0x1p-11}, {"bf16", 0x1p-8}};
  return tolerances.at(codec);
}

struct CacheParams {
  LayoutKind layout = LayoutKind::kPaged;
  int64_t capacity = 40;
  int block_size = 16;
  int max_sequences = 1;
  std::string k_codec = "f32";
  std::string v_codec = "f32";
};

std::unique_ptr<KvCache> MakeCache(const CacheParams& params) {
  KvCacheOptions options;
  options.num_layers = kNumLayers;
  options.num_kv_heads = kNumKvHeads;
  options.head_dim = kHeadDim;
  options.config.layout = params.layout;
  options.config.capacity = params.capacity;
  options.config.block_size = params.block_size;
  options.config.max_sequences = params.max_sequences;
  options.config.k_codec = params.k_codec;
  options.config.v_codec = params.v_codec;
  auto cache = KvCache::Create(options);
  KVS_CHECK(cache.ok());
  return std::move(*cache);
}

// Decodes every logical token of one arena through the addressing formula of kv_view.h.
std::vector<float> ReadArena(const KvLayerView& view, const KvArenaView& arena,
                             const Codec& codec) {
  std::vector<float> out(static_cast<size_t>(view.num_tokens) * kTokenFloats);
  for (int i = 0; i < view.num_tokens; ++i) {
    const int slot = (view.first_slot + i) % view.num_slots();
    const int32_t block_id = view.block_table[slot / view.block_size];
    for (int h = 0; h < view.num_kv_heads; ++h) {
      codec.Decode({arena.Row(block_id, slot % view.block_size, h), arena.unit_bytes},
                   std::span(out).subspan((i * kNumKvHeads + h) * kHeadDim, kHeadDim));
    }
  }
  return out;
}

// Checks that the sequence holds exactly the last NumTokens() appended tokens, in order.
void ExpectContents(const KvCache& cache, SeqId seq_id, const History& history) {
  const size_t num_tokens = cache.NumTokens(seq_id);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    const KvLayerView view = cache.View(seq_id, layer_idx);
    ASSERT_EQ(static_cast<size_t>(view.num_tokens), num_tokens);
    const std::vector<float> k = ReadArena(view, view.k, cache.k_codec());
    const std::vector<float> v = ReadArena(view, view.v, cache.v_codec());
    const size_t skip = history.k[layer_idx].size() - num_tokens * kTokenFloats;
    const double k_tol = Tolerance(cache.config().k_codec);
    const double v_tol = Tolerance(cache.config().v_codec);
    for (size_t idx = 0; idx < k.size(); ++idx) {
      const float want_k = history.k[layer_idx][skip + idx];
      const float want_v = history.v[layer_idx][skip + idx];
      ASSERT_LE(std::abs(k[idx] - want_k), k_tol * std::abs(want_k))
          << "layer " << layer_idx << " token " << idx / kTokenFloats;
      ASSERT_LE(std::abs(v[idx] - want_v), v_tol * std::abs(want_v))
          << "layer " << layer_idx << " token " << idx / kTokenFloats;
    }
  }
}

class KvCacheLayoutTest : public ::testing::TestWithParam<LayoutKind> {
 protected:
  CacheParams Params() const {
    CacheParams params;
    params.layout = GetParam();
    return params;
  }
  std::mt19937 rng_{17};
};

TEST_P(KvCacheLayoutTest, WrittenTokensReadBackExactly) {
  auto cache = MakeCache(Params());
  const SeqId seq_id = *cache->AddSequence();
  History history;
  for (const int num_new : {1, 5, 16, 3, 7}) {  // paged: crosses a block boundary mid-append
    ASSERT_NO_FATAL_FAILURE(Append(*cache, seq_id, num_new, rng_, &history));
    ASSERT_NO_FATAL_FAILURE(ExpectContents(*cache, seq_id, history));
  }
  EXPECT_EQ(cache->NumTokens(seq_id), 32);
}

TEST_P(KvCacheLayoutTest, DifferentKeyAndValueCodecs) {
  CacheParams params = Params();
  params.k_codec = "f16";
  params.v_codec = "bf16";
  auto cache = MakeCache(params);
  const SeqId seq_id = *cache->AddSequence();
  History history;
  for (const int num_new : {9, 9, 9}) Append(*cache, seq_id, num_new, rng_, &history);
  const KvLayerView view = cache->View(seq_id, 1);
  EXPECT_EQ(view.k.codec, CodecId::kF16);
  EXPECT_EQ(view.v.codec, CodecId::kBF16);
  EXPECT_EQ(view.k.unit_bytes, 2u * kHeadDim);
  ExpectContents(*cache, seq_id, history);
}

TEST_P(KvCacheLayoutTest, InterleavedSequencesKeepTheirOwnTokens) {
  CacheParams params = Params();
  params.max_sequences = 3;
  auto cache = MakeCache(params);
  SeqId ids[3];
  History histories[3];
  for (SeqId& id : ids) id = *cache->AddSequence();
  for (int round = 0; round < 4; ++round) {
    for (int s = 0; s < 3; ++s) Append(*cache, ids[s], 2 + 3 * s + round, rng_, &histories[s]);
  }
  for (int s = 0; s < 3; ++s) ExpectContents(*cache, ids[s], histories[s]);
}

// A paged cache of two sequences of up to 64 tokens in blocks of 4: 32 blocks, two extents of
// BlockPool::kExtentBlocks.
std::unique_ptr<KvCache> TwoSequenceCache() {
  CacheParams params;
  params.block_size = 4;
  params.capacity = 64;
  params.max_sequences = 2;
  return MakeCache(params);
}

// Sequence `id` has `num_blocks` blocks, consecutive ids from its block `first` on.
void ExpectAdjacentFrom(const KvCache& cache, SeqId id, size_t num_blocks, size_t first) {
  const KvLayerView view = cache.View(id, 0);
  ASSERT_EQ(view.block_table.size(), num_blocks);
  for (size_t i = first + 1; i < num_blocks; ++i) {
    EXPECT_EQ(view.block_table[i], view.block_table[i - 1] + 1) << "sequence " << id;
  }
}

TEST(KvCacheTest, SequencesGrowingAtOnceKeepTheirBlocksAdjacent) {
  // Two sequences appending a block's worth of tokens in turn: each still gets consecutive
  // block ids (so one run per kv head in the head-major arenas), not every other id.
  auto cache = TwoSequenceCache();
  std::mt19937 rng(3);
  const SeqId a = *cache->AddSequence(), b = *cache->AddSequence();
  History history;
  for (int round = 0; round < 8; ++round) {
    for (const SeqId id : {a, b}) Append(*cache, id, 4, rng, &history);
  }
  for (const SeqId id : {a, b}) ExpectAdjacentFrom(*cache, id, 8, 0);
}

TEST(KvCacheTest, ForkedSequencesGrowingAtOnceKeepTheirBlocksAdjacent) {
  // The child's copy of the partial block goes where its own next blocks can follow, not into
  // the id the parent grows into.
  auto cache = TwoSequenceCache();
  std::mt19937 rng(5);
  History history;
  const SeqId parent = *cache->AddSequence();
  Append(*cache, parent, 10, rng, &history);  // two full blocks and a partial one
  const SeqId child = *cache->ForkSequence(parent);
  for (int round = 0; round < 4; ++round) {
    for (const SeqId id : {parent, child}) Append(*cache, id, 4, rng, &history);
  }
  // Past the two shared blocks: the parent's third and the child's copy of it start runs.
  for (const SeqId id : {parent, child}) ExpectAdjacentFrom(*cache, id, 7, 2);
}

TEST_P(KvCacheLayoutTest, RemoveReturnsEveryBlock) {
  CacheParams params = Params();
  params.max_sequences = 3;
  auto cache = MakeCache(params);
  const int num_free_at_start = cache->pool().num_free();
  History history;
  const SeqId a = *cache->AddSequence();
  const SeqId b = *cache->AddSequence();
  Append(*cache, a, 20, rng_, &history);
  Append(*cache, b, 33, rng_, &history);
  const SeqId c = *cache->ForkSequence(b);
  EXPECT_LT(cache->pool().num_free(), num_free_at_start);
  for (const SeqId id : {b, a, c}) ASSERT_TRUE(cache->RemoveSequence(id).ok());
  EXPECT_EQ(cache->pool().num_free(), num_free_at_start);
  EXPECT_EQ(cache->bytes_in_use(), 0u);
  EXPECT_EQ(cache->RemoveSequence(a).code(), absl::StatusCode::kNotFound);
}

TEST_P(KvCacheLayoutTest, PlanHasNoSideEffects) {
  auto cache = MakeCache(Params());
  const SeqId seq_id = *cache->AddSequence();
  History history;
  Append(*cache, seq_id, 3, rng_, &history);
  const int num_free = cache->pool().num_free();
  auto first = cache->PlanAppend(seq_id, 30);
  auto second = cache->PlanAppend(seq_id, 30);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->blocks_needed, second->blocks_needed);
  EXPECT_EQ(first->fits, second->fits);
  EXPECT_EQ(cache->NumTokens(seq_id), 3);
  EXPECT_EQ(cache->pool().num_free(), num_free);
  ExpectContents(*cache, seq_id, history);

  EXPECT_EQ(cache->PlanAppend(seq_id, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->PlanAppend(seq_id + 100, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(KvCacheLayoutTest, StalePlanIsRefused) {
  auto cache = MakeCache(Params());  // capacity 40, one sequence
  const SeqId seq_id = *cache->AddSequence();
  auto plan = cache->PlanAppend(seq_id, 30);
  ASSERT_TRUE(plan.ok() && plan->fits);
  // Another 20 tokens arrive first: 30 more no longer fit (paged: pool too small; contiguous:
  // over capacity) or would now drop tokens (ring), so the old plan no longer describes the
  // commit.
  History history;
  Append(*cache, seq_id, 20, rng_, &history);
  const absl::Status status = cache->CommitAppend(*plan);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->NumTokens(seq_id), 20);

  // A plan for a removed sequence is stale too.
  auto removed_plan = cache->PlanAppend(seq_id, 1);
  ASSERT_TRUE(cache->RemoveSequence(seq_id).ok());
  EXPECT_EQ(cache->CommitAppend(*removed_plan).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(KvCacheLayoutTest, ForkCopiesTokensAndDiverges) {
  CacheParams params = Params();
  params.block_size = 4;
  params.max_sequences = 2;
  auto cache = MakeCache(params);
  const SeqId parent = *cache->AddSequence();
  History parent_history;
  Append(*cache, parent, 10, rng_, &parent_history);
  const SeqId child = *cache->ForkSequence(parent);
  History child_history = parent_history;
  EXPECT_EQ(cache->NumTokens(child), 10);
  ExpectContents(*cache, child, child_history);

  const KvLayerView pv = cache->View(parent, 0);
  const KvLayerView cv = cache->View(child, 0);
  if (GetParam() == LayoutKind::kPaged) {
    // Two full blocks shared, the partial third one copied into a block of the child's own.
    ASSERT_EQ(cv.block_table.size(), 3u);
    for (int idx = 0; idx < 2; ++idx) {
      EXPECT_EQ(cv.block_table[idx], pv.block_table[idx]);
      EXPECT_EQ(cache->pool().ref_count(cv.block_table[idx]), 2);
    }
    EXPECT_NE(cv.block_table[2], pv.block_table[2]);
    EXPECT_EQ(cache->pool().ref_count(cv.block_table[2]), 1);
  } else {
    ASSERT_EQ(cv.block_table.size(), 1u);
    EXPECT_NE(cv.block_table[0], pv.block_table[0]);
  }
  // Each side appends its own tokens; neither sees the other's.
  Append(*cache, parent, 3, rng_, &parent_history);
  Append(*cache, child, 5, rng_, &child_history);
  ExpectContents(*cache, parent, parent_history);
  ExpectContents(*cache, child, child_history);
}

TEST_P(KvCacheLayoutTest, ByteAccountingIsExact) {
  CacheParams params = Params();
  params.k_codec = "f32";
  params.v_codec = "f16";
  params.max_sequences = 2;
  auto cache = MakeCache(params);
  const size_t k_row = 4 * kHeadDim;
  const size_t v_row = 2 * kHeadDim;
  const size_t per_slot = static_cast<size_t>(kNumLayers) * kNumKvHeads * (k_row + v_row);
  EXPECT_EQ(cache->bytes_per_token(), static_cast<double>(per_slot));
  // Paged: ceil(40 * 2 / 16) = 5 blocks of 16 slots; the others: 2 regions of 40 slots.
  const bool paged = GetParam() == LayoutKind::kPaged;
  const size_t slots_per_block = paged ? 16 : 40;
  EXPECT_EQ(cache->pool().num_blocks(), paged ? 5 : 2);
  EXPECT_EQ(cache->bytes_reserved(), 80u * per_slot);  // 80 slots either way
  EXPECT_EQ(cache->bytes_in_use(), 0u);

  const SeqId seq_id = *cache->AddSequence();
  History history;
  Append(*cache, seq_id, 17, rng_, &history);  // paged: 2 blocks; others: the one region
  EXPECT_EQ(cache->bytes_in_use(), (paged ? 2 : 1) * slots_per_block * per_slot);

  const KvLayerView view = cache->View(seq_id, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view.k.base) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view.v.base) % 64, 0u);
  // Head-major: one head's rows of a block, then its next block; heads num_blocks blocks apart.
  const size_t num_blocks = paged ? 5 : 2;
  EXPECT_EQ(view.k.block_stride, slots_per_block * k_row);
  EXPECT_EQ(view.v.block_stride, slots_per_block * v_row);
  EXPECT_EQ(view.k.head_stride, num_blocks * slots_per_block * k_row);
  EXPECT_EQ(view.v.head_stride, num_blocks * slots_per_block * v_row);
  EXPECT_EQ(view.block_size, static_cast<int>(slots_per_block));
}

TEST_P(KvCacheLayoutTest, LayersCanBeWrittenConcurrently) {
  auto cache = MakeCache(Params());
  const SeqId seq_id = *cache->AddSequence();
  ASSERT_TRUE(cache->CommitAppend(*cache->PlanAppend(seq_id, 24)).ok());
  History history;
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    for (int idx = 0; idx < 24 * kTokenFloats; ++idx) {
      history.k[layer_idx].push_back(static_cast<float>(idx + 1000 * layer_idx));
      history.v[layer_idx].push_back(-static_cast<float>(idx + 1000 * layer_idx));
    }
  }
  std::vector<std::thread> threads;
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    threads.emplace_back([&, layer_idx] {
      cache->Write(seq_id, layer_idx, 0, history.k[layer_idx], history.v[layer_idx]);
    });
  }
  for (std::thread& t : threads) t.join();
  ExpectContents(*cache, seq_id, history);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, KvCacheLayoutTest,
                         ::testing::Values(LayoutKind::kContiguous, LayoutKind::kPaged,
                                           LayoutKind::kRing),
                         [](const auto& info) { return std::string(LayoutName(info.param)); });

TEST(KvCacheTest, SameDataReadsBackIdenticallyInEveryLayout) {
  std::vector<std::vector<float>> decoded;
  for (const LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kPaged, LayoutKind::kRing}) {
    CacheParams params;
    params.layout = layout;
    params.k_codec = "f16";
    params.v_codec = "bf16";
    auto cache = MakeCache(params);
    const SeqId seq_id = *cache->AddSequence();
    std::mt19937 rng(5);  // same seed: same tokens in every layout
    History history;
    for (const int num_new : {7, 1, 20, 4}) Append(*cache, seq_id, num_new, rng, &history);
    std::vector<float> all;
    for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
      const KvLayerView view = cache->View(seq_id, layer_idx);
      for (const auto& part :
           {ReadArena(view, view.k, cache->k_codec()), ReadArena(view, view.v, cache->v_codec())}) {
        all.insert(all.end(), part.begin(), part.end());
      }
    }
    decoded.push_back(std::move(all));
  }
  ASSERT_EQ(decoded[0].size(), 32u * kTokenFloats * 2 * kNumLayers);
  EXPECT_EQ(decoded[0], decoded[1]);
  EXPECT_EQ(decoded[0], decoded[2]);
}

TEST(KvCacheTest, PagedArenasHoldEachHeadsBlocksBackToBack) {
  // Arenas are head-major: the blocks a fresh pool hands out in order give each kv head one
  // contiguous run of bytes (what decode reads fastest), and the heads' runs do not overlap.
  CacheParams params;
  params.capacity = 64;
  params.block_size = 8;
  params.k_codec = "f16";
  params.v_codec = "bf16";
  auto cache = MakeCache(params);
  const SeqId seq_id = *cache->AddSequence();
  std::mt19937 rng(3);
  History history;
  ASSERT_NO_FATAL_FAILURE(Append(*cache, seq_id, 36, rng, &history));
  const KvLayerView view = cache->View(seq_id, 1);
  ASSERT_EQ(view.block_table.size(), 5u);
  for (const KvArenaView* arena : {&view.k, &view.v}) {
    const int units = view.block_size / arena->group_tokens;
    const size_t head_block_bytes = units * arena->unit_bytes;
    const std::byte* previous_end = nullptr;
    for (int h = 0; h < view.num_kv_heads; ++h) {
      const std::byte* run = arena->Unit(view.block_table[0], 0, h);
      EXPECT_GE(run, previous_end) << "head " << h;
      for (size_t b = 0; b < view.block_table.size(); ++b) {
        EXPECT_EQ(arena->Unit(view.block_table[b], 0, h), run + b * head_block_bytes)
            << "head " << h << " block " << b;
      }
      previous_end = run + view.block_table.size() * head_block_bytes;
    }
  }
  ExpectContents(*cache, seq_id, history);
}

TEST(KvCacheTest, PagedPoolExhaustionIsAnAnswerNotAnError) {
  CacheParams params;
  params.capacity = 48;  // 3 blocks of 16
  params.max_sequences = 1;
  auto cache = MakeCache(params);
  const SeqId a = *cache->AddSequence();
  const SeqId b = *cache->AddSequence();  // paged sequences start empty: no region needed
  std::mt19937 rng(1);
  History history;
  Append(*cache, a, 20, rng, &history);  // 2 blocks, 1 left
  auto plan = cache->PlanAppend(b, 17);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->fits);
  EXPECT_EQ(plan->blocks_needed, 2);
  EXPECT_EQ(cache->CommitAppend(*plan).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache->PlanAppend(b, 16)->fits);
  EXPECT_TRUE(cache->PlanAppend(a, 28)->fits);   // a third block
  EXPECT_FALSE(cache->PlanAppend(a, 29)->fits);  // and a fourth
  // A fork needs a block for a's partial tail: the last one, then none.
  EXPECT_TRUE(cache->ForkSequence(a).ok());
  EXPECT_EQ(cache->ForkSequence(a).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvCacheTest, RingKeepsTheLastCapacityTokensInOrder) {
  CacheParams params;
  params.layout = LayoutKind::kRing;
  params.capacity = 8;
  params.max_sequences = 2;
  auto cache = MakeCache(params);
  const SeqId seq_id = *cache->AddSequence();
  std::mt19937 rng(3);
  History history;
  Append(*cache, seq_id, 5, rng, &history);
  auto plan = cache->PlanAppend(seq_id, 6);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->fits);
  EXPECT_EQ(plan->tokens_dropped, 3);
  Append(*cache, seq_id, 6, rng, &history);  // 11 appended: tokens 3..10 remain
  EXPECT_EQ(cache->NumTokens(seq_id), 8);
  EXPECT_EQ(cache->View(seq_id, 0).first_slot, 3);
  ExpectContents(*cache, seq_id, history);

  Append(*cache, seq_id, 7, rng, &history);  // wraps again: first_slot (3 + 7) % 8
  EXPECT_EQ(cache->View(seq_id, 0).first_slot, 2);
  ExpectContents(*cache, seq_id, history);

  // A fork of a wrapped ring keeps its order.
  const SeqId child = *cache->ForkSequence(seq_id);
  EXPECT_EQ(cache->View(child, 1).first_slot, 2);
  ExpectContents(*cache, child, history);

  auto too_long = cache->PlanAppend(seq_id, 9);
  ASSERT_TRUE(too_long.ok());
  EXPECT_FALSE(too_long->fits);
  Append(*cache, seq_id, 8, rng, &history);  // replaces everything
  ExpectContents(*cache, seq_id, history);
}

TEST(KvCacheTest, RegionLayoutsLimitLiveSequences) {
  for (const LayoutKind layout : {LayoutKind::kContiguous, LayoutKind::kRing}) {
    CacheParams params;
    params.layout = layout;
    params.max_sequences = 2;
    auto cache = MakeCache(params);
    const SeqId a = *cache->AddSequence();
    ASSERT_TRUE(cache->AddSequence().ok());
    auto third = cache->AddSequence();
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(third.status().message()), HasSubstr("max_sequences=2"));
    EXPECT_EQ(cache->ForkSequence(a).status().code(), absl::StatusCode::kResourceExhausted);
    ASSERT_TRUE(cache->RemoveSequence(a).ok());
    EXPECT_TRUE(cache->AddSequence().ok());
  }
}

TEST(KvCacheTest, CreateRejectsBadOptions) {
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = 1;
  options.head_dim = 8;
  auto unresolved = KvCache::Create(options);  // capacity 0
  ASSERT_FALSE(unresolved.ok());
  EXPECT_THAT(std::string(unresolved.status().message()),
              HasSubstr("capacity must be resolved to > 0 before creating the cache"));

  options.config.capacity = 16;
  options.num_kv_heads = 0;
  EXPECT_THAT(std::string(KvCache::Create(options).status().message()),
              HasSubstr("num_kv_heads (0)"));
  options.num_kv_heads = 1;

  options.config.k_codec = "f64";
  EXPECT_THAT(std::string(KvCache::Create(options).status().message()), HasSubstr("k_codec 'f64'"));
  options.config.k_codec = "f32";

  options.config.capacity = int64_t{1} << 40;  // ~ 16 TiB of cache
  auto huge = KvCache::Create(options);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("at most 64 GiB"));

  options.config.capacity = std::numeric_limits<int64_t>::max();  // must not overflow silently
  EXPECT_FALSE(KvCache::Create(options).ok());
  options.config.layout = LayoutKind::kContiguous;
  EXPECT_FALSE(KvCache::Create(options).ok());
}

}  // namespace
}  // namespace kvstack
