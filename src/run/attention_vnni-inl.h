// Per-target decode readers for integer keys and values with AVX-512 VNNI (included by
// attention_decode.cc inside its foreach_target pass; compiled only for the AVX3 target, used only
// where the CPU reports avx512vnni and avx512vbmi; every other machine keeps the float readers).
//
// Why: the float readers convert every key and value element to F32 and spend one FMA per
// query head on it, which made int8/int4/int2 caches compute-bound (28-43 ns per token per kv
// head). Here integer dot products do the work on the codes as stored.
//
// Keys: the query is quantised to int8 once per task and one vpdpbusd multiplies 64 key codes
// (u8) by 64 query bytes (s8). The keys of 16 tokens are transposed so that each i32 lane holds
// one token: a 16x16 dword transpose (LoadColumns; 8x8 of two rows per vector for rows of at
// most 8 dwords) turns 16 rows into columns of 4 code bytes, and the query bytes that match a
// column are a broadcast operand. Scores then come out one vector per 16
// tokens with no horizontal sums, and per-group scales and minima multiply whole vectors.
//
// Query quantisation (what it costs in accuracy): per block of 32 elements (16 for 16-element
// key groups; 64 for int8 keys where head_dim is a multiple of 64, one block per 16x16
// transpose) the step is sq = max|q| / 127 over the block, so each query element is off by at
// most sq / 2 = max|q| / 254 — what llama.cpp's q8_0 activations accept for its 4-bit caches,
// and well below the error of 4- and 2-bit keys themselves (1/30 and 1/6 of a group's range).
// int8 keys, whose own error is about that size, take a second byte: q = sq * (hi + lo / 256),
// off by at most max|q| / 65024, below the rounding of an F16 query. The scores' minimum terms
// use the exact query sum.
//
// KIVI keys fold each unit's per-channel scales into the query, so their queries are quantised
// once per unit (VnniPrepareKiviUnit) instead of once per task, with a step per block of
// max|q| x max|scale| / 127 (a bound on |q * scale|, not its maximum: each element is off by at
// most 1/254 of that bound).
//
// Values: see VnniAccumulateTile (int16 weights, vpdpwssd over pairs of keys; 4- and 2-bit codes
// by 16-byte spans, AccumulateSpans, and for affine groups u8 weights, vpdpbusd over four keys,
// AccumulateQuadSpans).
//
// Formats: int8 rows ([f16 scale][int8 codes], codes offset by +128 to unsigned and corrected),
// integer groups of 4 or 2 bits with (scale, min) pairs per group of >= 16 elements in the row
// header, one pair per multi-token unit, or q4_absmax's d per 32 elements.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvstack/numeric.h"
#include "run/attention_kernels.h"

#if defined(KVSTACK_RUN_ATTENTION_VNNI_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_VNNI_INL_H_
#undef KVSTACK_RUN_ATTENTION_VNNI_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_VNNI_INL_H_
#endif

#include "hwy/highway.h"
#include "run/attention_readers-inl.h"

#if HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

// Largest head_dim the VNNI readers take (their per-head query tables are fixed arrays).
constexpr size_t kVnniMaxHeadDim = 256;

// How one arena (keys or values) is read with VNNI; ok is false where the float readers must
// be used.
struct VnniPlan {
  bool ok = false;
  int bits = 8;            // 8 (int8 rows), 4 or 2 (integer groups)
  int block_elems = 32;    // elements per query block (one query scale, one i32 accumulator)
  int group_elems = 0;     // integer groups: elements per (scale, min) pair; int8: head_dim
  int num_groups = 1;      // per row
  bool absmax = false;     // header holds one f16 d per group: (scale, min) = (d, -8 d)
  bool kivi = false;       // KIVI keys: per-channel (scale, min) per unit, folded into the query
  size_t code_offset = 0;  // bytes from rows[k] to the codes (int8: the f16 scale)
  size_t head_dim = 0;
  // Values: per block of 16 elements, the vpermt2b index that puts the code bytes of two rows
  // (64 bytes each) into the two words of each dword (see VnniAccumulateTile).
  const uint8_t (*index)[64] = nullptr;
  // Queries: the vpermb index that puts the query bytes of each 64-element chunk in [column]
  // [part][byte] order (see VnniPrepareQueries).
  const uint8_t* query_index = nullptr;
  const uint8_t* packed_query_index = nullptr;  // the same for packed bytes (KIVI)
  // 4- and 2-bit values read by 16-byte spans (AccumulateSpans; 0: by blocks of 16 elements):
  // spans per row, and the (scale, min) groups within a span (1, or 2 groups of 8 bytes).
  int value_spans = 0;
  int span_groups = 1;
  // The vpermt2b indexes of AccumulateSpans: [span_groups - 1][span within the load].
  const uint8_t (*span_index)[2][64] = nullptr;
  // Whether span-read values may take u8 weights, four keys per dword (AccumulateQuadSpans;
  // TakesQuadWeights chooses per tile): where every scale is >= 0 (affine groups; q4_absmax's d
  // carries a sign and keeps int16 pairs). And their two vpermt2b indexes (QuadIndexes).
  bool value_quads = false;
  const struct QuadIndexes* quad_index = nullptr;
  // The state slot that holds each element (the inverse of SpanElement), for
  // VnniSpanOrderToElements.
  const int32_t* span_slot = nullptr;
  // -t16 tiles (SideSpec::tiled): header pairs at unit + 64 g, key code words at unit +
  // tile.code_offset + 64 w, one lane per token (TileOf). (code_offset stays 0: values' rows
  // point at their codes.)
  bool tiled = false;
  TileGeometry tile;
};

// One query head quantised for a VnniPlan (see the file comment).
struct VnniQuery {
  int32_t hi[kVnniMaxHeadDim / 4];  // [column * parts + part]: 4 query bytes, s8
  int32_t lo[kVnniMaxHeadDim / 4];
  float block_scale[kVnniMaxHeadDim / 16];   // per block: sq / 256 (KIVI units: sq)
  int32_t correction[kVnniMaxHeadDim / 16];  // int8 keys: 128 * sum(256 hi + lo) per block
  float group_sum[16];                       // the exact query summed over each key group
  // int8 keys on AVX2 (MaddPrepareQueries): the row as int16, step block_scale[0].
  int16_t words[kVnniMaxHeadDim];
};

// A tile's int16 value weights, two keys per dword (u8 where TakesQuadWeights, four keys per
// dword, the first num_pairs / 2 of each row), [group][num_groups][num_pairs], with each head
// and group's step and minima's sum, [group][num_groups] (VnniAccumulateTile and the AVX2
// readers' MaddAccumulateTile): per-thread scratch that only grows.
struct ValueWeights {
  int32_t* weights;
  float* w_scale;
  float* min_sum;
};
inline ValueWeights ValueWeightsScratch(int group, int num_groups, size_t num_pairs) {
  thread_local std::vector<int32_t> weights;
  thread_local std::vector<float> w_scale, min_sum;
  weights.resize(static_cast<size_t>(group) * num_groups * num_pairs);
  w_scale.resize(static_cast<size_t>(group) * num_groups);
  min_sum.resize(static_cast<size_t>(group) * num_groups);
  return {weights.data(), w_scale.data(), min_sum.data()};
}

// A tile's softmax weights summed up per query head j: max[j] the largest of p_j and sum[j] their
// sum ([group] each), over p[0, num_keys rounded up to the readers' multiple) (0 past num_keys).
// The decode's softmax takes them as it writes p, so that the integer value readers, which scale
// their weights by the largest, need no pass of their own over p.
struct TileWeightStats {
  const float* max;
  const float* sum;
};

// The `group` query heads for KIVI keys, prepared once per task (KiviPrepareQueries) and folded
// with each unit's scales by VnniPrepareKiviUnit.
struct KiviQueries {
  const float* q = nullptr;  // [group, head_dim] the scaled (and rotated) float queries
  std::vector<float> qhat;   // [group, head_dim] q per block of 32 times 127 / its largest |q|
  std::vector<float> qmax;   // [group, head_dim / 32] those largest, then 3 floats of padding
};

// The shape of an integer dot-product plan for one arena (keys or values), shared by the VNNI
// readers and the AVX2 ones (attention_madd-inl.h): bits, groups, header and code layout and the
// query block; ok where the readers' rules take it (head_dim a multiple of 32 up to
// kVnniMaxHeadDim; integer groups of a multiple of 16 elements, at most 16 per row; int8 rows;
// KIVI keys). The permute tables and value spans are the VNNI readers' own (PlanVnni).
inline VnniPlan IntegerPlanShape(const SideSpec& side, size_t head_dim) {
  VnniPlan plan;
  if (head_dim % 32 != 0 || head_dim > kVnniMaxHeadDim) return plan;
  plan.head_dim = head_dim;
  switch (side.reader) {
    case Reader::kInt8:
      plan.bits = 8;
      plan.group_elems = static_cast<int>(head_dim);
      plan.code_offset = sizeof(uint16_t);
      break;
    case Reader::kInt4:
    case Reader::kInt4S:
    case Reader::kInt2: {
      plan.bits = side.reader == Reader::kInt2 ? 2 : 4;
      plan.group_elems = side.group_elems;
      plan.num_groups = side.num_header_floats / 2;
      plan.absmax = side.absmax_header;
      plan.tiled = side.tiled;
      if (side.tiled) plan.tile = side.tile();
      if (plan.group_elems % 16 != 0 || plan.num_groups > 16 ||
          static_cast<size_t>(plan.group_elems * plan.num_groups) != head_dim) {
        return plan;
      }
      break;
    }
    case Reader::kKivi4:
    case Reader::kKivi2:
      plan.bits = side.reader == Reader::kKivi2 ? 2 : 4;
      plan.group_elems = static_cast<int>(head_dim);
      plan.kivi = true;
      break;
    default:
      return plan;
  }
  // int8 keys: one block per 16 code columns (one transpose) where head_dim allows, half the
  // per-block conversions of blocks of 32 (their 16-bit query, off by at most max|q| / 65024
  // over the block, needs no shorter blocks).
  plan.block_elems = plan.bits == 8 && head_dim % 64 == 0 ? 64
                     : plan.group_elems % 32 == 0         ? 32
                                                          : 16;
  plan.ok = true;
  return plan;
}

// Dwords of a gathered tile (TileOf): up to 16 header pairs and 32 code words per token.
constexpr size_t kTileDwords = 16 * (16 + kVnniMaxHeadDim / 8);

// Which token of its -t16 unit (set.hdrs[key]) key `key` of `set` is (FillRows' rows).
HWY_INLINE size_t TokenInTile(const TileGeometry& tile, const RowSet& set, size_t key) {
  return static_cast<size_t>(set.rows[key] - set.hdrs[key] - tile.code_offset) /
         tile.row_code_bytes;
}

// Whether keys [key0, key0 + 16) of `set` are the 16 tokens of one -t16 unit in order.
HWY_INLINE bool IsWholeTile(const TileGeometry& tile, const RowSet& set, size_t key0) {
  const std::byte* unit = set.hdrs[key0];
  const size_t last = key0 + kTileTokens - 1;
  return set.hdrs[last] == unit && set.rows[key0] == unit + tile.code_offset &&
         set.rows[last] == set.rows[key0] + (kTileTokens - 1) * tile.row_code_bytes;
}

// The -t16 tile that holds keys [key0, key0 + 16) of `set` in lane order (lane k = key0 + k):
// the unit itself where those keys are its 16 tokens in order (the common case: decode's parts
// and tiles start on unit boundaries), else a copy of their header pairs (and with `codes`, their
// code words) gathered into per-thread scratch laid out as a unit (valid until the next call).
// (For every target: the VNNI readers' and the AVX2 ones' (attention_madd-inl.h).)
HWY_INLINE const std::byte* TileOf(const VnniPlan& plan, const RowSet& set, size_t key0,
                                   bool codes) {
  const TileGeometry& tile = plan.tile;
  if (IsWholeTile(tile, set, key0)) return set.hdrs[key0];
  alignas(64) thread_local std::byte gathered[4 * kTileDwords];
  const size_t code_words = codes ? tile.row_code_bytes / 4 : 0;
  for (size_t k = 0; k < 16; ++k) {  // lane k from token t of its unit
    const std::byte* from = set.hdrs[key0 + k];
    const size_t t = TokenInTile(tile, set, key0 + k);
    for (size_t g = 0; g < tile.num_groups; ++g) {
      std::memcpy(gathered + tile.HeaderPair(g, k), from + tile.HeaderPair(g, t), 4);
    }
    for (size_t w = 0; w < code_words; ++w) {
      std::memcpy(gathered + tile.KeyWord(w, k), from + tile.KeyWord(w, t), 4);
    }
  }
  return gathered;
}

#if HWY_TARGET == HWY_AVX3

// VNNI for the dot products, VBMI for the byte permutes of the value codes, on top of the
// AVX3 target's own features: clang lets a function's target attribute replace the
// HWY_BEFORE_NAMESPACE pragma's list (g++ merges them), so the list is spelled out whole.
#define KVS_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni,avx512vbmi")))

bool CpuHasVnni() {
  static const bool has =
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return has && !DotProductReadersDisabledForTest();
}

// The permute indexes of one code width, computed once.
struct VnniTables {
  // Value block m (elements 16 m + i): dword i takes code byte (16 m + i) / parts of the first
  // row (within its 64-byte half) and of the second row (64 bytes on), in bytes 0 and 2 (int8:
  // 1 and 3, the words' high bytes, so that an arithmetic shift sign-extends them).
  alignas(64) uint8_t value_index[kVnniMaxHeadDim / 16][64];
  // Query element e = (4 c + byte) * parts + part goes to byte `byte` of word c * parts + part;
  // within each 64 elements, so one vpermb per 64 query bytes: out[i] = in[query_index[i]].
  alignas(64) uint8_t query_index[64];
  // query_index for bytes packed from four vectors of 16 int32 (elements 16 v .. 16 v + 15 in
  // vector v) by two vpackssdw and a vpacksswb (PackedByte), as VnniPrepareKiviUnit leaves them.
  alignas(64) uint8_t packed_query_index[64];
};

// Where vpacksswb(vpackssdw(v0, v1), vpackssdw(v2, v3)) puts element e of 64, element 16 v + i
// of vector v: the packs work within 128-bit lanes, lane L taking dwords 4 L .. 4 L + 3 of each.
constexpr int PackedByte(int e) {
  const int v = e / 16, lane = e % 16 / 4, dword = e % 4;
  return 16 * lane + v / 2 * 8 + v % 2 * 4 + dword;
}

// Value spans (AccumulateSpans): dword i of a span takes byte SpanByte(i) of the span from the
// first key of a pair (byte 0) and from the second (byte 2). With two groups in a span, lanes
// alternate between them, so that one broadcast 64-bit weight pair serves a whole vector.
constexpr int SpanByte(int lane, int span_groups) {
  return span_groups == 1 ? lane : lane % 2 * 8 + lane / 2;
}

