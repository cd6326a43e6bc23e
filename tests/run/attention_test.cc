// Tests for the attention kernels (src/run/attention.h): every kernel path (decode and prefill,
// every codec pair, vector widths from scalar to full, one thread and two) is compared with
// AttentionReference on views built by hand over test-owned arenas in every layout —
// contiguous, paged with a shuffled block table, and a wrapped ring.

#include "run/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kvstack/numeric.h"

namespace kvstack {
namespace {

// Float outputs against the double reference on the same stored bytes: the kernels differ only
// in summation order, float accumulation and a polynomial exp, so outputs (weighted averages
// of values in [-1, 1]) agree to a few float ulps times the number of terms.
constexpr float kTolerance = 2e-5f;

enum class LayoutKind { kContiguous, kPaged, kRing };

struct Layout {
  LayoutKind kind = LayoutKind::kContiguous;
  int block_size = 0;  // paged only
  std::string Name() const {
    switch (kind) {
      case LayoutKind::kContiguous:
        return "contiguous";
      case LayoutKind::kPaged:
        return "paged" + std::to_string(block_size);
      case LayoutKind::kRing:
        return "ring";
    }
    return "?";
  }
};

size_t ElementBytes(CodecId codec) { return codec == CodecId::kF32 ? 4 : 2; }

void EncodeRow(CodecId codec, const float* src, int head_dim, std::byte* dst) {
  for (int i = 0; i < head_dim; ++i) {
    if (codec == CodecId::kF32) {
      std::memcpy(dst + 4 * i, &src[i], 4);
    } else {
      const uint16_t bits = codec == CodecId::kF16 ? F32ToF16(src[i]) : F32ToBF16(src[i]);
      std::memcpy(dst + 2 * i, &bits, 2);
    }
  }
}

// A view over test-owned arenas. Slots no token occupies are filled with 0xff bytes (NaN in
// every codec), so a kernel that reads a wrong slot poisons its output.
struct TestCache {
  std::vector<std::byte> k_arena, v_arena;
  std::vector<int32_t> block_table;
  KvLayerView view;
};

// k, v: [num_tokens, num_kv_heads, head_dim] logical data, oldest first.
TestCache BuildCache(const std::vector<float>& k, const std::vector<float>& v, int num_tokens,
                     int num_kv_heads, int head_dim, CodecId k_codec, CodecId v_codec,
                     const Layout& layout) {
  TestCache cache;
  int block_size = 1, num_blocks = 1, num_physical = 1, first_slot = 0;
  switch (layout.kind) {
    case LayoutKind::kContiguous:  // spare capacity past the tokens, like a real cache
      block_size = num_tokens + 3;
      num_blocks = num_physical = 1;
      break;
    case LayoutKind::kPaged:
      block_size = layout.block_size;
      num_blocks = (num_tokens + block_size - 1) / block_size;
      num_physical = num_blocks + 2;  // blocks of other sequences in the same pool
      break;
    case LayoutKind::kRing:
      block_size = num_tokens + 4;
      num_blocks = num_physical = 1;
      first_slot = block_size - std::max(1, num_tokens / 2);  // wraps after half the tokens
      break;
  }
  // Shuffled physical ids, so logical order differs from address order.
  std::vector<int32_t> ids(num_physical);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  cache.block_table.assign(ids.begin(), ids.begin() + num_blocks);

  auto make_arena = [&](CodecId codec, const std::vector<float>& data,
                        std::vector<std::byte>& arena, KvArenaView& arena_view) {
    arena_view.codec = codec;
    arena_view.unit_bytes = ElementBytes(codec) * head_dim;
    arena_view.head_stride = arena_view.unit_bytes * block_size;
    arena_view.block_stride = arena_view.head_stride * num_kv_heads;
    arena.assign(arena_view.block_stride * num_physical, std::byte{0xff});
    arena_view.base = arena.data();
    const int num_slots = num_blocks * block_size;
    for (int t = 0; t < num_tokens; ++t) {
      const int slot = (first_slot + t) % num_slots;
      for (int h = 0; h < num_kv_heads; ++h) {
        std::byte* dst = arena.data() +
                         arena_view.block_stride * cache.block_table[slot / block_size] +
                         arena_view.head_stride * h + arena_view.unit_bytes * (slot % block_size);
        EncodeRow(codec, &data[(static_cast<size_t>(t) * num_kv_heads + h) * head_dim], head_dim,
                  dst);
      }
    }
  };
  make_arena(k_codec, k, cache.k_arena, cache.view.k);
  make_arena(v_codec, v, cache.v_arena, cache.view.v);
  cache.view.block_table = cache.block_table;
  cache.view.block_size = block_size;
  cache.view.first_slot = first_slot;
  cache.view.num_tokens = num_tokens;
  cache.view.num_kv_heads = num_kv_heads;
  cache.view.head_dim = head_dim;
  return cache;
}

std::vector<float> RandomVector(size_t n, float magnitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-magnitude, magnitude);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

struct Case {
  int num_tokens = 300;
  int num_queries = 1;
  int num_kv_heads = 2;
  int group = 1;
  int head_dim = 64;
  CodecId k_codec = CodecId::kF16;
  CodecId v_codec = CodecId::kF16;
  float query_magnitude = 3.0f;  // scales the scores: larger is a sharper softmax
};

std::string Describe(const Case& c, const Layout& layout, int num_threads) {
  return "tokens=" + std::to_string(c.num_tokens) + " queries=" + std::to_string(c.num_queries) +
         " kv_heads=" + std::to_string(c.num_kv_heads) + " group=" + std::to_string(c.group) +
         " head_dim=" + std::to_string(c.head_dim) +
         " k_codec=" + std::to_string(static_cast<int>(c.k_codec)) +
         " v_codec=" + std::to_string(static_cast<int>(c.v_codec)) + " layout=" + layout.Name() +
         " threads=" + std::to_string(num_threads);
}

// Runs Attention on `layout` and checks it against AttentionReference; returns the output.
std::vector<float> RunAndCompare(const Case& c, const Layout& layout, ThreadPool* pool,
                                 float tolerance = kTolerance) {
  const int num_heads = c.num_kv_heads * c.group;
  const size_t kv_size = static_cast<size_t>(c.num_tokens) * c.num_kv_heads * c.head_dim;
  const std::vector<float> k = RandomVector(kv_size, 1.0f, 1);
  const std::vector<float> v = RandomVector(kv_size, 1.0f, 2);
  const size_t q_size = static_cast<size_t>(c.num_queries) * num_heads * c.head_dim;
  const std::vector<float> q = RandomVector(q_size, c.query_magnitude, 3);
  const TestCache cache =
      BuildCache(k, v, c.num_tokens, c.num_kv_heads, c.head_dim, c.k_codec, c.v_codec, layout);
  const AttentionParams params{num_heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};

  std::vector<float> expected(q_size), actual(q_size, -12345.0f);
  AttentionReference(cache.view, q.data(), c.num_queries, params, expected.data());
  Attention(cache.view, q.data(), c.num_queries, params, actual.data(), pool);

  SCOPED_TRACE(Describe(c, layout, pool == nullptr ? 1 : pool->num_threads()));
  int num_bad = 0;
  for (size_t i = 0; i < q_size && num_bad < 5; ++i) {
    const float allowed = tolerance * std::max(1.0f, std::abs(expected[i]));
    if (!(std::abs(actual[i] - expected[i]) <= allowed)) {
      ++num_bad;
      ADD_FAILURE() << "element " << i << ": got " << actual[i] << ", reference " << expected[i];
    }
  }
  return actual;
}

const Layout kPaged16{LayoutKind::kPaged, 16};

TEST(AttentionTest, ReferenceMatchesHandComputedTwoTokens) {
  // One kv head, head_dim 2, F32: q = (1, 0), keys (0, 0) and (ln 3, 0), values (1, 0) and
  // (0, 1), scale 1. Weights 1/4 and 3/4.
  const std::vector<float> k = {0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 1.0f};
  const TestCache cache = BuildCache(k, v, 2, 1, 2, CodecId::kF32, CodecId::kF32, kPaged16);
  const float q[2] = {1.0f, 0.0f};
  float out[2];
  AttentionReference(cache.view, q, 1, {1, 1.0f}, out);
  EXPECT_NEAR(out[0], 0.25f, 1e-6f);
  EXPECT_NEAR(out[1], 0.75f, 1e-6f);
  // As a prefill of both tokens the first query only sees key 0.
  const float q2[4] = {1.0f, 0.0f, 1.0f, 0.0f};
  float out2[4];
  AttentionReference(cache.view, q2, 2, {1, 1.0f}, out2);
  EXPECT_FLOAT_EQ(out2[0], 1.0f);
  EXPECT_FLOAT_EQ(out2[1], 0.0f);
  EXPECT_NEAR(out2[2], 0.25f, 1e-6f);
  Attention(cache.view, q2, 2, {1, 1.0f}, out2, nullptr);
  EXPECT_NEAR(out2[0], 1.0f, 1e-6f);
  EXPECT_NEAR(out2[3], 0.75f, 1e-6f);
}

TEST(AttentionTest, AllCodecPairsDecodeAndPrefill) {
  ThreadPool pool(2);
  for (CodecId k_codec : {CodecId::kF32, CodecId::kF16, CodecId::kBF16}) {
    for (CodecId v_codec : {CodecId::kF32, CodecId::kF16, CodecId::kBF16}) {
      for (int num_queries : {1, 7}) {
        Case c;
        c.group = 2;
        c.k_codec = k_codec;
        c.v_codec = v_codec;
        c.num_queries = num_queries;
        RunAndCompare(c, kPaged16, nullptr);
        RunAndCompare(c, kPaged16, &pool);
      }
    }
  }
}

TEST(AttentionTest, ShapesGroupsAndHeadDims) {
  ThreadPool pool(2);
  // head_dim 5 takes the one-lane path, 8 and 12 the 4-lane path on wide machines.
  for (int head_dim : {5, 8, 12, 64, 128}) {
    for (int group : {1, 2, 4}) {
      for (int num_tokens : {1, 5, 300, 2000}) {
        for (int num_queries : {1, 7, 64}) {
          if (num_queries > num_tokens) continue;
          if (num_tokens == 2000 && num_queries == 64 && head_dim != 64) continue;  // time
          Case c;
          c.head_dim = head_dim;
          c.group = group;
          c.num_tokens = num_tokens;
          c.num_queries = num_queries;
          c.k_codec = head_dim % 2 == 0 ? CodecId::kF16 : CodecId::kBF16;
          c.v_codec = group == 2 ? CodecId::kF32 : CodecId::kF16;
          RunAndCompare(c, kPaged16, num_tokens >= 300 ? &pool : nullptr);
        }
      }
    }
  }
}

TEST(AttentionTest, EveryLayoutGivesTheSameOutput) {
  const Layout layouts[] = {{LayoutKind::kContiguous, 0},
                            {LayoutKind::kPaged, 1},
                            {LayoutKind::kPaged, 3},
                            {LayoutKind::kPaged, 16},
                            {LayoutKind::kRing, 0}};
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (int num_queries : {1, 7, 64}) {
      Case c;
      c.num_tokens = 700;
      c.group = 4;
      c.num_queries = num_queries;
      c.k_codec = CodecId::kBF16;
      const std::vector<float> first = RunAndCompare(c, layouts[0], p);
      for (const Layout& layout : layouts) {
        // Tiles follow logical positions, so the arithmetic is the same in every layout.
        EXPECT_EQ(RunAndCompare(c, layout, p), first) << layout.Name();
      }
    }
  }
}

TEST(AttentionTest, DecodeSplitAcrossManyChunksMerges) {
  // One kv head and many keys: the decode splits the keys into several chunks even on one
  // thread, and more on two; the merge must weigh them by their own maxima.
  ThreadPool pool(2);
  Case c;
  c.num_tokens = 5000;
  c.num_kv_heads = 1;
  c.group = 4;
  c.k_codec = CodecId::kF32;
  c.v_codec = CodecId::kF32;
  RunAndCompare(c, kPaged16, nullptr);
  RunAndCompare(c, kPaged16, &pool);
}

TEST(AttentionTest, LargeScoresStayFinite) {
  // Scores in the hundreds: exp would overflow without subtracting the running max. Float
  // rounding of such scores (~1e-4 absolute) shifts the weights by as much, hence the looser
  // tolerance.
  ThreadPool pool(2);
  for (int num_queries : {1, 40}) {
    Case c;
    c.num_tokens = 600;
    c.num_queries = num_queries;
    c.query_magnitude = 200.0f;
    c.k_codec = CodecId::kF32;
    RunAndCompare(c, kPaged16, &pool, 1e-3f);
  }
}

TEST(AttentionTest, EverySimdTargetMatchesReference) {
  // The other tests run the best target of this machine; this one forces each target the
  // machine supports in turn (e.g. AVX-512, AVX2, SSE4 and the portable EMU128), whose vector
  // widths take different head_dim paths.
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (int head_dim : {8, 12, 64}) {
      for (int num_queries : {1, 19}) {
        Case c;
        c.head_dim = head_dim;
        c.group = 2;
        c.num_queries = num_queries;
        c.v_codec = CodecId::kBF16;
        RunAndCompare(c, kPaged16, &pool);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

}  // namespace
}  // namespace kvstack
