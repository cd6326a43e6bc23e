// What the attention suites share: hand-built views over test-owned arenas in every layout
// (contiguous, paged with a shuffled block table, a wrapped ring), with and without F32 sink
// and pending segments and Hadamard-rotated keys; the arenas are written with each codec's own
// Encode, and slots and segment rows that no token of that source occupies are NaN, so a
// kernel that reads a wrong slot or source poisons its output. Plus the codec matrix every
// kernel path is run over.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstack/codec.h"
#include "run/attention.h"

namespace kvstack::attention_test {

// Float outputs against the double reference on the same stored bytes (the reference decodes
// them with the codec's own Decode): the kernels differ only in summation order, float
// accumulation, fused multiply-adds in dequantisation and a polynomial exp, so outputs
// (weighted averages of values of magnitude about 1) agree to a few float ulps times the
// number of terms.
constexpr float kTolerance = 2e-5f;

// Where the kernels round on purpose (src/run/attention_vnni-inl.h, on CPUs with AVX-512 VNNI):
// - quantised values are summed with int16 weights, each off by at most 1/65534 of the largest
//   weight of its tile; in these tests outputs moved by up to 7e-5 (allowed: 2e-4);
// - 4- and 2-bit affine values (int4, int2, KIVI's; not q4_absmax) with u8 weights, four keys per
//   vpdpbusd, where a tile's weights spread (forced on every tile in some tests), each off by up
//   to 1.5 steps of 1/254 of the largest of its tile and group, against codes centred on their
//   group's middle: in these tests outputs moved by up to 8.2e-3 (allowed: 2e-2), while the
//   distance to attention over the unquantised values grew by at most 1.3 % over the codec's
//   own as chosen, 5.4 % forced (ValueWeightsAddLittleToTheCodecsError);
// - 4- and 2-bit keys are scored with an int8 query (the step of each 32-element block is
//   1/127 of its largest |q|). MakeInputs' queries lie on that grid, so that is exact, except
//   where the keys are Hadamard-rotated or KIVI's (whose scales fold into the query, with a
//   step of max|q| x max|scale| / 127 per block): that query is off the grid, and with these
//   tests' sharp softmax (queries of magnitude ~4) outputs moved by up to 2.8e-3 (allowed: 1e-2).
// - BF16 and FP8 keys and values, on CPUs with AVX512_BF16 and VBMI
//   (src/run/attention_bf16-inl.h): the query and the softmax weights are rounded to BF16, each
//   off by at most 2^-9 of itself; in these tests outputs and scores moved by up to 8.3e-4
//   (FP8 E4M3 keys and values at head_dim 128; BF16 rows up to 6.5e-4; allowed: 1e-3). FP8
//   rows in FP16 (src/run/attention_half-inl.h, CPUs with AVX512-FP16) round the query and the
//   weights to FP16 and sum runs of 8 values' products in FP16: up to about 1.5e-4 here.
constexpr float kQuantisedValueTolerance = 2e-4f;
constexpr float kU8ValueWeightTolerance = 2e-2f;
constexpr float kRoundedQueryTolerance = 1e-2f;
constexpr float kBf16DotTolerance = 1e-3f;

inline bool IsIntegerCodec(const std::string& name) {
  for (const char* prefix : {"int8", "int4", "int2", "q4_absmax", "kivi"}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

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
  // Whether the readers may weigh 4- and 2-bit values in u8 (the VNNI ones; see
  // kU8ValueWeightTolerance): false holds the others to kQuantisedValueTolerance.
  bool u8_value_weights = true;
};

inline std::vector<float> RandomVector(size_t n, float magnitude, uint32_t seed) {
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
inline TestCache BuildCache(const std::vector<float>& k, const std::vector<float>& v, const Case& c,
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
  // Physical ids in pairs that follow each other, the pairs shuffled: logical order differs
  // from address order, and readers that carry a run of rows on into the next physical block
  // (KvLayerView::ArenaRunAt) meet blocks that do follow and blocks that do not.
  std::vector<int32_t> pairs((num_physical + 1) / 2);
  std::iota(pairs.begin(), pairs.end(), 0);
  std::shuffle(pairs.begin(), pairs.end(), std::mt19937(7));
  for (int32_t pair : pairs) {
    for (int32_t id : {2 * pair, 2 * pair + 1}) {
      if (id < num_physical) cache.block_table.push_back(id);
    }
  }
  cache.block_table.resize(num_blocks);

  const size_t row_elems = static_cast<size_t>(num_kv_heads) * head_dim;
  const std::vector<float> decoy = RandomVector(num_tokens * row_elems, 2.0f, 99);
  auto make_arena = [&](const Codec& codec, const std::vector<float>& data,
                        std::vector<std::byte>& arena, KvArenaView& arena_view) {
    const int group_tokens = codec.group_tokens();
    arena_view.codec = codec.id();
    arena_view.codec_impl = &codec;
    arena_view.group_tokens = group_tokens;
    arena_view.unit_bytes = codec.unit_bytes();
    // Head-major, as KvCache's: [num_kv_heads][num_physical][units of a block].
    arena_view.block_stride = arena_view.unit_bytes * (block_size / group_tokens);
    arena_view.head_stride = arena_view.block_stride * num_physical;
    arena.assign(arena_view.head_stride * num_kv_heads, std::byte{0xff});
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

inline std::string Describe(const Case& c, const Layout& layout, int num_threads) {
  return "tokens=" + std::to_string(c.num_tokens) + " queries=" + std::to_string(c.num_queries) +
         " kv_heads=" + std::to_string(c.num_kv_heads) + " group=" + std::to_string(c.group) +
         " head_dim=" + std::to_string(c.head_dim) + " k=" + c.k_codec + " v=" + c.v_codec +
         " sinks=" + std::to_string(c.num_sinks) +
         " extra_pending=" + std::to_string(c.extra_pending) +
         " rotated=" + std::to_string(c.keys_rotated) + " layout=" + layout.Name() +
         " threads=" + std::to_string(num_threads);
}

inline const Layout kPaged16{LayoutKind::kPaged, 16};

// One attention call's inputs: random keys and values (magnitude 1) stored in `layout`, random
// queries of c.query_magnitude, and the params of 1/sqrt(head_dim).
struct TestInputs {
  std::vector<float> q;  // [num_queries, num_heads, head_dim]
  TestCache cache;
  AttentionParams params;
};

// Random queries on the grid an int8 query quantiser reproduces exactly: n * step with integer
// |n| <= 127, step a power of two near magnitude / 127, and |n| = 127 once in every 16
// elements (so that every 16- or 32-element block's largest |q| is 127 steps).
inline std::vector<float> GridQueries(size_t n, float magnitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  const float step = std::exp2(std::round(std::log2(magnitude / 127.0f)));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int v = dist(rng);
    out[i] = static_cast<float>(i % 16 == 0 ? (v < 0 ? -127 : 127) : v) * step;
  }
  return out;
}

inline TestInputs MakeInputs(const Case& c, const Layout& layout) {
  const int num_heads = c.num_kv_heads * c.group;
  const size_t kv_size = static_cast<size_t>(c.num_tokens) * c.num_kv_heads * c.head_dim;
  const std::vector<float> k = RandomVector(kv_size, 1.0f, 1);
  const std::vector<float> v = RandomVector(kv_size, 1.0f, 2);
  const size_t q_size = static_cast<size_t>(c.num_queries) * num_heads * c.head_dim;
  return {GridQueries(q_size, c.query_magnitude, 3), BuildCache(k, v, c, layout),
          AttentionParams{num_heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim))}};
}

// The tolerance of a case's outputs (see kTolerance and the two after it).
inline float ToleranceFor(const Case& c) {
  float tolerance = kTolerance;
  if (IsIntegerCodec(c.v_codec)) tolerance = kQuantisedValueTolerance;
  if (c.u8_value_weights && IsIntegerCodec(c.v_codec) && !c.v_codec.starts_with("int8") &&
      !c.v_codec.starts_with("q4_absmax")) {
    tolerance = kU8ValueWeightTolerance;
  }
  const auto bf16_dots = [](const std::string& codec) {
    return codec == "bf16" || codec.starts_with("fp8");
  };
  if (bf16_dots(c.k_codec) || bf16_dots(c.v_codec))
    tolerance = std::max(tolerance, kBf16DotTolerance);
  // KIVI folds each unit's per-channel scales into the query, which takes it off the grid.
  if (IsIntegerCodec(c.k_codec) && !c.k_codec.starts_with("int8") &&
      (c.keys_rotated || c.k_codec.starts_with("kivi"))) {
    tolerance = std::max(tolerance, kRoundedQueryTolerance);
  }
  return tolerance;
}

// Adds a failure for each of the first 5 elements where |actual - expected| exceeds
// tolerance * max(1, |expected|).
inline void ExpectClose(const std::vector<float>& actual, const std::vector<float>& expected,
                        float tolerance, const char* what) {
  int num_bad = 0;
  for (size_t i = 0; i < expected.size() && num_bad < 5; ++i) {
    const float allowed = tolerance * std::max(1.0f, std::abs(expected[i]));
    if (!(std::abs(actual[i] - expected[i]) <= allowed)) {
      ++num_bad;
      ADD_FAILURE() << what << " element " << i << ": got " << actual[i] << ", reference "
                    << expected[i];
    }
  }
}

// Every codec name with a head_dim it accepts (the -g64 integer groups span 8 tokens on
// head_dim 8; KIVI keys span 32 tokens).
struct CodecCase {
  const char* name;
  int head_dim;
};
constexpr CodecCase kEveryCodec[] = {
    {"f32", 64},      {"f16", 64},      {"bf16", 64},      {"fp8_e4m3", 64},
    {"fp8_e5m2", 64}, {"int8", 64},     {"int4", 64},      {"int4-g8", 64},
    {"int4-g64", 8},  {"int2-g64", 8},  {"q4_absmax", 64}, {"kivi4", 64},
    {"kivi2", 64},    {"int4-t16", 64}, {"int2-t16", 64},  {"int4-g16-t16", 64},
};

// Which side of the cache the codec under test holds; the other side keeps f16.
enum class CodecSide { kKeys, kValues };

// The case with `codec` on `side` (f16 on the other) and `group` query heads per kv head.
inline Case CodecOnSide(const CodecCase& codec, CodecSide side, int group) {
  Case c;
  c.group = group;
  c.head_dim = codec.head_dim;
  (side == CodecSide::kKeys ? c.k_codec : c.v_codec) = codec.name;
  return c;
}

// Calls run(c, layout) for `c` over sinks (none, 5), pending tokens (none, some), rotated keys
// (no, yes), decode and prefill, and every layout the codecs allow.
template <class Fn>
void ForEachMatrixCase(Case c, Fn&& run) {
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
            run(c, layout);
          }
        }
      }
    }
  }
}

}  // namespace kvstack::attention_test