// The element that state slot `slot` of a span-read head holds: slot (s * parts + r) * 16 + i is
// part r (bits [r * bits, (r + 1) * bits)) of byte SpanByte(i) of span s.
inline int SpanElement(int slot, int bits, int span_groups) {
  const int parts = 8 / bits, block = slot / 16;
  return (16 * (block / parts) + SpanByte(slot % 16, span_groups)) * parts + block % parts;
}

// The inverse of SpanElement for `bits` and `span_groups`, over the largest head_dim (spans keep
// their elements among their own slots, so every head_dim's slots map among themselves).
const int32_t* SpanSlots(int bits, int span_groups) {
  struct Slots {
    int32_t slot[2][2][kVnniMaxHeadDim];  // [bits == 2][span_groups - 1][element]
  };
  static const Slots kSlots = [] {
    Slots t{};
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < 2; ++g) {
        for (int slot = 0; slot < static_cast<int>(kVnniMaxHeadDim); ++slot) {
          t.slot[b][g][SpanElement(slot, b == 0 ? 4 : 2, g + 1)] = slot;
        }
      }
    }
    return t;
  }();
  return kSlots.slot[bits == 2][span_groups - 1];
}

const uint8_t (*SpanIndexes())[2][64] {
  struct Indexes {
    alignas(64) uint8_t index[2][2][64];  // [span_groups - 1][span within the load]
  };
  static const Indexes kIndexes = [] {
    Indexes t{};
    for (int g = 0; g < 2; ++g) {
      for (int span = 0; span < 2; ++span) {
        for (int i = 0; i < 16; ++i) {
          const int byte = 16 * span + SpanByte(i, g + 1);
          t.index[g][span][4 * i] = static_cast<uint8_t>(byte);
          t.index[g][span][4 * i + 2] = static_cast<uint8_t>(64 + byte);
        }
      }
    }
    return t;
  }();
  return kIndexes.index;
}

// AccumulateQuadSpans' vpermt2b indexes: `pair` interleaves the 32 bytes loaded from two keys
// (byte b of the first at 2 b, of the second at 2 b + 1); quad[span_groups - 1][s] then puts
// byte SpanByte(i) of span s (within the load) of four keys, from two such vectors, into the
// four bytes of dword i, in key order (the span order of AccumulateSpans, four keys deep).
struct QuadIndexes {
  alignas(64) uint8_t pair[64];
  alignas(64) uint8_t quad[2][2][64];
};

const QuadIndexes* QuadIndexesOnce() {
  static const QuadIndexes kIndexes = [] {
    QuadIndexes t{};
    for (int b = 0; b < 32; ++b) {
      t.pair[2 * b] = static_cast<uint8_t>(b);
      t.pair[2 * b + 1] = static_cast<uint8_t>(64 + b);
    }
    for (int g = 0; g < 2; ++g) {
      for (int span = 0; span < 2; ++span) {
        for (int i = 0; i < 16; ++i) {
          const int word = 16 * span + SpanByte(i, g + 1);  // the byte's word in both vectors
          for (int k = 0; k < 4; ++k) {
            t.quad[g][span][4 * i + k] = static_cast<uint8_t>(k / 2 * 64 + 2 * word + k % 2);
          }
        }
      }
    }
    return t;
  }();
  return &kIndexes;
}

const VnniTables& VnniTablesFor(int bits) {
  static const auto kTables = [] {
    std::array<VnniTables, 3> tables{};  // bits 8, 4, 2
    for (int t = 0; t < 3; ++t) {
      const int bits = 8 >> t;
      const int parts = 8 / bits;
      const int low = bits == 8 ? 1 : 0;
      for (size_t m = 0; m < kVnniMaxHeadDim / 16; ++m) {
        for (int i = 0; i < 16; ++i) {
          const int byte = static_cast<int>((16 * m + i) / parts) % 64;
          uint8_t* dword = tables[t].value_index[m] + 4 * i;
          dword[low] = static_cast<uint8_t>(byte);
          dword[low + 2] = static_cast<uint8_t>(64 + byte);
          dword[1 - low] = dword[3 - low] = 0;
        }
      }
      for (int e = 0; e < 64; ++e) {
        const int part = e % parts, column = e / parts / 4, byte = e / parts % 4;
        tables[t].query_index[4 * (column * parts + part) + byte] = static_cast<uint8_t>(e);
        tables[t].packed_query_index[4 * (column * parts + part) + byte] =
            static_cast<uint8_t>(PackedByte(e));
      }
    }
    return tables;
  }();
  return kTables[bits == 8 ? 0 : bits == 4 ? 1 : 2];
}

// The plan for one arena's keys or values (values use the permute indexes, keys the blocks).
VnniPlan PlanVnni(const SideSpec& side, size_t head_dim, size_t lanes) {
  if (lanes != 16 || !CpuHasVnni()) return {};
  VnniPlan plan = IntegerPlanShape(side, head_dim);
  if (!plan.ok) return plan;
  const VnniTables& tables = VnniTablesFor(plan.bits);
  plan.index = tables.value_index;
  plan.query_index = tables.query_index;
  plan.packed_query_index = tables.packed_query_index;
  const size_t row_bytes = head_dim * plan.bits / 8;
  const int group_bytes = plan.group_elems * plan.bits / 8;
  if (plan.bits < 8 && !plan.kivi && row_bytes % 16 == 0 &&
      (group_bytes % 16 == 0 || group_bytes == 8)) {
    plan.value_spans = static_cast<int>(row_bytes / 16);
    plan.span_groups = group_bytes == 8 ? 2 : 1;
    plan.span_index = SpanIndexes();
    plan.span_slot = SpanSlots(plan.bits, plan.span_groups);
    plan.value_quads = !plan.absmax;
    plan.quad_index = QuadIndexesOnce();
  }
  return plan;
}

// The largest |x[e]| of x[0, n), n a multiple of 16.
KVS_VNNI_ATTR float MaxAbs(const float* x, int n) {
  __m512 max_abs = _mm512_setzero_ps();
  for (int e = 0; e < n; e += 16) {
    max_abs = _mm512_max_ps(max_abs, _mm512_abs_ps(_mm512_loadu_ps(x + e)));
  }
  return _mm512_reduce_max_ps(max_abs);
}

// Quantises x[0, n) (n a multiple of 16) with the step sq = max_abs / 127: hi[e] = round(x[e] /
// sq) and, with lo (not null), lo[e] = round(256 (x[e] - hi[e] sq) / sq), each clamped to
// [-127, 127]. Returns the sum of 256 hi + lo over the elements (0 without lo).
KVS_VNNI_ATTR int32_t QuantiseHiLo(const float* x, int n, float max_abs, int8_t* hi, int8_t* lo) {
  const __m512i limit = _mm512_set1_epi32(127);
  const __m512 sq = _mm512_set1_ps(max_abs / 127.0f);
  const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
  __m512i sum = _mm512_setzero_si512();
  for (int e = 0; e < n; e += 16) {
    const __m512 v = _mm512_loadu_ps(x + e);
    // Round to nearest (the default rounding mode), clamped to the int8 range.
    const __m512i h =
        _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), limit),
                         _mm512_sub_epi32(_mm512_setzero_si512(), limit));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + e), _mm512_cvtepi32_epi8(h));
    if (lo == nullptr) continue;
    const __m512 rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(h), sq, v);
    const __m512i l = _mm512_max_epi32(
        _mm512_min_epi32(
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(rest, inv), _mm512_set1_ps(256.0f))),
            limit),
        _mm512_sub_epi32(_mm512_setzero_si512(), limit));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + e), _mm512_cvtepi32_epi8(l));
    sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
  }
  return _mm512_reduce_add_epi32(sum);
}

// Quantises the `group` query heads q: [group, head_dim] (scaled, rotated) for `plan` (not KIVI
// keys: VnniPrepareKiviUnit).
KVS_VNNI_ATTR void VnniPrepareQueries(const VnniPlan& plan, const float* q, int group,
                                      VnniQuery* out) {
  const int head_dim = static_cast<int>(plan.head_dim);
  const int block = plan.block_elems;
  const __m512i query_index = _mm512_load_si512(plan.query_index);
  const bool precise = plan.bits == 8;  // hi and lo (see the file comment)
  for (int j = 0; j < group; ++j) {
    const float* qj = q + static_cast<size_t>(j) * head_dim;
    VnniQuery& vq = out[j];
    alignas(64) int8_t hi[kVnniMaxHeadDim], lo[kVnniMaxHeadDim];
    for (int b0 = 0; b0 < head_dim; b0 += block) {
      const float m = MaxAbs(qj + b0, block);
      const int32_t sum = QuantiseHiLo(qj + b0, block, m, hi + b0, precise ? lo + b0 : nullptr);
      vq.block_scale[b0 / block] = m / 127.0f / 256.0f;
      vq.correction[b0 / block] = 128 * sum;  // (only int8 keys read it)
    }
    // Into [column][part][byte] order, 64 elements at a time.
    for (int e = 0; e < head_dim; e += 64) {
      _mm512_storeu_si512(reinterpret_cast<std::byte*>(vq.hi) + e,
                          _mm512_permutexvar_epi8(query_index, _mm512_load_si512(hi + e)));
      if (!precise) continue;
      _mm512_storeu_si512(reinterpret_cast<std::byte*>(vq.lo) + e,
                          _mm512_permutexvar_epi8(query_index, _mm512_load_si512(lo + e)));
    }
    for (int g = 0; g < plan.num_groups; ++g) {
      __m512 sum = _mm512_setzero_ps();
      for (int e = g * plan.group_elems; e < (g + 1) * plan.group_elems; e += 16) {
        sum = _mm512_add_ps(sum, _mm512_loadu_ps(qj + e));
      }
      vq.group_sum[g] = _mm512_reduce_add_ps(sum);
    }
  }
}

