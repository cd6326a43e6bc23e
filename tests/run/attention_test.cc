// Tests for the attention kernels (src/run/attention.h): every kernel path (decode and prefill,
// every codec as key and as value, vector widths from scalar to full, one thread and two) is
// compared with AttentionReference on views built by hand over test-owned arenas in every
// layout — contiguous, paged with a shuffled block table, and a wrapped ring — with and without
// F32 sink and pending segments and Hadamard-rotated keys. The arenas are written with each
// codec's own Encode; slots and segment rows that no token of that source occupies are NaN, so
// a kernel that reads a wrong slot or source poisons its output.

#include "run/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kvstack/codec.h"
#include "represent/hadamard.h"

namespace kvstack {
namespace {

// Float outputs against the double reference on the same stored bytes (the reference decodes
// them with the codec's own Decode): the kernels differ only in summation order, float
// accumulation, fused multiply-adds in dequantisation and a polynomial exp, so outputs
// (weighted averages of values of magnitude about 1) agree to a few float ulps times the
// number of terms.
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

struct Case {
  int num_tokens = 300;
  int num_queries = 1;
  int num_kv_heads = 2;
  int group = 1;
  int head_dim = 64;
  std::string k_codec = "f16";
  std::string v_codec = "f16";
  int num_sinks = 0;      // leading tokens held in the F32 sinks segment
  int extra_pending = 0;  // trailing tokens held pending beyond the incomplete unit
  bool keys_rotated = false;
  float query_magnitude = 3.0f;  // scales the scores: larger is a sharper softmax
};

std::vector<float> RandomVector(size_t n, float magnitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-magnitude, magnitude);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// A view over test-owned arenas and segments.
struct TestCache {
  std::unique_ptr<Codec> k_codec, v_codec;
  std::vector<std::byte> k_arena, v_arena;
  std::vector<float> sink_k, sink_v, pending_k, pending_v;
  std::vector<int32_t> block_table;
  KvLayerView view;
};

// k, v: [num_tokens, num_kv_heads, head_dim] logical data, oldest first. Units that straddle
// the sinks' end are encoded with decoy data in their sink positions, so reading a sink token
// from the arena instead of the segment changes the output.
TestCache BuildCache(const std::vector<float>& k, const std::vector<float>& v, const Case& c,
                     const Layout& layout) {
  TestCache cache;
  const int num_tokens = c.num_tokens, num_kv_heads = c.num_kv_heads, head_dim = c.head_dim;
  auto k_codec = CreateCodec(c.k_codec, head_dim, CodecRole::kKey);
  auto v_codec = CreateCodec(c.v_codec, head_dim, CodecRole::kValue);
  KVS_CHECK(k_codec.ok() && v_codec.ok());
  cache.k_codec = std::move(*k_codec);
  cache.v_codec = std::move(*v_codec);
  const int unit_len = std::lcm(cache.k_codec->group_tokens(), cache.v_codec->group_tokens());
  const int num_sinks = c.num_sinks;
  const int arena_end = std::max(num_sinks, (num_tokens - c.extra_pending) / unit_len * unit_len);
  KVS_CHECK(arena_end <= num_tokens);

  int block_size = 1, num_blocks = 1, num_physical = 1, first_slot = 0;
  const int round_up = (num_tokens + 3 + unit_len - 1) / unit_len * unit_len;
  switch (layout.kind) {
    case LayoutKind::kContiguous:  // spare capacity past the tokens, like a real cache
      block_size = round_up;
      break;
    case LayoutKind::kPaged:
      block_size = layout.block_size;
      KVS_CHECK(block_size % unit_len == 0);
      num_blocks = (num_tokens + block_size - 1) / block_size;
      num_physical = num_blocks + 2;  // blocks of other sequences in the same pool
      break;
    case LayoutKind::kRing:
      KVS_CHECK(unit_len == 1);
      block_size = num_tokens + 4;
      first_slot = block_size - std::max(1, num_tokens / 2);  // wraps after half the tokens
      break;
  }
  // Shuffled physical ids, so logical order differs from address order.
  std::vector<int32_t> ids(num_physical);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  cache.block_table.assign(ids.begin(), ids.begin() + num_blocks);

  const size_t row_elems = static_cast<size_t>(num_kv_heads) * head_dim;
  const std::vector<float> decoy = RandomVector(num_tokens * row_elems, 2.0f, 99);
  auto make_arena = [&](const Codec& codec, const std::vector<float>& data,
                        std::vector<std::byte>& arena, KvArenaView& arena_view) {
    const int group_tokens = codec.group_tokens();
    arena_view.codec = codec.id();
    arena_view.codec_impl = &codec;
    arena_view.group_tokens = group_tokens;
    arena_view.unit_bytes = codec.unit_bytes();
    arena_view.head_stride = arena_view.unit_bytes * (block_size / group_tokens);
    arena_view.block_stride = arena_view.head_stride * num_kv_heads;
    arena.assign(arena_view.block_stride * num_physical, std::byte{0xff});
    arena_view.base = arena.data();
    const int num_slots = num_blocks * block_size;
    std::vector<float> unit(static_cast<size_t>(group_tokens) * head_dim);
    // Units holding at least one arena token [num_sinks, arena_end).
    for (int u = num_sinks / group_tokens; (u + 1) * group_tokens <= arena_end; ++u) {
      const int slot = (first_slot + u * group_tokens) % num_slots;
      for (int h = 0; h < num_kv_heads; ++h) {
        for (int t = 0; t < group_tokens; ++t) {
          const int logical = u * group_tokens + t;
          const std::vector<float>& src = logical < num_sinks ? decoy : data;
          std::copy_n(&src[logical * row_elems + static_cast<size_t>(h) * head_dim], head_dim,
                      &unit[static_cast<size_t>(t) * head_dim]);
        }
        std::byte* dst = arena.data() +
                         arena_view.block_stride * cache.block_table[slot / block_size] +
                         arena_view.head_stride * h +
                         arena_view.unit_bytes * ((slot % block_size) / group_tokens);
        codec.EncodeHead(h, unit, {dst, arena_view.unit_bytes});
      }
    }
  };
  make_arena(*cache.k_codec, k, cache.k_arena, cache.view.k);
  make_arena(*cache.v_codec, v, cache.v_arena, cache.view.v);

  // Segments: [num_kv_heads][stride_tokens][head_dim], NaN in rows that hold no token.
  auto make_segment = [&](int begin, int end, int origin, int stride_tokens,
                          std::vector<float>& k_buffer, std::vector<float>& v_buffer,
                          KvF32Segment& seg) {
    if (begin == end) return;
    k_buffer.assign(row_elems * stride_tokens, std::nanf(""));
    v_buffer.assign(row_elems * stride_tokens, std::nanf(""));
    for (int t = begin; t < end; ++t) {
      for (int h = 0; h < num_kv_heads; ++h) {
        const size_t from = t * row_elems + static_cast<size_t>(h) * head_dim;
        const size_t to = (static_cast<size_t>(h) * stride_tokens + (t - origin)) * head_dim;
        std::copy_n(&k[from], head_dim, &k_buffer[to]);
        std::copy_n(&v[from], head_dim, &v_buffer[to]);
      }
    }
    seg = {k_buffer.data(), v_buffer.data(), stride_tokens, origin, begin, end};
  };
  make_segment(0, num_sinks, 0, num_sinks + 1, cache.sink_k, cache.sink_v, cache.view.sinks);
  make_segment(arena_end, num_tokens, arena_end - 1, num_tokens - arena_end + 3, cache.pending_k,
               cache.pending_v, cache.view.pending);
  cache.view.block_table = cache.block_table;
  cache.view.block_size = block_size;
  cache.view.first_slot = first_slot;
  cache.view.num_tokens = num_tokens;
  cache.view.num_kv_heads = num_kv_heads;
  cache.view.head_dim = head_dim;
  cache.view.keys_rotated = c.keys_rotated;
  return cache;
}

std::string Describe(const Case& c, const Layout& layout, int num_threads) {
  return "tokens=" + std::to_string(c.num_tokens) + " queries=" + std::to_string(c.num_queries) +
         " kv_heads=" + std::to_string(c.num_kv_heads) + " group=" + std::to_string(c.group) +
         " head_dim=" + std::to_string(c.head_dim) + " k=" + c.k_codec + " v=" + c.v_codec +
         " sinks=" + std::to_string(c.num_sinks) +
         " extra_pending=" + std::to_string(c.extra_pending) +
         " rotated=" + std::to_string(c.keys_rotated) + " layout=" + layout.Name() +
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
  const TestCache cache = BuildCache(k, v, c, layout);
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
  Case c;
  c.num_tokens = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.k_codec = c.v_codec = "f32";
  const TestCache cache = BuildCache(k, v, c, kPaged16);
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
  for (const char* k_codec : {"f32", "f16", "bf16"}) {
    for (const char* v_codec : {"f32", "f16", "bf16"}) {
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
          c.k_codec = head_dim % 2 == 0 ? "f16" : "bf16";
          c.v_codec = group == 2 ? "f32" : "f16";
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
      c.k_codec = "bf16";
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
  c.k_codec = "f32";
  c.v_codec = "f32";
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
    c.k_codec = "f32";
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
        c.v_codec = "bf16";
        RunAndCompare(c, kPaged16, &pool);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

// Every codec name with a head_dim it accepts (the -g64 integer groups span 8 tokens on
// head_dim 8; KIVI keys span 32 tokens).
struct CodecCase {
  const char* name;
  int head_dim;
};
constexpr CodecCase kEveryCodec[] = {
    {"f32", 64},       {"f16", 64},   {"bf16", 64},    {"fp8_e4m3", 64}, {"fp8_e5m2", 64},
    {"int8", 64},      {"int4", 64},  {"int4-g8", 64}, {"int4-g64", 8},  {"int2-g64", 8},
    {"q4_absmax", 64}, {"kivi4", 64}, {"kivi2", 64},
};

// Runs `c` over sinks (none, 5), pending tokens (none, some), rotated keys (no, yes), decode
// and prefill, every layout the codecs allow, on one thread and two.
void RunMatrix(Case c, ThreadPool* pool) {
  auto k_codec = CreateCodec(c.k_codec, c.head_dim, CodecRole::kKey);
  auto v_codec = CreateCodec(c.v_codec, c.head_dim, CodecRole::kValue);
  ASSERT_TRUE(k_codec.ok()) << k_codec.status();
  ASSERT_TRUE(v_codec.ok()) << v_codec.status();
  const int unit_len = std::lcm((*k_codec)->group_tokens(), (*v_codec)->group_tokens());
  std::vector<Layout> layouts = {{LayoutKind::kContiguous, 0},
                                 {LayoutKind::kPaged, unit_len == 1 ? 16 : 2 * unit_len}};
  if (unit_len == 1) layouts.push_back({LayoutKind::kRing, 0});
  for (int num_sinks : {0, 5}) {
    for (int pending : {0, 1}) {
      // 320 tokens: every unit complete; 300: an incomplete unit (T > 1) or 3 extra tokens
      // (T = 1) pending.
      c.num_tokens = pending ? 300 : 320;
      c.extra_pending = pending && unit_len == 1 ? 3 : 0;
      c.num_sinks = num_sinks;
      for (bool rotated : {false, true}) {
        c.keys_rotated = rotated;
        for (int num_queries : {1, 7}) {
          c.num_queries = num_queries;
          for (const Layout& layout : layouts) {
            RunAndCompare(c, layout, nullptr);
            RunAndCompare(c, layout, pool);
          }
        }
      }
    }
  }
}

TEST(AttentionTest, EveryCodecAsKeyWithF16Values) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    Case c;
    c.group = 2;
    c.head_dim = codec.head_dim;
    c.k_codec = codec.name;
    c.v_codec = "f16";
    RunMatrix(c, &pool);
  }
}

TEST(AttentionTest, EveryCodecAsValueWithF16Keys) {
  ThreadPool pool(2);
  for (const CodecCase& codec : kEveryCodec) {
    Case c;
    c.group = 2;
    c.head_dim = codec.head_dim;
    c.k_codec = "f16";
    c.v_codec = codec.name;
    RunMatrix(c, &pool);
  }
}

TEST(AttentionTest, FastCodecPairsTogether) {
  // The pairs the engine uses (and mixed ones): both sides on their fast readers at once,
  // GQA group 4, long enough for several split-K chunks.
  ThreadPool pool(2);
  const struct {
    const char* k;
    const char* v;
    int head_dim;
  } pairs[] = {
      {"int8", "int8", 64},        {"int4", "int4", 64},         {"int2", "int2", 64},
      {"kivi4", "kivi4", 64},      {"kivi2", "kivi2", 64},       {"int4-g64", "int4-g64", 8},
      {"int2-g64", "int2-g64", 8}, {"kivi4", "int8", 64},        {"int8", "int4-g8", 64},
      {"kivi2-g64", "bf16", 128},  {"int4-g16", "kivi2-g16", 32}};
  for (const auto& pair : pairs) {
    Case c;
    c.num_tokens = 2000;
    c.group = 4;
    c.head_dim = pair.head_dim;
    c.k_codec = pair.k;
    c.v_codec = pair.v;
    c.num_sinks = 4;
    for (int num_queries : {1, 5}) {
      c.num_queries = num_queries;
      RunAndCompare(c, {LayoutKind::kPaged, 64}, &pool);
    }
  }
}

TEST(AttentionTest, QuantisedCodecsAtEveryHeadDim) {
  // head_dim 12 and 20 take the 4-lane readers on wide machines, 5 the generic path.
  for (int head_dim : {5, 8, 12, 16, 20, 128}) {
    for (const char* name : {"int8", "int4", "int2", "kivi4", "kivi2", "fp8_e4m3", "q4_absmax"}) {
      std::string codec = name;
      // Groups must divide head_dim: the whole row for the integer and KIVI value groups.
      if (codec == "int4" || codec == "int2" || codec == "kivi4" || codec == "kivi2") {
        codec += "-g" + std::to_string(head_dim);
      }
      if (codec == "q4_absmax" && head_dim > 32 && head_dim % 32 != 0) continue;
      if (!CreateCodec(codec, head_dim, CodecRole::kKey).ok()) continue;  // e.g. int2 on 5
      Case c;
      c.num_tokens = 150;
      c.group = 2;
      c.head_dim = head_dim;
      c.k_codec = codec;
      c.v_codec = codec;
      for (int num_queries : {1, 3}) {
        c.num_queries = num_queries;
        RunAndCompare(c, {LayoutKind::kPaged, 16 * head_dim}, nullptr);
      }
    }
  }
}

TEST(AttentionTest, RotatedKeysGiveTheUnrotatedAttention) {
  // Storing H k with keys_rotated set must give attention over k (H is orthonormal): this
  // checks the rotation against the unrotated computation, not against the reference.
  Case c;
  c.head_dim = 16;
  c.group = 2;
  c.k_codec = c.v_codec = "f32";
  const size_t kv_size = static_cast<size_t>(c.num_tokens) * c.num_kv_heads * c.head_dim;
  const std::vector<float> k = RandomVector(kv_size, 1.0f, 1);
  const std::vector<float> v = RandomVector(kv_size, 1.0f, 2);
  std::vector<float> rotated = k;
  for (size_t i = 0; i < kv_size; i += c.head_dim) HadamardRotate({&rotated[i], 16});
  const TestCache plain = BuildCache(k, v, c, kPaged16);
  c.keys_rotated = true;
  const TestCache stored_rotated = BuildCache(rotated, v, c, kPaged16);
  const int num_heads = c.num_kv_heads * c.group;
  const AttentionParams params{num_heads, 0.25f};
  for (int num_queries : {1, 6}) {
    const std::vector<float> q = RandomVector(num_queries * num_heads * 16, 3.0f, 3);
    std::vector<float> expected(q.size()), actual(q.size());
    Attention(plain.view, q.data(), num_queries, params, expected.data(), nullptr);
    Attention(stored_rotated.view, q.data(), num_queries, params, actual.data(), nullptr);
    for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5f) << i;
  }
}

TEST(AttentionTest, SegmentsOnlyAndTinyArenas) {
  // Edge splits of the three sources: all tokens in sinks (empty arena), an arena of one
  // token, a single KIVI unit whose first tokens are sinks and whose last are pending.
  ThreadPool pool(2);
  Case c;
  c.num_tokens = 6;
  c.group = 2;
  c.num_sinks = 6;
  for (int num_queries : {1, 6}) {
    c.num_queries = num_queries;
    RunAndCompare(c, kPaged16, &pool);
  }
  c.num_sinks = 5;
  RunAndCompare(c, kPaged16, &pool);
  c.k_codec = "kivi4-g8";
  c.v_codec = "int4";
  c.num_tokens = 14;
  c.num_sinks = 3;
  for (int num_queries : {1, 14}) {
    c.num_queries = num_queries;
    RunAndCompare(c, kPaged16, &pool);
  }
}

TEST(AttentionTest, QuantisedReadersOnEverySimdTarget) {
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const char* k : {"int8", "int4", "int2", "kivi4", "kivi2", "int4-g64", "fp8_e4m3",
                          "fp8_e5m2", "q4_absmax"}) {
      Case c;
      c.head_dim = std::string(k) == "int4-g64" ? 8 : 64;
      c.group = 2;
      c.k_codec = k;
      c.v_codec = std::string(k).starts_with("kivi") ? "int4" : k;
      c.num_sinks = 3;
      RunAndCompare(c, {LayoutKind::kPaged, 64}, &pool);
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

}  // namespace
}  // namespace kvstack
