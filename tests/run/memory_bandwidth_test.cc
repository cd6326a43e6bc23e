// Tests for the memory bandwidth probe and the decode byte count (src/run/memory_bandwidth.h).
// Sizes are tiny, so the rate measured is the caches'; only its plausibility is checked.

#include "run/memory_bandwidth.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvstack {
namespace {

TEST(MemoryBandwidthTest, ReturnsAPlausibleRateWithAndWithoutPool) {
  ThreadPool pool(2);
  // Odd sizes too: ranges split unevenly and leave a scalar tail.
  for (size_t bytes : {size_t{64}, size_t{4096 + 12}, size_t{1} << 20}) {
    const double alone = MeasureReadBandwidth(bytes, 3, nullptr);
    const double pooled = MeasureReadBandwidth(bytes, 3, &pool);
    // Below 100 TB/s (a timing or size bug) and above 10 MB/s (any machine) from 1 MiB, where a
    // pass takes 100 ms at that rate; below it only positive: a pooled pass over 64 bytes is the
    // pool's round trip, which one descheduled worker (a sanitizer build beside another test
    // process) stretched to 44 µs, 1.5 MB/s, in CI.
    const double floor = bytes >= (size_t{1} << 20) ? 1e7 : 0.0;
    EXPECT_GT(alone, floor) << bytes;
    EXPECT_LT(alone, 1e14) << bytes;
    EXPECT_GT(pooled, floor) << bytes;
    EXPECT_LT(pooled, 1e14) << bytes;
  }
}

// Arenas of real memory for MeasureDecodeReadRate: [num_blocks][num_kv_heads][units][bytes].
struct TestArenas {
  std::vector<std::byte> k, v;
  std::vector<int32_t> block_table;

  TestArenas(KvLayerView* view, int num_blocks, int units_k, int units_v) {
    auto place = [&](KvArenaView& arena, std::vector<std::byte>& bytes, int units) {
      arena.head_stride = arena.unit_bytes * units;
      arena.block_stride = arena.head_stride * view->num_kv_heads;
      bytes.assign(arena.block_stride * num_blocks, std::byte{1});
      arena.base = bytes.data();
    };
    place(view->k, k, units_k);
    place(view->v, v, units_v);
    for (int b = 0; b < num_blocks; ++b) block_table.push_back((b * 3) % num_blocks);  // shuffled
    view->block_table = block_table;
  }
};

TEST(MemoryBandwidthTest, DecodeReadRateIsPlausibleForPagedAndRingViews) {
  ThreadPool pool(2);
  // Paged: 300 tokens in 19 blocks of 16, one-token key units, 8-token value units.
  KvLayerView paged;
  paged.num_tokens = 300;
  paged.num_kv_heads = 3;
  paged.head_dim = 16;
  paged.block_size = 16;
  paged.k.unit_bytes = 32;
  paged.v.unit_bytes = 72;
  paged.v.group_tokens = 8;
  const TestArenas paged_arenas(&paged, 19, 16, 2);
  // Ring: one block of 128 slots that has wrapped (logical 0 in slot 100).
  KvLayerView ring;
  ring.num_tokens = 128;
  ring.num_kv_heads = 2;
  ring.head_dim = 16;
  ring.block_size = 128;
  ring.first_slot = 100;
  ring.k.unit_bytes = ring.v.unit_bytes = 32;
  const TestArenas ring_arenas(&ring, 1, 128, 128);
  for (const KvLayerView* view : {&paged, &ring}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const double rate = MeasureDecodeReadRate(*view, 3, p);
      EXPECT_GT(rate, 1e7);
      EXPECT_LT(rate, 1e14);
    }
  }
}

TEST(MemoryBandwidthTest, DecodeBytesReadCountsKeyAndValueRowsOfEveryHead) {
  KvLayerView view;
  view.num_tokens = 100;
  view.num_kv_heads = 8;
  view.head_dim = 64;
  view.k.unit_bytes = 128;  // F16 keys
  view.v.unit_bytes = 256;  // F32 values
  EXPECT_EQ(DecodeBytesRead(view), size_t{100} * 8 * (128 + 256));
}

// A latent layer's values read the key units (their view is the key arena): counted once.
TEST(MemoryBandwidthTest, DecodeBytesReadCountsSharedLatentUnitsOnce) {
  struct JointCodec final : Codec {
    CodecId id() const override { return CodecId::kLatent; }
    std::string_view name() const override { return "latent-r4"; }
    int head_dim() const override { return 8; }
    size_t unit_bytes() const override { return 8; }
    bool joint() const override { return true; }
    void Encode(std::span<const float>, std::span<std::byte>) const override {}
    void Decode(std::span<const std::byte>, std::span<float>) const override {}
  } codec;
  KvLayerView view;
  view.num_tokens = 100;
  view.num_kv_heads = 4;
  view.head_dim = 8;
  view.k.unit_bytes = view.v.unit_bytes = 8;
  view.k.codec_impl = view.v.codec_impl = &codec;
  EXPECT_EQ(DecodeBytesRead(view), size_t{100} * 4 * 8);
}

TEST(MemoryBandwidthTest, DecodeBytesReadCountsWholeUnitsAndSegments) {
  // 100 tokens: 5 F32 sinks, arena [5, 96) in units of 32 tokens (units 0..2, the first
  // partly sinks), 4 F32 pending tokens.
  KvLayerView view;
  view.num_tokens = 100;
  view.num_kv_heads = 2;
  view.head_dim = 8;
  view.k.unit_bytes = 160;  // kivi keys of 32 tokens
  view.k.group_tokens = 32;
  view.v.unit_bytes = 12;  // one-token values
  view.sinks.begin = 0;
  view.sinks.end = 5;
  view.pending.begin = 96;
  view.pending.end = 100;
  const size_t keys = 3 * 160, values = 91 * 12, segments = (5 + 4) * 2 * 8 * sizeof(float);
  EXPECT_EQ(DecodeBytesRead(view), 2 * (keys + values + segments));
  // Without segments the arena is every token.
  view.sinks = {};
  view.pending = {};
  EXPECT_EQ(DecodeBytesRead(view), 2 * (4 * 160 + 100 * 12));
}

TEST(MemoryBandwidthTest, DecodeBytesReadCountsEachHeadsOwnTokens) {
  // After an eviction heads hold 100, 40 and 3 tokens; 3 F32 sinks each (all a head holds
  // in the third).
  const int32_t head_tokens[] = {100, 40, 3};
  KvLayerView view;
  view.num_tokens = 100;
  view.num_kv_heads = 3;
  view.head_dim = 8;
  view.k.unit_bytes = 16;  // F16 keys
  view.v.unit_bytes = 32;  // F32 values
  view.sinks.stride_tokens = 3;
  view.sinks.end = 3;
  view.head_tokens = head_tokens;
  const size_t sink_bytes = 3 * 2 * 8 * sizeof(float);
  EXPECT_EQ(DecodeBytesRead(view), (97 + 37 + 0) * size_t{16 + 32} + 3 * sink_bytes);
}

}  // namespace
}  // namespace kvstack