// The first two rounds of a dword transpose, within each 128-bit lane: u[i + k] (i a multiple
// of 4, k < 4) holds in 128-bit lane L dword 4 L + k of rows r[i .. i + 3].
template <int kRows>
KVS_VNNI_ATTR HWY_INLINE void TransposeWithinLanes(const __m512i* r, __m512i* u) {
  __m512i t[kRows];
  for (int i = 0; i < kRows; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < kRows; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
}

// In-register transpose of a 16x16 matrix of dwords: r[i] holds row i on entry, column i on
// exit.
KVS_VNNI_ATTR HWY_INLINE void Transpose16(__m512i r[16]) {
  __m512i u[16];
  TransposeWithinLanes<16>(r, u);
  for (int k = 0; k < 4; ++k) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// LoadColumns for num_dwords <= 4 (headers, short code rows): 4 rows per vector by 128-bit
// inserts, then two rounds of two-source permutes instead of a whole 16x16 transpose.
KVS_VNNI_ATTR HWY_INLINE void LoadFourColumns(const std::byte* const* base, size_t offset,
                                              int num_dwords, __m512i* cols) {
  const __mmask8 mask = static_cast<__mmask8>((1u << num_dwords) - 1);
  __m512i a[4];  // rows 4 i .. 4 i + 3, one per 128-bit lane
  for (int i = 0; i < 4; ++i) {
    const auto row = [&](int k) { return _mm_maskz_loadu_epi32(mask, base[4 * i + k] + offset); };
    __m512i v = _mm512_castsi128_si512(row(0));
    v = _mm512_inserti32x4(v, row(1), 1);
    v = _mm512_inserti32x4(v, row(2), 2);
    a[i] = _mm512_inserti32x4(v, row(3), 3);
  }
  // Round 1: b[2 h + d / 2] = dwords d, d + 1 (d even) of rows 8 h .. 8 h + 7, 8 each.
  // Round 2: column d = dword d of rows 0..7 then of rows 8..15.
  alignas(64) static constexpr auto kIndex = [] {
    std::array<std::array<int32_t, 16>, 4> index{};
    for (int p = 0; p < 16; ++p) {
      const int row = p % 8, d = p / 8;  // round 1, dword pair (0, 1)
      index[0][p] = (row / 4) * 16 + 4 * (row % 4) + d;
      index[1][p] = index[0][p] + 2;         // dword pair (2, 3)
      index[2][p] = p < 8 ? p : 16 + p - 8;  // round 2, the first dword of each pair
      index[3][p] = p < 8 ? 8 + p : 16 + p;  // the second
    }
    return index;
  }();
  const auto idx = [&](int i) {
    return _mm512_load_si512(reinterpret_cast<const __m512i*>(kIndex[i].data()));
  };
  const __m512i b01 = _mm512_permutex2var_epi32(a[0], idx(0), a[1]);  // rows 0-7: d0, d1
  const __m512i b23 = _mm512_permutex2var_epi32(a[0], idx(1), a[1]);  // rows 0-7: d2, d3
  const __m512i c01 = _mm512_permutex2var_epi32(a[2], idx(0), a[3]);  // rows 8-15: d0, d1
  const __m512i c23 = _mm512_permutex2var_epi32(a[2], idx(1), a[3]);  // rows 8-15: d2, d3
  cols[0] = _mm512_permutex2var_epi32(b01, idx(2), c01);
  cols[1] = _mm512_permutex2var_epi32(b01, idx(3), c01);
  cols[2] = _mm512_permutex2var_epi32(b23, idx(2), c23);
  cols[3] = _mm512_permutex2var_epi32(b23, idx(3), c23);
}

// LoadColumns for 4 < num_dwords <= 8: two rows per vector (256 bits each), then an 8x8 dword
// transpose of both halves at once, 24 shuffles where Transpose16 takes 64. Vector m holds row
// kFirst[m] in its low half and kFirst[m] + 4 in its high half, the order in which the last
// round's 128-bit selects leave the rows as lanes 0..15.
KVS_VNNI_ATTR HWY_INLINE void LoadEightColumns(const std::byte* const* base, size_t offset,
                                               int num_dwords, __m512i* cols) {
  static constexpr int kFirst[8] = {0, 1, 2, 3, 8, 9, 10, 11};
  const __mmask8 mask = static_cast<__mmask8>((1u << num_dwords) - 1);
  __m512i r[8];
  for (int m = 0; m < 8; ++m) {
    const __m256i low = _mm256_maskz_loadu_epi32(mask, base[kFirst[m]] + offset);
    const __m256i high = _mm256_maskz_loadu_epi32(mask, base[kFirst[m] + 4] + offset);
    r[m] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  // u[i + k], 128-bit lanes 0..3: column k and 4 + k of rows kFirst[i..i + 3], then of those
  // rows + 4.
  __m512i u[8];
  TransposeWithinLanes<8>(r, u);
  for (int k = 0; k < 4; ++k) {
    cols[k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    cols[4 + k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
  }
}

// Columns [0, num_dwords) of the 16 rows base[k] + offset, dword c of every row in cols[c]
// (16 lanes = 16 rows). Reads only those bytes of each row; cols has room for num_dwords
// rounded up to 4, 8 or a multiple of 16, and the columns past num_dwords up to there are zero.
KVS_VNNI_ATTR HWY_INLINE void LoadColumns(const std::byte* const* base, size_t offset,
                                          int num_dwords, __m512i* cols) {
  if (num_dwords <= 4) return LoadFourColumns(base, offset, num_dwords, cols);
  if (num_dwords <= 8) return LoadEightColumns(base, offset, num_dwords, cols);
  for (int c0 = 0; c0 < num_dwords; c0 += 16) {
    const int n = std::min(16, num_dwords - c0);
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    __m512i* r = cols + c0;
    for (int k = 0; k < 16; ++k) {
      r[k] = _mm512_maskz_loadu_epi32(mask, base[k] + offset + 4 * static_cast<size_t>(c0));
    }
    Transpose16(r);
  }
}

// Code columns (dwords of a row) per block of kBlockElems elements at kBits bits.
template <int kBits, int kBlockElems>
constexpr int kVnniColsPerBlock = kBlockElems* kBits / 32;

// Scores of 16 keys against kNumQ query heads over the element blocks [b_begin, b_end), whose
// columns start at cols[0]: written to s[j * s_stride], or added there if `accumulate`. A group's
// minimum term goes in with its last block.
// kPrecise: with the query's low bytes (int8 keys); otherwise hi alone (see the file comment).
// kBlocksPerGroup: blocks per key group where the caller knows it at compile time, else 0.
// kScalesInQuery: KIVI units, whose keys' scales are folded into the query and minima into a bias
// (VnniPrepareKiviUnit): each block's step is its block_scale alone, no scale or minimum terms
// (scale and min are not read).
template <int kBits, int kNumQ, bool kPrecise, int kBlockElems, int kBlocksPerGroup = 0,
          bool kScalesInQuery = false>
KVS_VNNI_ATTR HWY_INLINE void ScoreColumns(const VnniPlan& plan, const __m512i* cols, int b_begin,
                                           int b_end, const __m512* scale, const __m512* min,
                                           const VnniQuery* q, bool accumulate, float* s,
                                           size_t s_stride) {
  constexpr int kParts = 8 / kBits;
  constexpr int kColsPerBlock = kVnniColsPerBlock<kBits, kBlockElems>;
  const int blocks_per_group =
      kBlocksPerGroup > 0 ? kBlocksPerGroup : plan.group_elems / kBlockElems;
  const int col0 = b_begin * kColsPerBlock;
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1));
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 total[kNumQ];
  for (int j = 0; j < kNumQ; ++j) {
    total[j] = accumulate ? _mm512_loadu_ps(s + j * s_stride) : _mm512_setzero_ps();
  }
  // hi alone: its step is 256 block_scale (exact), which saves the shift; the 256 goes into the
  // groups' scales once here, not into every block's broadcast step.
  __m512 step_scale[16];
  const int g_begin = b_begin / blocks_per_group, g_end = (b_end - 1) / blocks_per_group + 1;
  if constexpr (!kScalesInQuery) {
    for (int g = g_begin; g < g_end; ++g) {
      step_scale[g] = kPrecise ? scale[g] : _mm512_mul_ps(scale[g], _mm512_set1_ps(256.0f));
    }
  }
  for (int b = b_begin; b < b_end; ++b) {
    const int g = b / blocks_per_group;
    __m512i hi[kNumQ], lo[kNumQ];
    for (int j = 0; j < kNumQ; ++j) hi[j] = lo[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = b * kColsPerBlock; c < (b + 1) * kColsPerBlock; ++c) {
#pragma GCC unroll 4
      for (int r = 0; r < kParts; ++r) {
        const __m512i col = cols[c - col0];
        __m512i u;
        if constexpr (kBits == 8) {
          u = _mm512_xor_si512(col, sign);  // s8 codes + 128: unsigned
        } else {
          u = _mm512_and_si512(r == 0 ? col : _mm512_srli_epi32(col, r * kBits), mask);
        }
        for (int j = 0; j < kNumQ; ++j) {
          hi[j] = _mm512_dpbusd_epi32(hi[j], u, _mm512_set1_epi32(q[j].hi[c * kParts + r]));
          if constexpr (kPrecise) {
            lo[j] = _mm512_dpbusd_epi32(lo[j], u, _mm512_set1_epi32(q[j].lo[c * kParts + r]));
          }
        }
      }
    }
    for (int j = 0; j < kNumQ; ++j) {
      __m512i acc = kPrecise ? _mm512_add_epi32(_mm512_slli_epi32(hi[j], 8), lo[j]) : hi[j];
      if constexpr (kBits == 8) {
        acc = _mm512_sub_epi32(acc, _mm512_set1_epi32(q[j].correction[b]));
      }
      const __m512 step = kScalesInQuery
                              ? _mm512_set1_ps(q[j].block_scale[b])
                              : _mm512_mul_ps(step_scale[g], _mm512_set1_ps(q[j].block_scale[b]));
      total[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), step, total[j]);
    }
    if constexpr (kBits != 8 && !kScalesInQuery) {
      if ((b + 1) % blocks_per_group == 0) {
        for (int j = 0; j < kNumQ; ++j) {
          total[j] = _mm512_fmadd_ps(min[g], _mm512_set1_ps(q[j].group_sum[g]), total[j]);
        }
      }
    }
  }
  for (int j = 0; j < kNumQ; ++j) _mm512_storeu_ps(s + j * s_stride, total[j]);
}

// The (scale, min) of every group of a -t16 tile's 16 tokens as vectors over the tokens.
template <int kGroups = 0>
KVS_VNNI_ATTR HWY_INLINE void LoadTileScales(const VnniPlan& plan, const std::byte* tile,
                                             __m512* scale, __m512* min) {
  const int num_groups = kGroups > 0 ? kGroups : plan.num_groups;
  for (int g = 0; g < num_groups; ++g) {
    const __m512i pairs = _mm512_loadu_si512(tile + 64 * g);
    scale[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs));
    min[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
  }
}

// The per-key (scale, min) of every group of 16 keys as vectors over the keys. kGroups:
// plan.num_groups where the caller knows it at compile time, else 0.
template <int kGroups = 0>
KVS_VNNI_ATTR HWY_INLINE void LoadGroupScales(const VnniPlan& plan, const RowSet& keys, size_t key0,
                                              __m512* scale, __m512* min) {
  if (plan.tiled) return LoadTileScales<kGroups>(plan, TileOf(plan, keys, key0, false), scale, min);
  if (kGroups <= 1 && plan.bits == 8) {  // the row's f16 scale (one group); no minimum
    scale[0] = LoadRowScales(DF(), keys.rows + key0).raw;
    min[0] = _mm512_setzero_ps();
    return;
  }
  const int num_groups = kGroups > 0 ? kGroups : plan.num_groups;
  const int header_dwords = plan.absmax ? (num_groups + 1) / 2 : num_groups;
  __m512i cols[16];
  LoadColumns(keys.hdrs + key0, 0, header_dwords, cols);
  for (int c = 0; c < header_dwords; ++c) {
    const __m512 low = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(cols[c]));
    const __m512 high = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(cols[c], 16)));
    if (plan.absmax) {  // d of groups 2c and 2c + 1
      scale[2 * c] = low;
      min[2 * c] = _mm512_mul_ps(low, _mm512_set1_ps(-8.0f));
      if (2 * c + 1 < num_groups) {
        scale[2 * c + 1] = high;
        min[2 * c + 1] = _mm512_mul_ps(high, _mm512_set1_ps(-8.0f));
      }
    } else {  // (scale, min) of group c
      scale[c] = low;
      min[c] = high;
    }
  }
}

// kHeadDim, kGroups: plan.head_dim and plan.num_groups where the caller knows them at compile
// time (the common shapes: loops and divisions by constants, scales in registers), else 0.
// kTiled: plan.tiled (-t16 tiles: scales and code columns are plain loads, no transposes).
template <int kBits, int kBlockElems, int kHeadDim = 0, int kGroups = 0, bool kTiled = false>
KVS_VNNI_ATTR void VnniScoreTileBits(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                                     size_t num_keys, const VnniQuery* q, int group, float* s,
                                     size_t s_stride) {
  const int code_dwords = (kHeadDim > 0 ? kHeadDim : static_cast<int>(plan.head_dim)) * kBits / 32;
  constexpr int kColsPerBlock = kVnniColsPerBlock<kBits, kBlockElems>;
  constexpr int kBlocksPerGroup =
      kHeadDim > 0 && kGroups > 0 ? kHeadDim / kGroups / kBlockElems : 0;
  for (size_t key0 = 0; key0 < num_keys; key0 += 16) {
    PrefetchAhead16(keys, key0, num_keys);
    PrefetchAhead16(values, key0, num_keys);
    __m512 scale[16], min[16];
    const std::byte* tile = nullptr;
    if constexpr (kTiled) {
      tile = TileOf(plan, keys, key0, true);
      LoadTileScales<kGroups>(plan, tile, scale, min);
    } else {
      LoadGroupScales<kGroups>(plan, keys, key0, scale, min);
    }
    // At most 16 columns at a time (one 16x16 transpose), so that they, the accumulators and
    // the query broadcasts fit in the 32 vector registers (int8 at head_dim 128 has 32).
    for (int c0 = 0; c0 < code_dwords; c0 += 16) {
      const int n = std::min(16, code_dwords - c0);
      __m512i cols[16];
      if constexpr (kTiled) {
        for (int c = 0; c < n; ++c)
          cols[c] = _mm512_loadu_si512(tile + plan.tile.KeyWord(c0 + c, 0));
      } else {
        LoadColumns(keys.rows + key0, plan.code_offset + 4 * static_cast<size_t>(c0), n, cols);
      }
      const int b_begin = c0 / kColsPerBlock, b_end = (c0 + n) / kColsPerBlock;
      const bool accumulate = c0 > 0;
      // (No lambda: it would not carry this function's target attribute.)
      int j = 0;
      for (; j + 4 <= group; j += 4) {
        ScoreColumns<kBits, 4, kBits == 8, kBlockElems, kBlocksPerGroup>(
            plan, cols, b_begin, b_end, scale, min, q + j, accumulate, s + j * s_stride + key0,
            s_stride);
      }
      for (; j + 2 <= group; j += 2) {
        ScoreColumns<kBits, 2, kBits == 8, kBlockElems, kBlocksPerGroup>(
            plan, cols, b_begin, b_end, scale, min, q + j, accumulate, s + j * s_stride + key0,
            s_stride);
      }
      for (; j < group; ++j) {
        ScoreColumns<kBits, 1, kBits == 8, kBlockElems, kBlocksPerGroup>(
            plan, cols, b_begin, b_end, scale, min, q + j, accumulate, s + j * s_stride + key0,
            s_stride);
      }
    }
  }
}

// The largest lane of each of v[0..3], as lanes 0..3, by a tree of shuffles (14 instructions for
// all four, against about 7 each, one after the other, with a reduction per vector).
KVS_VNNI_ATTR HWY_INLINE __m128 MaxOfLanes4(const __m512* v) {
  // 128-bit lanes of x: v[0]'s lanes 0|2 and 1|3 folded, then v[1]'s; of y the same for v[2], v[3].
  const __m512 x =
      _mm512_max_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
  const __m512 y =
      _mm512_max_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
  // 128-bit lane i of z: 4 partial maxima of v[i].
  __m512 z = _mm512_max_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
  z = _mm512_max_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2)));
  z = _mm512_max_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), z));
}

// KIVI: the `group` query heads q: [group, head_dim] (scaled, rotated) into `out` (see
// KiviQueries; 0 for a block of zeros). Once per task.
KVS_VNNI_ATTR void KiviPrepareQueries(const VnniPlan& plan, const float* q, int group,
                                      KiviQueries* out) {
  const size_t head_dim = plan.head_dim, num_blocks = head_dim / 32;
  out->q = q;
  out->qhat.resize(group * head_dim);
  out->qmax.resize(group * num_blocks + 3);  // (+ 3: VnniPrepareKiviUnit reads groups of 4)
  for (size_t e = 0; e < group * head_dim; e += 32) {
    const float m = MaxAbs(q + e, 32);
    out->qmax[e / 32] = m;
    const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    _mm512_storeu_ps(&out->qhat[e], _mm512_mul_ps(_mm512_loadu_ps(q + e), inv));
    _mm512_storeu_ps(&out->qhat[e + 16], _mm512_mul_ps(_mm512_loadu_ps(q + e + 16), inv));
  }
}

// KIVI: the `group` query heads q: [group, head_dim] folded with one unit's per-channel (scale,
// min) pairs and quantised to int8 per block of 32 channels: out[j] for q_j * scale, bias[j] =
// q_j . min. The step of block b is max|q_j| over b times max|scale| over b, over 127: a bound on
// |q_j * scale| there, so that the products' own maxima need not be found per unit (each element
// is off by at most half a step, 1/254 of that bound). With qhat and qmax from
// KiviPrepareQueries the codes are qhat * (scale / max|scale|), each at most 127 in magnitude; once
// per unit and kv head, all heads at once: the pairs are converted and the ratios taken once, then
// one multiply per 16 elements and head, and 64 codes packed into one vector with two vpackssdw and
// a vpacksswb, whose order the permute into column order undoes (packed_query_index).
// kHeadDim: plan.head_dim where the caller knows it at compile time (the unit's pairs stay in
// registers), else 0.
template <int kHeadDim = 0>
KVS_VNNI_ATTR void VnniPrepareKiviUnit(const VnniPlan& plan, const std::byte* unit,
                                       const KiviQueries& queries, int group, VnniQuery* out,
                                       float* bias) {
  const float *q = queries.q, *qhat = queries.qhat.data(), *qmax = queries.qmax.data();
  const int head_dim = kHeadDim > 0 ? kHeadDim : static_cast<int>(plan.head_dim);
  const int num_vectors = head_dim / 16, blocks_per_head = head_dim / 32;
  __m512 scale[kVnniMaxHeadDim / 16], min[kVnniMaxHeadDim / 16];
  for (int v = 0; v < num_vectors; ++v) {
    const __m512i pairs = _mm512_loadu_si512(unit + 64 * v);
    scale[v] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs));
    min[v] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
  }
  // Per block: the largest |scale| (4 blocks per MaxOfLanes4, padded with zeros) and its
  // reciprocal (0 for 0), in vectors, so that nothing is stored by lanes and read back whole.
  alignas(16) float scale_max[kVnniMaxHeadDim / 32], scale_inv[kVnniMaxHeadDim / 32];
  for (int b0 = 0; b0 < blocks_per_head; b0 += 4) {
    __m512 block_abs[4];
    for (int i = 0; i < 4; ++i) {
      const int v = 2 * (b0 + i);
      block_abs[i] = v < num_vectors
                         ? _mm512_max_ps(_mm512_abs_ps(scale[v]), _mm512_abs_ps(scale[v + 1]))
                         : _mm512_setzero_ps();
    }
    const __m128 m = MaxOfLanes4(block_abs);
    const __mmask8 positive = _mm_cmp_ps_mask(m, _mm_setzero_ps(), _CMP_GT_OQ);
    _mm_store_ps(scale_max + b0, m);
    _mm_store_ps(scale_inv + b0, _mm_maskz_div_ps(positive, _mm_set1_ps(1.0f), m));
  }
  for (int v = 0; v < num_vectors; ++v) {
    scale[v] = _mm512_mul_ps(scale[v], _mm512_set1_ps(scale_inv[v / 2]));  // now the ratio
  }
  // The biases q_j . min, four heads' sums at a time.
  int j = 0;
  for (; j < group; j += 4) {
    __m512 sum[4];
    for (int i = 0; i < 4; ++i) {
      sum[i] = _mm512_setzero_ps();
      if (j + i >= group) continue;
      const float* qj = q + static_cast<size_t>(j + i) * head_dim;
      for (int v = 0; v < num_vectors; ++v) {
        sum[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * v), min[v], sum[i]);
      }
    }
    alignas(16) float sums[4];
    SumOfLanes4(DF(), hn::Vec<DF>{sum[0]}, hn::Vec<DF>{sum[1]}, hn::Vec<DF>{sum[2]},
                hn::Vec<DF>{sum[3]}, sums);
    for (int i = 0; i < 4 && j + i < group; ++i) bias[j + i] = sums[i];
  }
  const __m512i packed_index = _mm512_load_si512(plan.packed_query_index);
  const __m128 step_unit = _mm_set1_ps(1.0f / 127.0f);  // (sq itself: kScalesInQuery)
  for (j = 0; j < group; ++j) {
    const size_t row = static_cast<size_t>(j) * head_dim;
    const float* qhat_j = qhat + row;
    VnniQuery& vq = out[j];
    // (Whole groups of 4 blocks: qmax is padded by KiviPrepareQueries, block_scale is
    // longer than any head's blocks, and what lies beyond blocks_per_head is never read.)
    for (int b0 = 0; b0 < blocks_per_head; b0 += 4) {
      _mm_storeu_ps(vq.block_scale + b0, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(qmax + row / 32 + b0),
                                                               _mm_load_ps(scale_max + b0)),
                                                    step_unit));
    }
    for (int v0 = 0; v0 < num_vectors; v0 += 4) {  // 64 elements (the last 32 may be missing)
      __m512i h[4];
      for (int i = 0; i < 4; ++i) {
        const int v = v0 + i;
        h[i] = v < num_vectors
                   ? _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(qhat_j + 16 * v), scale[v]))
                   : _mm512_setzero_si512();
      }
      // Saturating to int16 and then to int8 is saturating to int8, as vpmovsdb would.
      const __m512i bytes =
          _mm512_packs_epi16(_mm512_packs_epi32(h[0], h[1]), _mm512_packs_epi32(h[2], h[3]));
      _mm512_storeu_si512(reinterpret_cast<std::byte*>(vq.hi) + 16 * v0,
                          _mm512_permutexvar_epi8(packed_index, bytes));
    }
    vq.group_sum[0] = 0.0f;  // (the unit's bias holds q . min)
  }
}

// KIVI keys: a unit's key is codes * scale_c + min_c per channel c, so q . k = (q * scale) .
// codes + q . min. Per unit and query head the query q' = q * scale is quantised as above (and
// q . min kept as a bias), from the queries scaled once per task (KiviPrepareQueries); runs of
// a block's 16 keys that share a unit are scored with it. kHeadDim: plan.head_dim where the
// caller knows it at compile time, else 0.
template <int kBits, int kHeadDim = 0>
KVS_VNNI_ATTR void VnniScoreTileKivi(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                                     size_t num_keys, const KiviQueries& queries, int group,
                                     float* s, size_t s_stride) {
  const int head_dim = kHeadDim > 0 ? kHeadDim : static_cast<int>(plan.head_dim);
  const int code_dwords = head_dim * kBits / 32;
  const int num_blocks = head_dim / 32;
  // A KIVI plan's one group is the whole head: all its blocks share the unit's query scales.
  constexpr int kBlocksPerGroup = kHeadDim / 32;
  thread_local std::vector<VnniQuery> unit_queries;
  thread_local std::vector<float> bias;  // [group] q . min of the unit
  unit_queries.resize(group);
  bias.resize(group);
  const std::byte* prepared_unit = nullptr;
  alignas(64) float block_scores[4 * 16];
  for (size_t key0 = 0; key0 < num_keys; key0 += 16) {
    PrefetchAhead16(keys, key0, num_keys);
    PrefetchAhead16(values, key0, num_keys);
    __m512i cols[kVnniMaxHeadDim / 4];
    LoadColumns(keys.rows + key0, 0, code_dwords, cols);
    for (size_t k = key0; k < key0 + 16;) {
      const std::byte* unit = keys.hdrs[k];
      size_t run_end = k + 1;
      while (run_end < key0 + 16 && keys.hdrs[run_end] == unit) ++run_end;
      if (unit != prepared_unit) {
        VnniPrepareKiviUnit<kHeadDim>(plan, unit, queries, group, unit_queries.data(), bias.data());
        prepared_unit = unit;
      }
      const __mmask16 run = static_cast<__mmask16>(((1u << (run_end - k)) - 1) << (k - key0));
      for (int j = 0; j < group;) {
        const int step = std::min(4, group - j);
        if (step == 4) {
          ScoreColumns<kBits, 4, false, 32, kBlocksPerGroup, true>(
              plan, cols, 0, num_blocks, nullptr, nullptr, &unit_queries[j], false, block_scores,
              16);
        } else if (step >= 2) {
          ScoreColumns<kBits, 2, false, 32, kBlocksPerGroup, true>(
              plan, cols, 0, num_blocks, nullptr, nullptr, &unit_queries[j], false, block_scores,
              16);
        } else {
          ScoreColumns<kBits, 1, false, 32, kBlocksPerGroup, true>(
              plan, cols, 0, num_blocks, nullptr, nullptr, &unit_queries[j], false, block_scores,
              16);
        }
        const int done = step == 3 ? 2 : step;
        for (int jj = 0; jj < done; ++jj) {
          const __m512 v =
              _mm512_add_ps(_mm512_load_ps(block_scores + 16 * jj), _mm512_set1_ps(bias[j + jj]));
          _mm512_mask_storeu_ps(s + (j + jj) * s_stride + key0, run, v);
        }
        j += done;
      }
      k = run_end;
    }
  }
}

// Scores of a tile's keys (rows padded to a multiple of 16) for the `group` query heads:
// s: [group, s_stride], as ScoreTile. q: the prepared queries (VnniPrepareQueries), or for
// KIVI keys kivi (KiviPrepareQueries).
void VnniScoreTile(const VnniPlan& plan, const RowSet& keys, const RowSet& values, size_t num_keys,
                   const VnniQuery* q, const KiviQueries& kivi, int group, float* s,
                   size_t s_stride) {
  if (plan.kivi) {
    const bool head_dim128 = plan.head_dim == 128;  // (the common shape at compile time)
    if (plan.bits == 4) {
      return head_dim128
                 ? VnniScoreTileKivi<4, 128>(plan, keys, values, num_keys, kivi, group, s, s_stride)
                 : VnniScoreTileKivi<4>(plan, keys, values, num_keys, kivi, group, s, s_stride);
    }
    return head_dim128
               ? VnniScoreTileKivi<2, 128>(plan, keys, values, num_keys, kivi, group, s, s_stride)
               : VnniScoreTileKivi<2>(plan, keys, values, num_keys, kivi, group, s, s_stride);
  }
  const bool block32 = plan.block_elems == 32;
  switch (plan.bits) {
    case 8:  // (int8 rows are one group of head_dim, a multiple of 32)
      if (plan.block_elems == 32) {
        return VnniScoreTileBits<8, 32>(plan, keys, values, num_keys, q, group, s, s_stride);
      }
      return plan.head_dim == 128
                 ? VnniScoreTileBits<8, 64, 128, 1>(plan, keys, values, num_keys, q, group, s,
                                                    s_stride)
                 : VnniScoreTileBits<8, 64>(plan, keys, values, num_keys, q, group, s, s_stride);
    case 4:
      if (plan.tiled) {  // (int4-t16 and int4-g128-t16 at head_dim 128 at compile time)
        if (block32 && plan.head_dim == 128 && plan.num_groups == 4) {
          return VnniScoreTileBits<4, 32, 128, 4, true>(plan, keys, values, num_keys, q, group, s,
                                                        s_stride);
        }
        if (block32 && plan.head_dim == 128 && plan.num_groups == 1) {
          return VnniScoreTileBits<4, 32, 128, 1, true>(plan, keys, values, num_keys, q, group, s,
                                                        s_stride);
        }
        return block32 ? VnniScoreTileBits<4, 32, 0, 0, true>(plan, keys, values, num_keys, q,
                                                              group, s, s_stride)
                       : VnniScoreTileBits<4, 16, 0, 0, true>(plan, keys, values, num_keys, q,
                                                              group, s, s_stride);
      }
      // head_dim 128 in groups of 32 (int4) or one group (int4-g128) at compile time.
      if (block32 && plan.head_dim == 128 && plan.num_groups == 4) {
        return VnniScoreTileBits<4, 32, 128, 4>(plan, keys, values, num_keys, q, group, s,
                                                s_stride);
      }
      if (block32 && plan.head_dim == 128 && plan.num_groups == 1) {
        return VnniScoreTileBits<4, 32, 128, 1>(plan, keys, values, num_keys, q, group, s,
                                                s_stride);
      }
      return block32
                 ? VnniScoreTileBits<4, 32>(plan, keys, values, num_keys, q, group, s, s_stride)
                 : VnniScoreTileBits<4, 16>(plan, keys, values, num_keys, q, group, s, s_stride);
    default:
      if (plan.tiled) {
        return block32 ? VnniScoreTileBits<2, 32, 0, 0, true>(plan, keys, values, num_keys, q,
                                                              group, s, s_stride)
                       : VnniScoreTileBits<2, 16, 0, 0, true>(plan, keys, values, num_keys, q,
                                                              group, s, s_stride);
      }
      if (block32 && plan.head_dim == 128 && plan.num_groups == 4) {  // int2 in groups of 32
        return VnniScoreTileBits<2, 32, 128, 4>(plan, keys, values, num_keys, q, group, s,
                                                s_stride);
      }
      return block32
                 ? VnniScoreTileBits<2, 32>(plan, keys, values, num_keys, q, group, s, s_stride)
                 : VnniScoreTileBits<2, 16>(plan, keys, values, num_keys, q, group, s, s_stride);
  }
}

// ---------------------------------------------------------------------------------------------
// Values: acc_j[e] += sum over keys t of p_j[t] * v_t[e], with v_t[e] = code * scale_g + min_g
// (int8: code * row scale). Per tile, per query head j and key group g, the weights
// w = p_j[t] * scale_g[t] are quantised to int16 against their largest value in the tile,
// W = max w / 32767, and vpdpwssd adds (w_t0 * code_t0[e] + w_t1 * code_t1[e]) for two keys
// into each i32 lane e; the minima contribute sum_t p_j[t] * min_g[t] per group, in floats.
// Each weight is off by at most W / 2 (1.5e-5 of the tile's largest weight); at most 256 keys
// of |code| <= 127 keep the i32 sums below 2^31 (2 * 32767 * 127 * 128 < 2^31).
// 4- and 2-bit affine values (VnniPlan::value_quads) take u8 weights instead where a tile's
// softmax weights spread (TakesQuadWeights), W = max w / 254, four keys per vpdpbusd: half the
// dot products. They are rounded with their errors carried along the keys, so that a tile keeps
// its mass (QuantiseQuadSlice), each off by up to 1.5 steps; what that moves a sum by grows
// with the codes it multiplies, so the sums are taken as if the codes were centred on their
// group's middle m = (2^bits - 1) / 2: sum w (c - m) = sum w c - m sum w, with the integer
// weights' own sum, and the minima become min + m scale (CentreQuadWeights). In the tests the
// outputs' RMS distance to attention over unquantised values then grows by at most 1.3 % over
// the codec's own; see docs/representation-speed.md.

// The 16 value elements of one block of the key pair whose code bytes are x0 and x1 (the
// 64-byte halves of the two rows that hold the block), as int16 pairs (code of the first row,
// code of the second) per dword; `index` is the block's PlanVnni index.
template <int kBits>
KVS_VNNI_ATTR HWY_INLINE __m512i PairCodes(__m512i x0, __m512i x1, __m512i index, __m512i shift) {
  if constexpr (kBits == 8) {  // bytes 1 and 3 of each dword, then sign-extended words
    return _mm512_srai_epi16(_mm512_maskz_permutex2var_epi8(0xAAAAAAAAAAAAAAAAull, x0, index, x1),
                             8);
  } else {  // bytes 0 and 2, shifted to the element's bits and masked
    const __m512i x = _mm512_maskz_permutex2var_epi8(0x5555555555555555ull, x0, index, x1);
    return _mm512_and_si512(_mm512_srlv_epi32(x, shift), _mm512_set1_epi16((1 << kBits) - 1));
  }
}

// The i32 sums of one tile for kNumQ heads over the kBlocks element blocks [m0, m0 + kBlocks)
// (16 kBlocks elements, within one 64-byte half of a row's codes): out[j * kBlocks + b] for
// block m0 + b.
//   weights[j * kBlocks + b]: head j's packed int16 pairs for block m0 + b's group, one per
//   key pair
// Everything the loop touches is a local with constant indices once unrolled, so that the 16
// accumulators stay in registers.
// kPairedBlocks: blocks m0 + 2 i and m0 + 2 i + 1 share a group (groups of 32 elements or
// more), so one broadcast weight serves both.
template <int kBits, int kNumQ, int kBlocks, bool kPairedBlocks>
KVS_VNNI_ATTR HWY_INLINE void AccumulatePairs(const VnniPlan& plan, const RowSet& values,
                                              size_t num_pairs, const int32_t* const* weights,
                                              int m0, __m512i* out) {
  constexpr int kParts = 8 / kBits;
  const int row_bytes = static_cast<int>(plan.head_dim) / kParts;
  const int half = 16 * m0 / kParts / 64;
  const size_t offset = plan.code_offset + 64 * static_cast<size_t>(half);
  const int n = std::min(64, row_bytes - 64 * half);
  const __mmask64 mask = n == 64 ? ~0ull : (1ull << n) - 1;
  alignas(64) static constexpr auto kShift = [] {
    std::array<uint32_t, 16> shift{};
    for (int i = 0; i < 16; ++i) shift[i] = static_cast<uint32_t>(kBits * (i % kParts));
    return shift;
  }();
  const __m512i shift = _mm512_load_si512(reinterpret_cast<const __m512i*>(kShift.data()));
  __m512i index[kBlocks];
  const int32_t* w[kNumQ * kBlocks];
  __m512i acc[kNumQ * kBlocks];
#pragma GCC unroll 16
  for (int b = 0; b < kBlocks; ++b) {
    index[b] = _mm512_load_si512(reinterpret_cast<const __m512i*>(plan.index[m0 + b]));
  }
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kBlocks; ++i) {
    w[i] = weights[i];
    acc[i] = _mm512_setzero_si512();
  }
  for (size_t u = 0; u < num_pairs; ++u) {
    RequestStep(values);
    const __m512i x0 = _mm512_maskz_loadu_epi8(mask, values.rows[2 * u] + offset);
    const __m512i x1 = _mm512_maskz_loadu_epi8(mask, values.rows[2 * u + 1] + offset);
    __m512i codes[kBlocks];
#pragma GCC unroll 16
    for (int b = 0; b < kBlocks; ++b) codes[b] = PairCodes<kBits>(x0, x1, index[b], shift);
    constexpr int kShare = kPairedBlocks ? 2 : 1;
#pragma GCC unroll 16
    for (int b0 = 0; b0 < kBlocks; b0 += kShare) {
#pragma GCC unroll 16
      for (int j = 0; j < kNumQ; ++j) {
        const __m512i weight = _mm512_set1_epi32(w[j * kBlocks + b0][u]);
#pragma GCC unroll 2
        for (int b = b0; b < b0 + kShare; ++b) {
          acc[j * kBlocks + b] = _mm512_dpwssd_epi32(acc[j * kBlocks + b], codes[b], weight);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kBlocks; ++i) out[i] = acc[i];
}

// kSpans 16-byte spans from `at` in the low bytes of a vector (the rest undefined).
template <int kSpans>
KVS_VNNI_ATTR HWY_INLINE __m512i LoadSpans(const std::byte* at) {
  if constexpr (kSpans == 2) {
    return _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
  } else {
    return _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
  }
}

// -t16 values (codec_name.h): span `span` (16 code bytes) of a quad's four tokens, dword i holding
// byte SpanByte(i) of the four in token order, which is what AccumulateQuadSpans' permutes make
// of four untiled rows: one plain load (and with two groups in a span, one vpermd).
template <int kGroups>
KVS_VNNI_ATTR HWY_INLINE __m512i QuadSpan(const std::byte* quad, int span) {
  const __m512i bytes = _mm512_loadu_si512(quad + 4 * 16 * span);
  if constexpr (kGroups == 1) return bytes;
  alignas(64) static constexpr auto kOrder = [] {  // dword i from dword SpanByte(i, 2)
    std::array<int32_t, 16> order{};
    for (int i = 0; i < 16; ++i) order[i] = SpanByte(i, 2);
    return order;
  }();
  return _mm512_permutexvar_epi32(_mm512_load_si512(kOrder.data()), bytes);
}

// -t16 values: the quads of keys [4 u, 4 u + 4) of `values`, quads[u] for u < num_keys16 / 4: in
// place where 16 keys are one whole unit in order (TileOf's test; decode's parts and tiles
// start on unit boundaries), else gathered into per-thread scratch in the quad layout, the keys
// that pad the tile repeating the last key as their rows do (valid until the next call).
KVS_VNNI_ATTR const std::byte* const* ValueQuadsOf(const VnniPlan& plan, const RowSet& values,
                                                   size_t num_keys16) {
  const TileGeometry& tile = plan.tile;
  const size_t row_bytes = tile.row_code_bytes, quad_bytes = kQuadTokens * row_bytes;
  thread_local const std::byte* quads[kDecodeTile / kQuadTokens];
  std::byte* gathered = nullptr;
  constexpr size_t kQuads = kTileTokens / kQuadTokens;  // per unit
  for (size_t key0 = 0; key0 < num_keys16; key0 += kTileTokens) {
    if (IsWholeTile(tile, values, key0)) {
      for (size_t a = 0; a < kQuads; ++a)
        quads[key0 / kQuadTokens + a] = values.rows[key0] + a * quad_bytes;
      continue;
    }
    if (gathered == nullptr) {
      gathered = reinterpret_cast<std::byte*>(
          Scratch(kSlotValues, (kDecodeTile * row_bytes + sizeof(float) - 1) / sizeof(float)));
    }
    std::byte* dst = gathered + key0 * row_bytes;  // 16 keys' quads, laid out as a unit's
    for (size_t k = 0; k < kTileTokens; ++k) {
      const std::byte* from = values.hdrs[key0 + k];
      const size_t t = TokenInTile(tile, values, key0 + k);
      for (size_t b = 0; b < row_bytes; ++b) {
        dst[tile.ValueByte(b, k) - tile.code_offset] = from[tile.ValueByte(b, t)];
      }
    }
    for (size_t a = 0; a < kQuads; ++a) quads[key0 / kQuadTokens + a] = dst + a * quad_bytes;
  }
  return quads;
}

// The weights of step u (a pair of keys, or with u8 weights four) of a span's row, in every
// dword: one (kGroups 1) or the span's two groups' in alternate dwords (kGroups 2).
template <int kGroups>
KVS_VNNI_ATTR HWY_INLINE __m512i SpanWeight(const int32_t* ws, size_t u) {
  if constexpr (kGroups == 1) {
    return _mm512_set1_epi32(ws[u]);
  } else {
    int64_t both;
    std::memcpy(&both, ws + 2 * u, sizeof(both));
    return _mm512_set1_epi64(both);
  }
}

// One step u of AccumulateSpans or AccumulateQuadSpans: acc[(j * kSpans + s) * kParts + r] +=
// head j's weights for span s times codes[s * kParts + r], int16 pairs by vpdpwssd or (kQuads)
// u8 quads by vpdpbusd.
template <int kNumQ, int kSpans, int kParts, int kGroups, bool kQuads>
KVS_VNNI_ATTR HWY_INLINE void WeighSpans(const int32_t* const* w, size_t u, const __m512i* codes,
                                         __m512i* acc) {
#pragma GCC unroll 4
  for (int j = 0; j < kNumQ; ++j) {
#pragma GCC unroll 2
    for (int s = 0; s < kSpans; ++s) {
      const __m512i weight = SpanWeight<kGroups>(w[j * kSpans + s], u);
#pragma GCC unroll 4
      for (int r = 0; r < kParts; ++r) {
        __m512i& sum = acc[(j * kSpans + s) * kParts + r];
        sum = kQuads ? _mm512_dpbusd_epi32(sum, weight, codes[s * kParts + r])
                     : _mm512_dpwssd_epi32(sum, codes[s * kParts + r], weight);
      }
    }
  }
}

// WeighSpans for one key pair whose spans' bytes (int16 pairs per dword) are bytes[s]: part r <
// kParts - 1 the bytes' low (r + 1) kBits bits (mask[r]), the last the whole byte.
template <int kNumQ, int kSpans, int kParts, int kGroups>
KVS_VNNI_ATTR HWY_INLINE void WeighSpanPairs(const int32_t* const* w, size_t u,
                                             const __m512i* bytes, const __m512i* mask,
                                             __m512i* acc) {
  __m512i codes[kSpans * kParts];
#pragma GCC unroll 2
  for (int s = 0; s < kSpans; ++s) {
#pragma GCC unroll 4
    for (int r = 0; r < kParts; ++r) {
      codes[s * kParts + r] = r + 1 < kParts ? _mm512_and_si512(bytes[s], mask[r]) : bytes[s];
    }
  }
  WeighSpans<kNumQ, kSpans, kParts, kGroups, false>(w, u, codes, acc);
}

// The i32 sums of one tile for kNumQ heads over the kSpans 16-byte spans [s0, s0 + kSpans) of
// 4- or 2-bit codes (VnniPlan::value_spans): out[(j * kSpans + s) * kParts + r] for head j,
// span s0 + s and part r, lane i holding element SpanElement. Per key pair and span, one
// vpermt2b puts byte SpanByte(i) of both keys into the words of dword i, and each part is a
// mask away (the parts' sums are taken apart from cumulative ones); where the blocks of 16 elements
// (AccumulatePairs) spend a permute per 16 elements, this spends one per 32 (4-bit) or 64 (2-bit).
//   weights[j * kSpans + s]: head j's packed int16 pairs for span s0 + s, one dword per key
//   pair (kGroups 1), or two (kGroups 2: the span's two groups, alternating lanes)
//   value_quads: -t16 values' quads (ValueQuadsOf; kQuadLayout), where one vpshufb per pair and
//   span puts two of a quad's four bytes into the words of each dword instead of the vpermt2b
template <int kBits, int kNumQ, int kSpans, int kGroups, bool kQuadLayout>
KVS_VNNI_ATTR HWY_INLINE void AccumulateSpans(const VnniPlan& plan, const RowSet& values,
                                              size_t num_pairs, const int32_t* const* weights,
                                              const std::byte* const* value_quads, int s0,
                                              __m512i* out) {
  constexpr int kParts = 8 / kBits;
  const size_t offset = plan.code_offset + 16 * static_cast<size_t>(s0);
  // Part r < kParts - 1 multiplies the byte's low (r + 1) kBits bits, the last the whole byte:
  // cumulative sums, one AND per part and no shifts (taken apart at the end).
  __m512i mask[kParts - 1];
#pragma GCC unroll 4
  for (int r = 0; r + 1 < kParts; ++r) mask[r] = _mm512_set1_epi16((1 << ((r + 1) * kBits)) - 1);
  __m512i index[kSpans];
  const int32_t* w[kNumQ * kSpans];
  __m512i acc[kNumQ * kSpans * kParts];
#pragma GCC unroll 2
  for (int s = 0; s < kSpans; ++s) {
    index[s] = _mm512_load_si512(reinterpret_cast<const __m512i*>(plan.span_index[kGroups - 1][s]));
  }
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans; ++i) w[i] = weights[i];
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans * kParts; ++i) acc[i] = _mm512_setzero_si512();
  if constexpr (kQuadLayout) {
    // Pair h of a quad (its tokens 2 h and 2 h + 1): bytes 2 h and 2 h + 1 of each dword into
    // its words' low bytes (vpshufb indexes within 128-bit lanes; 0x80 clears a byte).
    const __m512i lane_dwords =
        _mm512_setr_epi32(0, 0x40004, 0x80008, 0xC000C, 0, 0x40004, 0x80008, 0xC000C, 0, 0x40004,
                          0x80008, 0xC000C, 0, 0x40004, 0x80008, 0xC000C);
    const __m512i pick[2] = {_mm512_add_epi32(_mm512_set1_epi32(0x80018000), lane_dwords),
                             _mm512_add_epi32(_mm512_set1_epi32(0x80038002), lane_dwords)};
    for (size_t q = 0; q < num_pairs / 2; ++q) {
      __m512i x[kSpans];
#pragma GCC unroll 2
      for (int s = 0; s < kSpans; ++s) x[s] = QuadSpan<kGroups>(value_quads[q], s0 + s);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        RequestStep(values);
        __m512i bytes[kSpans];
#pragma GCC unroll 2
        for (int s = 0; s < kSpans; ++s) bytes[s] = _mm512_shuffle_epi8(x[s], pick[h]);
        WeighSpanPairs<kNumQ, kSpans, kParts, kGroups>(w, 2 * q + h, bytes, mask, acc);
      }
    }
  } else {
    for (size_t u = 0; u < num_pairs; ++u) {
      RequestStep(values);
      // The spans of both keys (only their first 16 kSpans bytes are read).
      const __m512i x0 = LoadSpans<kSpans>(values.rows[2 * u] + offset);
      const __m512i x1 = LoadSpans<kSpans>(values.rows[2 * u + 1] + offset);
      __m512i bytes[kSpans];
#pragma GCC unroll 2
      for (int s = 0; s < kSpans; ++s) {
        bytes[s] = _mm512_maskz_permutex2var_epi8(0x5555555555555555ull, x0, index[s], x1);
      }
      WeighSpanPairs<kNumQ, kSpans, kParts, kGroups>(w, u, bytes, mask, acc);
    }
  }
  // Part r's own sum from the cumulative ones: (C_r - C_{r-1}) / 2^(r kBits), exact (C_r -
  // C_{r-1} is that multiple of part r's sum). No sum overflows: |weight| <= 32767, a byte <= 255,
  // at most kDecodeTile keys.
  static_assert(int64_t{32767} * 255 * kDecodeTile <= INT32_MAX);
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans; ++i) {
#pragma GCC unroll 4
    for (int r = kParts - 1; r > 0; --r) {
      acc[i * kParts + r] = _mm512_srai_epi32(
          _mm512_sub_epi32(acc[i * kParts + r], acc[i * kParts + r - 1]), r * kBits);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans * kParts; ++i) out[i] = acc[i];
}

// AccumulateSpans with u8 weights, four keys per dword (TakesQuadWeights): per four keys and
// two spans, two vpermt2b interleave the keys in pairs and two more put byte SpanByte(i) of each
// span from all four into dword i; each part is shifted and masked out and one vpdpbusd per
// head adds four keys' weight times code into each i32 lane. Half the dot products of int16
// pairs, for the same permutes per byte. Same out[] as AccumulateSpans (each part's own sum).
//   weights[j * kSpans + s]: head j's u8 weights for span s0 + s, four keys per dword (kGroups
//   1), or two dwords per four keys (kGroups 2: the span's two groups, alternating lanes)
//   value_quads: -t16 values' quads (ValueQuadsOf; kQuadLayout), each span one load: no permutes
template <int kBits, int kNumQ, int kSpans, int kGroups, bool kQuadLayout>
KVS_VNNI_ATTR HWY_INLINE void AccumulateQuadSpans(const VnniPlan& plan, const RowSet& values,
                                                  size_t num_quads, const int32_t* const* weights,
                                                  const std::byte* const* value_quads, int s0,
                                                  __m512i* out) {
  constexpr int kParts = 8 / kBits;
  const size_t offset = plan.code_offset + 16 * static_cast<size_t>(s0);
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1));
  const __m512i pair_index =
      _mm512_load_si512(reinterpret_cast<const __m512i*>(plan.quad_index->pair));
  __m512i quad_index[kSpans];
#pragma GCC unroll 2
  for (int s = 0; s < kSpans; ++s) {
    quad_index[s] =
        _mm512_load_si512(reinterpret_cast<const __m512i*>(plan.quad_index->quad[kGroups - 1][s]));
  }
  const int32_t* w[kNumQ * kSpans];
  __m512i acc[kNumQ * kSpans * kParts];
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans; ++i) w[i] = weights[i];
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans * kParts; ++i) acc[i] = _mm512_setzero_si512();
  const std::byte* const* rows = values.rows;
  for (size_t u = 0; u < num_quads; ++u) {
    RequestStep(values);
    __m512i pair01, pair23;
    if constexpr (!kQuadLayout) {
      pair01 = _mm512_permutex2var_epi8(LoadSpans<kSpans>(rows[4 * u] + offset), pair_index,
                                        LoadSpans<kSpans>(rows[4 * u + 1] + offset));
      pair23 = _mm512_permutex2var_epi8(LoadSpans<kSpans>(rows[4 * u + 2] + offset), pair_index,
                                        LoadSpans<kSpans>(rows[4 * u + 3] + offset));
    }
    __m512i codes[kSpans * kParts];
#pragma GCC unroll 2
    for (int s = 0; s < kSpans; ++s) {
      const __m512i bytes = kQuadLayout ? QuadSpan<kGroups>(value_quads[u], s0 + s)
                                        : _mm512_permutex2var_epi8(pair01, quad_index[s], pair23);
#pragma GCC unroll 4
      for (int r = 0; r < kParts; ++r) {
        codes[s * kParts + r] =
            _mm512_and_si512(r == 0 ? bytes : _mm512_srli_epi16(bytes, r * kBits), mask);
      }
    }
    WeighSpans<kNumQ, kSpans, kParts, kGroups, true>(w, u, codes, acc);
  }
  // No sum overflows: 4 keys of weight <= 255 and code <= 15 per vpdpbusd, kDecodeTile keys.
  static_assert(int64_t{255} * 15 * kDecodeTile <= INT32_MAX);
#pragma GCC unroll 16
  for (int i = 0; i < kNumQ * kSpans * kParts; ++i) out[i] = acc[i];
}

// The sums of AccumulateSpans or, for u8 weights (quads), AccumulateQuadSpans, for the plan's
// groups per span.
// value_quads: -t16 values' quads (ValueQuadsOf), or null for rows.
template <int kBits, int kNumQ, int kSpans, int kGroups, bool kQuadLayout>
KVS_VNNI_ATTR HWY_INLINE void SpanSumsOf(const VnniPlan& plan, const RowSet& values,
                                         size_t num_pairs, bool quads, const int32_t* const* w,
                                         const std::byte* const* value_quads, int s0,
                                         __m512i* out) {
  if (quads) {
    return AccumulateQuadSpans<kBits, kNumQ, kSpans, kGroups, kQuadLayout>(
        plan, values, num_pairs / 2, w, value_quads, s0, out);
  }
  AccumulateSpans<kBits, kNumQ, kSpans, kGroups, kQuadLayout>(plan, values, num_pairs, w,
                                                              value_quads, s0, out);
}
template <int kBits, int kNumQ, int kSpans>
KVS_VNNI_ATTR HWY_INLINE void SpanSums(const VnniPlan& plan, const RowSet& values, size_t num_pairs,
                                       bool quads, const int32_t* const* w,
                                       const std::byte* const* value_quads, int s0, __m512i* out) {
  if (value_quads != nullptr) {
    return plan.span_groups == 1 ? SpanSumsOf<kBits, kNumQ, kSpans, 1, true>(
                                       plan, values, num_pairs, quads, w, value_quads, s0, out)
                                 : SpanSumsOf<kBits, kNumQ, kSpans, 2, true>(
                                       plan, values, num_pairs, quads, w, value_quads, s0, out);
  }
  plan.span_groups == 1 ? SpanSumsOf<kBits, kNumQ, kSpans, 1, false>(plan, values, num_pairs, quads,
                                                                     w, nullptr, s0, out)
                        : SpanSumsOf<kBits, kNumQ, kSpans, 2, false>(plan, values, num_pairs, quads,
                                                                     w, nullptr, s0, out);
}

template <int kBits, int kBlocks, bool kPaired>
KVS_VNNI_ATTR HWY_INLINE void AccumulateHeads(const VnniPlan& plan, const RowSet& values,
                                              size_t num_pairs, const int32_t* const* weights,
                                              int m0, int num_q, __m512i* acc) {
  if (num_q == 4) {
    AccumulatePairs<kBits, 4, kBlocks, kPaired>(plan, values, num_pairs, weights, m0, acc);
  } else if (num_q == 2) {
    AccumulatePairs<kBits, 2, kBlocks, kPaired>(plan, values, num_pairs, weights, m0, acc);
  } else {
    AccumulatePairs<kBits, 1, kBlocks, kPaired>(plan, values, num_pairs, weights, m0, acc);
  }
}

// VnniAccumulateTileBits for span-read values (VnniPlan::value_spans): the sums by SpanSums
// (AccumulateSpans or AccumulateQuadSpans), two spans per pass for 4-bit codes (16 accumulators for
// 4 heads), one for 2-bit, added into the state in span order (slot s of a head holds element
// SpanElement(s); DecodeChunk puts them back in element order once per task).
//   weights: [group][num_groups][num_pairs] (pairs of groups interleaved, see QuantiseWeightSlice);
//   w_scale, min_sum: [group][num_groups]
//   value_quads: -t16 values' quads (ValueQuadsOf), or null for rows
template <int kBits>
KVS_VNNI_ATTR void AccumulateTileBySpans(const VnniPlan& plan, const RowSet& values,
                                         size_t num_pairs, bool quads, const int32_t* weights,
                                         const std::byte* const* value_quads, const float* w_scale,
                                         const float* min_sum, int group, float* state,
                                         size_t state_stride) {
  constexpr int kParts = 8 / kBits;
  const int num_groups = plan.num_groups, num_spans = plan.value_spans;
  const int span_groups = plan.span_groups;
  const int span_elems = 16 * kParts;
  // The first group of span s (its only one, or the first of its two).
  const auto group_of = [&](int s) { return s * span_elems / plan.group_elems; };
  for (int j = 0, num_q = 0; j < group; j += num_q) {
    num_q = group - j >= 4 ? 4 : group - j >= 2 ? 2 : 1;
    for (int s0 = 0, spans = 0; s0 < num_spans; s0 += spans) {
      spans = kBits == 4 && s0 + 2 <= num_spans ? 2 : 1;
      const int32_t* w[8];  // [jj * spans + s]
      for (int jj = 0; jj < num_q; ++jj) {
        for (int s = 0; s < spans; ++s) {
          w[jj * spans + s] =
              weights + (static_cast<size_t>(j + jj) * num_groups + group_of(s0 + s)) * num_pairs;
        }
      }
      __m512i acc[16];  // [(jj * spans + s) * kParts + r]
      // (No generic dispatch: it would not carry this function's target attribute.)
#define KVS_SPANS(kNumQ, kSpans) \
  SpanSums<kBits, kNumQ, kSpans>(plan, values, num_pairs, quads, w, value_quads, s0, acc)
      if (spans == 2) {
        if constexpr (kBits == 4) {
          num_q == 4 ? KVS_SPANS(4, 2) : num_q == 2 ? KVS_SPANS(2, 2) : KVS_SPANS(1, 2);
        }
      } else {
        num_q == 4 ? KVS_SPANS(4, 1) : num_q == 2 ? KVS_SPANS(2, 1) : KVS_SPANS(1, 1);
      }
#undef KVS_SPANS
      for (int jj = 0; jj < num_q; ++jj) {
        const int head = j + jj;
        for (int s = 0; s < spans; ++s) {
          // The scales and minima's sums of the span's groups: lanes alternate between two.
          const int g = group_of(s0 + s), g2 = span_groups == 2 ? g + 1 : g;
          const size_t h = static_cast<size_t>(head) * num_groups;
          const __m512 scale = _mm512_mask_blend_ps(0xAAAA, _mm512_set1_ps(w_scale[h + g]),
                                                    _mm512_set1_ps(w_scale[h + g2]));
          const __m512 min = _mm512_mask_blend_ps(0xAAAA, _mm512_set1_ps(min_sum[h + g]),
                                                  _mm512_set1_ps(min_sum[h + g2]));
          for (int r = 0; r < kParts; ++r) {
            float* st = state + head * state_stride + ((s0 + s) * kParts + r) * 16;
            const __m512 v =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[(jj * spans + s) * kParts + r]), scale, min);
            _mm512_storeu_ps(st, _mm512_add_ps(_mm512_loadu_ps(st), v));
          }
        }
      }
    }
  }
}

// The middle of a group's codes, (2^bits - 1) / 2.
constexpr float MiddleCode(int bits) { return static_cast<float>((1 << bits) - 1) / 2.0f; }

// The int16 weights of kNumQ heads [j0, j0 + kNumQ) for kSlice groups [g0, g0 + kSlice) of a
// tile, and those groups' minima sums, in one pass over the keys with every sum in registers
// (QuantiseWeights has the layout). The weight of key k is p'[k] s'[k] with p' = p · p_factor
// (32767 over the head's largest p) and s' = hs · s_factor (1 over the group's largest |scale|).
//   p_factor: [kNumQ]; s_factor: [num_groups]; hs, hm: [num_groups][num_keys16]
template <int kNumQ, int kSlice>
KVS_VNNI_ATTR HWY_INLINE void QuantiseWeightSlice(const VnniPlan& plan, size_t num_keys16,
                                                  const float* p, size_t p_stride,
                                                  const float* p_factor, const float* s_factor,
                                                  const float* hs, const float* hm, int j0, int g0,
                                                  int32_t* weights, float* min_sum) {
  const int num_groups = plan.num_groups;
  const size_t num_pairs = num_keys16 / 2;
  // Span-read pairs of groups (VnniPlan::span_groups 2) interleave their dwords: pair u of
  // groups g and g + 1 (g even) at 2 u and 2 u + 1 of both groups' rows. (Their num_groups is
  // even, so slices of 4 and 2 hold whole pairs.)
  const bool interleaved = plan.value_spans > 0 && plan.span_groups == 2;
  const __m512i interleave =
      _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512 p_scale[kNumQ], s_scale[kSlice], sums[kNumQ][kSlice];
  for (int jj = 0; jj < kNumQ; ++jj) {
    p_scale[jj] = _mm512_set1_ps(p_factor[jj]);
    for (int gg = 0; gg < kSlice; ++gg) sums[jj][gg] = _mm512_setzero_ps();
  }
  for (int gg = 0; gg < kSlice; ++gg) s_scale[gg] = _mm512_set1_ps(s_factor[g0 + gg]);
  for (size_t k = 0; k < num_keys16; k += 16) {
    __m512 scale[kSlice], min[kSlice];
    for (int gg = 0; gg < kSlice; ++gg) {
      scale[gg] = _mm512_mul_ps(_mm512_loadu_ps(hs + (g0 + gg) * num_keys16 + k), s_scale[gg]);
      min[gg] = _mm512_loadu_ps(hm + (g0 + gg) * num_keys16 + k);
    }
    for (int jj = 0; jj < kNumQ; ++jj) {
      const __m512 pj = _mm512_loadu_ps(p + (j0 + jj) * p_stride + k);
      const __m512 pn = _mm512_mul_ps(pj, p_scale[jj]);
      int32_t* row = weights + (static_cast<size_t>(j0 + jj) * num_groups + g0) * num_pairs;
      __m256i packed[kSlice];
      for (int gg = 0; gg < kSlice; ++gg) {
        sums[jj][gg] = _mm512_fmadd_ps(pj, min[gg], sums[jj][gg]);
        // Nearest int16 of each key's weight; keys 2u and 2u + 1 share dword u.
        packed[gg] = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(pn, scale[gg])));
        if (!interleaved) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + gg * num_pairs + k / 2), packed[gg]);
        } else if (gg % 2 == 1) {
          _mm512_storeu_si512(
              row + (gg - 1) * num_pairs + k,
              _mm512_permutex2var_epi32(_mm512_castsi256_si512(packed[gg - 1]), interleave,
                                        _mm512_castsi256_si512(packed[gg])));
        }
      }
    }
  }
  for (int jj = 0; jj < kNumQ; ++jj) {
    for (int gg = 0; gg < kSlice; ++gg) {
      min_sum[(j0 + jj) * num_groups + g0 + gg] = _mm512_reduce_add_ps(sums[jj][gg]);
    }
  }
}

// x moved up kLanes lanes (lane i + kLanes takes lane i), zeros into the lowest.
template <int kLanes>
KVS_VNNI_ATTR HWY_INLINE __m512 LanesUp(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_setzero_si512(), 16 - kLanes));
}

// The u8 weights of TakesQuadWeights' tiles (four keys per dword, in the first num_keys16 / 4 of
// each row; pairs of groups interleaved as in QuantiseWeightSlice) of kNumQ heads
// [j0, j0 + kNumQ) for kSlice groups [g0, g0 + kSlice), x = p · p_factor · hs · s_factor
// (<= kQuadLargest), rounded so that a tile keeps its mass: rounding each weight alone moves it
// by up to half a step, all in one direction where many keys weigh less than half a step (one
// dominant key and 255 small ones lose up to 127 of the dominant key's 254 steps).
// Each lane i of the 16-key rows carries its rounding error down its column (keys i, 16 + i,
// ...): q = round(x + carry), carry = x + carry - q, in [-0.5, 0.5]. The last row then takes the
// column carries with its own weights, y = max(x + carry, 0), and rounds their running sum
// along the lanes: q_i = round(y_0 + ... + y_i) - round(y_0 + ... + y_(i-1)). Each head and
// group's weights then sum to within half a step of its exact weights' sum (plus what the max
// drops: a lane whose last weight is below its carried error keeps that error, at most half a
// step), and no weight moves by more than 1.5 steps (q >= 0; q <= y + 1 < 256 with
// kQuadLargest = 254). U8ValueWeightsKeepATilesMass holds the kernel to that.
//   p_factor: [kNumQ]; s_factor: [num_groups]; hs: [num_groups][num_keys16]
constexpr float kQuadLargest = 254.0f;

// One row of 16 keys of QuantiseQuadSlice (kLast: the tile's last, rounded along the lanes).
template <int kNumQ, int kSlice, bool kLast>
KVS_VNNI_ATTR HWY_INLINE void QuantiseQuadRow(const VnniPlan& plan, size_t num_keys16,
                                              const float* p, size_t p_stride,
                                              const __m512* p_scale, const __m512* s_scale,
                                              const float* hs, int j0, int g0, size_t k,
                                              __m512 (*carry)[kSlice], int32_t* weights) {
  const size_t num_pairs = num_keys16 / 2;
  const __m512 zero = _mm512_setzero_ps();
  __m512 scale[kSlice];
#pragma GCC unroll 4
  for (int gg = 0; gg < kSlice; ++gg) {
    scale[gg] = _mm512_mul_ps(_mm512_loadu_ps(hs + (g0 + gg) * num_keys16 + k), s_scale[gg]);
  }
#pragma GCC unroll 4
  for (int jj = 0; jj < kNumQ; ++jj) {
    // (max with 0 first: a NaN weight becomes 0 and carries nothing)
    const __m512 pn = _mm512_max_ps(
        _mm512_mul_ps(_mm512_loadu_ps(p + (j0 + jj) * p_stride + k), p_scale[jj]), zero);
    int32_t* row = weights + (static_cast<size_t>(j0 + jj) * plan.num_groups + g0) * num_pairs;
    __m128i quads[kSlice];
#pragma GCC unroll 4
    for (int gg = 0; gg < kSlice; ++gg) {
      const __m512 y = _mm512_fmadd_ps(pn, scale[gg], carry[jj][gg]);
      __m512 q;
      if constexpr (!kLast) {
        q = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        carry[jj][gg] = _mm512_sub_ps(y, q);
      } else {  // the running sum along the lanes, rounded; each lane its step from the last
        __m512 sum = _mm512_max_ps(y, zero);
        sum = _mm512_add_ps(sum, LanesUp<1>(sum));
        sum = _mm512_add_ps(sum, LanesUp<2>(sum));
        sum = _mm512_add_ps(sum, LanesUp<4>(sum));
        sum = _mm512_add_ps(sum, LanesUp<8>(sum));
        const __m512 rounded =
            _mm512_roundscale_ps(sum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_sub_ps(rounded, LanesUp<1>(rounded));
      }
      quads[gg] = _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(q));
      if (plan.span_groups == 1) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row + gg * num_pairs + k / 4), quads[gg]);
      } else if (gg % 2 == 1) {  // (pairs of groups interleaved)
        __m128i* to = reinterpret_cast<__m128i*>(row + (gg - 1) * num_pairs + k / 2);
        _mm_storeu_si128(to, _mm_unpacklo_epi32(quads[gg - 1], quads[gg]));
        _mm_storeu_si128(to + 1, _mm_unpackhi_epi32(quads[gg - 1], quads[gg]));
      }
    }
  }
}

// QuantiseQuadRows16's scale factor for the groups' scales (see there).
constexpr float kScaleWords = 32512.0f * 32768.0f / 32767.0f;  // round(P S / 32768) = 128 x

// The integer nearest x f for 16 floats, as dwords: negative and NaN products become 0 in
// vpackusdw (vcvtps2udq gives them 0xFFFFFFFF, which it reads as -1).
KVS_VNNI_ATTR HWY_INLINE __m512i WordsOf(const float* x, __m512 f) {
  return _mm512_cvtps_epu32(_mm512_mul_ps(_mm512_loadu_ps(x), f));
}

// QuantiseQuadRows16's stores of one vector of two units' bytes for 16 keys (ordered as its
// `order` index puts them): unit a's rows at a, unit b's at b (dword pointers at the 16 keys;
// b null: the vector holds unit a alone, its second half not stored). Masked stores of the
// whole vector, each at its row less the dwords that precede its part (b lies at least 8
// dwords past a in the weights, so no pointer falls before them).
KVS_VNNI_ATTR HWY_INLINE void StoreQuadUnits(bool interleaved, size_t num_pairs, __m512i bytes,
                                             int32_t* a, int32_t* b) {
  if (interleaved) {  // a: dwords 0..7, b: 8..15
    _mm512_mask_storeu_epi32(a, 0x00FF, bytes);
    if (b != nullptr) _mm512_mask_storeu_epi32(b - 8, 0xFF00, bytes);
    return;
  }
  // a g, a g + 1, b g, b g + 1: 4 dwords each, the groups' rows num_pairs apart.
  _mm512_mask_storeu_epi32(a, 0x000F, bytes);
  _mm512_mask_storeu_epi32(a + num_pairs - 4, 0x00F0, bytes);
  if (b == nullptr) return;
  _mm512_mask_storeu_epi32(b - 8, 0x0F00, bytes);
  _mm512_mask_storeu_epi32(b + num_pairs - 12, 0xF000, bytes);
}

// The rows [0, end) of QuantiseQuadSlice for an even kSlice in 16-bit integers, a third fewer
// instructions than QuantiseQuadRow's floats (whose row is the tile's last). Per head j and pair
// of groups (g, g + 1), 32 words: P = p 32767 / max p and S = s kScaleWords / max |s| are rounded
// to 15 bits, and vpmulhrsw's y = round(P S / 32768) is 128 x, off by about 1/128 of a step with
// either sign (P, S and y each rounded to nearest: no bias for the carries to pile up). Each lane
// carries c = 64 + 128 r, r its rounding error in [-0.5, 0.5): q = (y + c) >> 7 is the nearest
// step of x + r, and c' = (y + c) & 127 (y + c <= 32512 + 127, q <= 254). The words' order,
// from vpackusdw of two 16-key vectors, is (g: keys 4l..4l+3, g + 1: the same) in 128-bit lane
// l; vpackuswb of two such units and one vpermd give each row's bytes. On return `carry` holds
// each head and group's r as floats in key order, for the last row.
//   p_factor: [kNumQ] (kQuadLargest over the head's largest p); s_factor: [num_groups]
template <int kNumQ, int kSlice>
KVS_VNNI_ATTR HWY_INLINE void QuantiseQuadRows16(const VnniPlan& plan, size_t num_keys16,
                                                 const float* p, size_t p_stride,
                                                 const float* p_factor, const float* s_factor,
                                                 const float* hs, int j0, int g0, size_t end,
                                                 __m512 (*carry)[kSlice], int32_t* weights) {
  static_assert(kSlice % 2 == 0);
  constexpr int kPairs = kSlice / 2, kUnits = kNumQ * kPairs;  // unit u: (head, group pair)
  const size_t num_pairs = num_keys16 / 2;
  const int num_groups = plan.num_groups;
  const bool interleaved = plan.span_groups == 2;
  // Dwords of vpackuswb(unit a, unit b): (a g, a g + 1, b g, b g + 1) of quad l in lane l. Rows
  // of pairs of groups interleaved: a's 8 dwords, then b's; else a g, a g + 1, b g, b g + 1.
  const __m512i order =
      interleaved ? _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)
                  : _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const size_t quads_at = interleaved ? 2 : 4;  // keys per dword of a row
  __m512 p_words[kNumQ], s_words[kSlice];
  __m512i c[kUnits];
  int32_t* rows[kUnits];  // unit u's first row
#pragma GCC unroll 4
  for (int jj = 0; jj < kNumQ; ++jj) {
    p_words[jj] = _mm512_set1_ps(p_factor[jj] * (32767.0f / kQuadLargest));
  }
#pragma GCC unroll 4
  for (int gg = 0; gg < kSlice; ++gg) s_words[gg] = _mm512_set1_ps(s_factor[g0 + gg] * kScaleWords);
#pragma GCC unroll 8
  for (int u = 0; u < kUnits; ++u) {
    c[u] = _mm512_set1_epi16(64);
    const int jj = u / kPairs, g = g0 + 2 * (u % kPairs);
    rows[u] = weights + (static_cast<size_t>(j0 + jj) * num_groups + g) * num_pairs;
  }
  const __m512i low_bits = _mm512_set1_epi16(0x7F);
  for (size_t k = 0; k < end; k += 16) {
    __m512i s_pair[kPairs];
#pragma GCC unroll 2
    for (int pp = 0; pp < kPairs; ++pp) {
      s_pair[pp] = _mm512_packus_epi32(
          WordsOf(hs + (g0 + 2 * pp) * num_keys16 + k, s_words[2 * pp]),
          WordsOf(hs + (g0 + 2 * pp + 1) * num_keys16 + k, s_words[2 * pp + 1]));
    }
    __m512i q[kUnits];
#pragma GCC unroll 4
    for (int jj = 0; jj < kNumQ; ++jj) {
      const __m512i pj = WordsOf(p + (j0 + jj) * p_stride + k, p_words[jj]);
      const __m512i p_pair = _mm512_packus_epi32(pj, pj);
#pragma GCC unroll 2
      for (int pp = 0; pp < kPairs; ++pp) {
        const int u = jj * kPairs + pp;
        const __m512i z = _mm512_add_epi16(_mm512_mulhrs_epi16(p_pair, s_pair[pp]), c[u]);
        q[u] = _mm512_srli_epi16(z, 7);
        c[u] = _mm512_and_si512(z, low_bits);
      }
    }
    const size_t at = k / quads_at;
#pragma GCC unroll 4
    for (int u = 0; u < kUnits; u += 2) {
      const bool pair = u + 1 < kUnits;  // (an odd count: the last unit alone, packed twice)
      StoreQuadUnits(
          interleaved, num_pairs,
          _mm512_permutexvar_epi32(order, _mm512_packus_epi16(q[u], q[pair ? u + 1 : u])),
          rows[u] + at, pair ? rows[u + 1] + at : nullptr);
    }
  }
  // r = (c - 64) / 128 by group, in key order: the low 256 bits of c hold keys 0..7, the high
  // 256 bits keys 8..15, as (g: 4 keys, g + 1: 4 keys) per 128-bit lane.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(4));
  const __m512 bias = _mm512_set1_ps(64.0f), step = _mm512_set1_ps(1.0f / 128.0f);
#pragma GCC unroll 8
  for (int u = 0; u < kUnits; ++u) {
    const int jj = u / kPairs, gg = 2 * (u % kPairs);
    const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(c[u]));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(c[u], 1));
    carry[jj][gg] = _mm512_mul_ps(
        _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, first, hi)), bias), step);
    carry[jj][gg + 1] = _mm512_mul_ps(
        _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, second, hi)), bias), step);
  }
}

template <int kNumQ, int kSlice>
KVS_VNNI_ATTR HWY_INLINE void QuantiseQuadSlice(const VnniPlan& plan, size_t num_keys16,
                                                const float* p, size_t p_stride,
                                                const float* p_factor, const float* s_factor,
                                                const float* hs, int j0, int g0, int32_t* weights) {
  __m512 p_scale[kNumQ], s_scale[kSlice], carry[kNumQ][kSlice];
#pragma GCC unroll 4
  for (int jj = 0; jj < kNumQ; ++jj) {
    p_scale[jj] = _mm512_set1_ps(p_factor[jj]);
#pragma GCC unroll 4
    for (int gg = 0; gg < kSlice; ++gg) carry[jj][gg] = _mm512_setzero_ps();
  }
#pragma GCC unroll 4
  for (int gg = 0; gg < kSlice; ++gg) s_scale[gg] = _mm512_set1_ps(s_factor[g0 + gg]);
  const size_t last = num_keys16 - 16;
  if constexpr (kSlice % 2 == 0) {
    QuantiseQuadRows16<kNumQ, kSlice>(plan, num_keys16, p, p_stride, p_factor, s_factor, hs, j0, g0,
                                      last, carry, weights);
  } else {
    for (size_t k = 0; k < last; k += 16) {
      QuantiseQuadRow<kNumQ, kSlice, false>(plan, num_keys16, p, p_stride, p_scale, s_scale, hs, j0,
                                            g0, k, carry, weights);
    }
  }
  QuantiseQuadRow<kNumQ, kSlice, true>(plan, num_keys16, p, p_stride, p_scale, s_scale, hs, j0, g0,
                                       last, carry, weights);
}

// The minima's sums where the weights are u8, sum_k p_j[k] hm_g[k], for kNumQ heads [j0, j0 +
// kNumQ) and kSlice groups [g0, g0 + kSlice) (QuantiseQuadSlice's carries leave no registers for
// them).
template <int kNumQ, int kSlice>
KVS_VNNI_ATTR HWY_INLINE void MinimaSumSlice(const VnniPlan& plan, size_t num_keys16,
                                             const float* p, size_t p_stride, const float* hm,
                                             int j0, int g0, float* min_sum) {
  const int num_groups = plan.num_groups;
  __m512 sums[kNumQ][kSlice];
  for (int jj = 0; jj < kNumQ; ++jj) {
    for (int gg = 0; gg < kSlice; ++gg) sums[jj][gg] = _mm512_setzero_ps();
  }
  for (size_t k = 0; k < num_keys16; k += 16) {
    __m512 min[kSlice];
    for (int gg = 0; gg < kSlice; ++gg) min[gg] = _mm512_loadu_ps(hm + (g0 + gg) * num_keys16 + k);
    for (int jj = 0; jj < kNumQ; ++jj) {
      const __m512 pj = _mm512_loadu_ps(p + (j0 + jj) * p_stride + k);
      for (int gg = 0; gg < kSlice; ++gg) {
        sums[jj][gg] = _mm512_fmadd_ps(pj, min[gg], sums[jj][gg]);
      }
    }
  }
  for (int jj = 0; jj < kNumQ; ++jj) {
    for (int gg = 0; gg < kSlice; ++gg) {
      min_sum[(j0 + jj) * num_groups + g0 + gg] = _mm512_reduce_add_ps(sums[jj][gg]);
    }
  }
}

// The scales and minima of a tile's keys by group, hs and hm [num_groups][num_keys16]; returns
// each group's largest |scale| as lane g (lanes past num_groups 0). In lanes, not stored one by
// one: a vector load of floats just stored singly waits for the stores to drain (in QuantiseWeights
// that wait held a tenth of its samples). kGroups: plan.num_groups where known at compile time
// (the scales stay in registers), else 0.
template <int kGroups>
KVS_VNNI_ATTR HWY_INLINE __m512 SplitGroupScales(const VnniPlan& plan, const RowSet& values,
                                                 size_t num_keys16, bool quads, float* hs,
                                                 float* hm) {
  const int num_groups = kGroups > 0 ? kGroups : plan.num_groups;
  const __m512 middle = _mm512_set1_ps(MiddleCode(plan.bits));
  __m512 scale_max[16];
#pragma GCC unroll 16
  for (int g = 0; g < num_groups; ++g) scale_max[g] = _mm512_setzero_ps();
  for (size_t key0 = 0; key0 < num_keys16; key0 += 16) {
    __m512 scale[16], min[16];
    LoadGroupScales<kGroups>(plan, values, key0, scale, min);
#pragma GCC unroll 16
    for (int g = 0; g < num_groups; ++g) {
      _mm512_storeu_ps(hs + g * num_keys16 + key0, scale[g]);
      // (u8 weights: the value of the middle code, see CentreQuadWeights.)
      _mm512_storeu_ps(hm + g * num_keys16 + key0,
                       quads ? _mm512_fmadd_ps(scale[g], middle, min[g]) : min[g]);
      scale_max[g] = _mm512_max_ps(scale_max[g], _mm512_abs_ps(scale[g]));
    }
  }
#pragma GCC unroll 16
  for (int g = num_groups; g < (num_groups + 3) / 4 * 4; ++g) scale_max[g] = _mm512_setzero_ps();
  __m512 s_max = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int g = 0; g < num_groups; g += 4) {
    const __m512 four = _mm512_castps128_ps512(MaxOfLanes4(scale_max + g));
    switch (g / 4) {  // (the lane immediate must be a constant)
      case 0:
        s_max = _mm512_insertf32x4(s_max, _mm512_castps512_ps128(four), 0);
        break;
      case 1:
        s_max = _mm512_insertf32x4(s_max, _mm512_castps512_ps128(four), 1);
        break;
      case 2:
        s_max = _mm512_insertf32x4(s_max, _mm512_castps512_ps128(four), 2);
        break;
      default:
        s_max = _mm512_insertf32x4(s_max, _mm512_castps512_ps128(four), 3);
    }
  }
  return s_max;
}

// u8 weights (TakesQuadWeights): the sums are taken as if each code were less its group's middle m
// (the minima, hm, have m scale back): m W times what each head and group's integer weights sum
// to comes off its minima's sum. Those sums by vpdpbusd against ones over the stored weights
// (four per dword; pairs of groups in alternate dwords where interleaved).
KVS_VNNI_ATTR void CentreQuadWeights(const VnniPlan& plan, size_t num_keys16, int group,
                                     const int32_t* weights, const float* w_scale, float* min_sum) {
  const int num_groups = plan.num_groups;
  const size_t num_pairs = num_keys16 / 2;
  const bool interleaved = plan.span_groups == 2;
  const size_t dwords = interleaved ? num_pairs : num_keys16 / 4;  // per row that holds weights
  const __m512i ones = _mm512_set1_epi8(1);
  const float middle = MiddleCode(plan.bits);
  for (int j = 0; j < group; ++j) {
    for (int g = 0; g < num_groups; g += interleaved ? 2 : 1) {
      const size_t h = static_cast<size_t>(j) * num_groups + g;
      const int32_t* row = weights + h * num_pairs;
      __m512i sums = _mm512_setzero_si512();
      for (size_t i = 0; i < dwords; i += 16) {
        const __mmask16 mask = dwords - i >= 16 ? 0xFFFF : (1u << (dwords - i)) - 1;
        sums = _mm512_dpbusd_epi32(sums, _mm512_maskz_loadu_epi32(mask, row + i), ones);
      }
      if (!interleaved) {
        min_sum[h] -= middle * w_scale[h] * static_cast<float>(_mm512_reduce_add_epi32(sums));
        continue;
      }
      min_sum[h] -=
          middle * w_scale[h] * static_cast<float>(_mm512_mask_reduce_add_epi32(0x5555, sums));
      min_sum[h + 1] -=
          middle * w_scale[h + 1] * static_cast<float>(_mm512_mask_reduce_add_epi32(0xAAAA, sums));
    }
  }
}

// Whether a tile's values take u8 weights (VnniPlan::value_quads, and see QuantiseQuadSlice):
// where every head's softmax weights sum to at least sqrt(n) times its largest, n the tile's
// keys (padded to 16). u8 weights move each key's weight by up to 1.5 steps of 1/254 of the
// largest, some 0.4 of a step RMS, so their noise in the output is some 0.4 sqrt(n) / 254 of
// the values' spread relative to the weights' sum: at most 1/600 of it here. A tile where a few
// keys take the weight (one dominant key and 255 at 1e-3 of it: ManySmallWeightsKeepTheirMass)
// keeps int16 weights, which put the noise 128 times lower.
//   p_max, p_sum: [group]
bool TakesQuadWeights(const VnniPlan& plan, size_t num_keys16, const float* p_max,
                      const float* p_sum, int group) {
  if (!plan.value_quads) return false;
  switch (ValueWeightsSetForTest()) {
    case ValueWeightsForTest::kInt16:
      return false;
    case ValueWeightsForTest::kU8:
      return true;
    case ValueWeightsForTest::kChosen:
      break;
  }
  const float spread = std::sqrt(static_cast<float>(num_keys16));
  for (int j = 0; j < group; ++j) {
    if (!(p_sum[j] >= spread * p_max[j])) return false;  // (NaN sums take int16)
  }
  return true;
}

// The weights of a tile's values for `group` heads: int16, two keys per dword (AccumulateSpans,
// AccumulatePairs), or, where TakesQuadWeights, u8, four keys per dword in the first
// num_keys16 / 4 of each row (AccumulateQuadSpans); returns which (true: u8).
// weights [group][num_groups][num_keys16 / 2] (pairs of groups interleaved for span-read
// values, see QuantiseWeightSlice); w_scale and min_sum [group][num_groups]: what a weight unit is
// worth, and the softmax weights times the keys' minima summed (u8: less the centring, see
// CentreQuadWeights). With p' = L p / max_t p_j[t] and s' = s / max_t |s_g[t]|, the weight is
// p' s' (|p' s'| <= L) and W = max p_j * max |s_g| / L, L = 32767 (u8: kQuadLargest).
//   p: [group, p_stride] (0 past the tile's keys); stats: p's (TileWeightStats)
KVS_VNNI_ATTR bool QuantiseWeights(const VnniPlan& plan, const RowSet& values, size_t num_keys16,
                                   const float* p, size_t p_stride, const TileWeightStats& stats,
                                   int group, int32_t* weights, float* w_scale, float* min_sum) {
  const int num_groups = plan.num_groups;
  const float* p_max = stats.max;
  // Per head, the largest weight over the largest p.
  thread_local std::vector<float> p_factors;
  p_factors.resize(group);
  float* p_factor = p_factors.data();
  const bool quads = TakesQuadWeights(plan, num_keys16, p_max, stats.sum, group);
  // Per group, the keys' scales and minima: [num_groups][num_keys16].
  float* hs = Scratch(kSlotHeaders, 2 * static_cast<size_t>(num_groups) * num_keys16);
  float* hm = hs + static_cast<size_t>(num_groups) * num_keys16;
  __m512 s_max;
  switch (num_groups) {  // (the common counts with the scales in registers)
    case 1:
      s_max = SplitGroupScales<1>(plan, values, num_keys16, quads, hs, hm);
      break;
    case 2:
      s_max = SplitGroupScales<2>(plan, values, num_keys16, quads, hs, hm);
      break;
    case 4:
      s_max = SplitGroupScales<4>(plan, values, num_keys16, quads, hs, hm);
      break;
    default:
      s_max = SplitGroupScales<0>(plan, values, num_keys16, quads, hs, hm);
  }
  // 1 / s_max (0 for 0), and each head and group's weight unit, from the lanes.
  alignas(64) float s_factor[16];
  const __mmask16 positive = _mm512_cmp_ps_mask(s_max, _mm512_setzero_ps(), _CMP_GT_OQ);
  _mm512_store_ps(s_factor, _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0f), s_max));
  const __mmask16 groups = static_cast<__mmask16>((1u << num_groups) - 1);
  const float largest = quads ? kQuadLargest : 32767.0f;
  for (int j = 0; j < group; ++j) {
    p_factor[j] = p_max[j] > 0.0f ? largest / p_max[j] : 0.0f;
    _mm512_mask_storeu_ps(
        w_scale + j * num_groups, groups,
        _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(p_max[j]), s_max), _mm512_set1_ps(largest)));
  }
  // Heads in steps of 4, 2 and 1, groups in slices of 4, 2 and 1: at most 16 sums, 4 scales,
  // 4 minima and 4 head factors in registers. (No lambda or generic dispatch: they would not
  // carry this function's target attribute.)
  for (int j = 0, num_q = 0; j < group; j += num_q) {
    num_q = group - j >= 4 ? 4 : group - j >= 2 ? 2 : 1;
    for (int g = 0, slice = 0; g < num_groups; g += slice) {
      slice = num_groups - g >= 4 ? 4 : num_groups - g >= 2 ? 2 : 1;
#define KVS_SLICE(kNumQ, kSlice)                                                             \
  (quads ? (QuantiseQuadSlice<kNumQ, kSlice>(plan, num_keys16, p, p_stride, p_factor + j,    \
                                             s_factor, hs, j, g, weights),                   \
            MinimaSumSlice<kNumQ, kSlice>(plan, num_keys16, p, p_stride, hm, j, g, min_sum)) \
         : QuantiseWeightSlice<kNumQ, kSlice>(plan, num_keys16, p, p_stride, p_factor + j,   \
                                              s_factor, hs, hm, j, g, weights, min_sum))
#define KVS_SLICES(kNumQ) \
  (slice == 4 ? KVS_SLICE(kNumQ, 4) : slice == 2 ? KVS_SLICE(kNumQ, 2) : KVS_SLICE(kNumQ, 1))
      num_q == 4 ? KVS_SLICES(4) : num_q == 2 ? KVS_SLICES(2) : KVS_SLICES(1);
#undef KVS_SLICES
#undef KVS_SLICE
    }
  }
  if (quads) CentreQuadWeights(plan, num_keys16, group, weights, w_scale, min_sum);
  return quads;
}

// Weighted sum of a tile's values (rows padded to a multiple of 16) into the running states of
// the `group` query heads, as AccumulateTile: p: [group, p_stride] softmax weights (0 past
// num_keys, up to the next multiple of 16) and stats their largest and sum per head
// (TileWeightStats); state: [group, state_stride].
template <int kBits>
KVS_VNNI_ATTR void VnniAccumulateTileBits(const VnniPlan& plan, const RowSet& values,
                                          size_t num_keys, const float* p, size_t p_stride,
                                          const TileWeightStats& stats, int group, float* state,
                                          size_t state_stride) {
  const size_t num_keys16 = (num_keys + 15) / 16 * 16;
  const size_t num_pairs = num_keys16 / 2;
  const int num_groups = plan.num_groups;
  const ValueWeights tile = ValueWeightsScratch(group, num_groups, num_pairs);
  const bool quads = QuantiseWeights(plan, values, num_keys16, p, p_stride, stats, group,
                                     tile.weights, tile.w_scale, tile.min_sum);
  const size_t group_stride = num_pairs;
  // -t16 values are read in quads, by spans only (DecodeImpl copies the others' rows out).
  KVS_DCHECK(!plan.tiled || plan.value_spans > 0);
  if constexpr (kBits < 8) {
    if (plan.value_spans > 0) {
      const std::byte* const* value_quads =
          plan.tiled ? ValueQuadsOf(plan, values, num_keys16) : nullptr;
      return AccumulateTileBySpans<kBits>(plan, values, num_pairs, quads, tile.weights, value_quads,
                                          tile.w_scale, tile.min_sum, group, state, state_stride);
    }
  }
  // The sums, 4 blocks of 16 elements (2 where head_dim is not a multiple of 64) for up to 4
  // heads at a time: at most 16 accumulators.
  // (No lambda or generic dispatch: they would not carry this function's target attribute.)
  const int num_blocks = static_cast<int>(plan.head_dim / 16);
  const int step = num_blocks % 4 == 0 ? 4 : 2;
  // Heads in steps of 4, 2 and 1 (three would cost another set of instantiations).
  for (int j = 0, num_q = 0; j < group; j += num_q) {
    num_q = group - j >= 4 ? 4 : group - j >= 2 ? 2 : 1;
    for (int m0 = 0; m0 < num_blocks; m0 += step) {
      const int32_t* w[16];  // [jj * step + b]
      for (int jj = 0; jj < num_q; ++jj) {
        for (int b = 0; b < step; ++b) {
          const int g = 16 * (m0 + b) / plan.group_elems;
          w[jj * step + b] =
              tile.weights + (static_cast<size_t>(j + jj) * num_groups + g) * group_stride;
        }
      }
      __m512i acc[16];
      const bool paired = plan.group_elems % 32 == 0;
      if (step == 4) {
        if (paired) {
          AccumulateHeads<kBits, 4, true>(plan, values, num_pairs, w, m0, num_q, acc);
        } else {
          AccumulateHeads<kBits, 4, false>(plan, values, num_pairs, w, m0, num_q, acc);
        }
      } else {
        if (paired) {
          AccumulateHeads<kBits, 2, true>(plan, values, num_pairs, w, m0, num_q, acc);
        } else {
          AccumulateHeads<kBits, 2, false>(plan, values, num_pairs, w, m0, num_q, acc);
        }
      }
      for (int jj = 0; jj < num_q; ++jj) {
        for (int b = 0; b < step; ++b) {
          const int m = m0 + b, head = j + jj;
          const int g = 16 * m / plan.group_elems;
          float* st = state + head * state_stride + 16 * m;
          const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[jj * step + b]),
                                           _mm512_set1_ps(tile.w_scale[head * num_groups + g]),
                                           _mm512_set1_ps(tile.min_sum[head * num_groups + g]));
          _mm512_storeu_ps(st, _mm512_add_ps(_mm512_loadu_ps(st), v));
        }
      }
    }
  }
}

void VnniAccumulateTile(const VnniPlan& plan, const RowSet& values, size_t num_keys, const float* p,
                        size_t p_stride, const TileWeightStats& stats, int group, float* state,
                        size_t state_stride) {
  switch (plan.bits) {
    case 8:
      return VnniAccumulateTileBits<8>(plan, values, num_keys, p, p_stride, stats, group, state,
                                       state_stride);
    case 4:
      return VnniAccumulateTileBits<4>(plan, values, num_keys, p, p_stride, stats, group, state,
                                       state_stride);
    default:
      return VnniAccumulateTileBits<2>(plan, values, num_keys, p, p_stride, stats, group, state,
                                       state_stride);
  }
}

// A task's `group` states [group, state_stride] from span order (AccumulateTileBySpans) back to
// element order, once per task: st[e] = st[span_slot[e]] by gathers from a copy.
KVS_VNNI_ATTR void VnniSpanOrderToElements(const VnniPlan& plan, int group, float* state,
                                           size_t state_stride) {
  alignas(64) float row[kVnniMaxHeadDim];
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::memcpy(row, st, plan.head_dim * sizeof(float));
    for (size_t e = 0; e < plan.head_dim; e += 16) {
      const __m512i slots = _mm512_loadu_si512(plan.span_slot + e);
      _mm512_storeu_ps(st + e, _mm512_i32gather_ps(slots, row, sizeof(float)));
    }
  }
}

#undef KVS_VNNI_ATTR

#else  // not AVX3: the float readers everywhere

VnniPlan PlanVnni(const SideSpec&, size_t, size_t) { return {}; }
void VnniPrepareQueries(const VnniPlan&, const float*, int, VnniQuery*) {}
void KiviPrepareQueries(const VnniPlan&, const float*, int, KiviQueries*) {}
void VnniScoreTile(const VnniPlan&, const RowSet&, const RowSet&, size_t, const VnniQuery*,
                   const KiviQueries&, int, float*, size_t) {}
void VnniAccumulateTile(const VnniPlan&, const RowSet&, size_t, const float*, size_t,
                        const TileWeightStats&, int, float*, size_t) {}
void VnniSpanOrderToElements(const VnniPlan&, int, float*, size_t) {}

#endif  // HWY_TARGET == HWY_AVX3

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
