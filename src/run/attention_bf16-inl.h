// Per-target decode readers for BF16 and FP8 keys and values with AVX512_BF16 (included by
// attention_decode.cc inside its foreach_target pass; compiled only for the AVX3 target, used only
// where the CPU reports avx512bf16 and avx512vbmi, as every CPU with the first but Cooper Lake
// does; every other machine reads them with the float readers).
//
// Why: the float readers widen every BF16 element to F32 and spend one FMA per query head on it.
// On Zen 4, which runs one 512-bit FMA per cycle, that arithmetic is about what DRAM delivers, so
// the reads and the arithmetic take turns instead of overlapping. vdpbf16ps multiplies 32 BF16
// pairs and adds each pair's sum into one of 16 F32 lanes: half the instructions, no widening.
//
// What it rounds: the query (once per task) and each tile's softmax weights to BF16 (round to
// nearest even), as llama.cpp rounds the query and the weights to the type of its F16 and BF16
// caches. Relative error at most 2^-9 per element, the size of the cache's own rounding of keys
// and values; products and sums stay F32.
//
// Keys: 4 keys x up to 4 query heads at a time (ForEachHeadStep); each 32-element chunk of a key
// row is one load and one vdpbf16ps per head against that head's BF16 query chunk, then the sums
// of lanes of the 16 accumulators (SumOfLanes4).
// Values: 2 keys at a time. A 16-bit unpack of the two rows' chunks puts (v_t[e], v_t+1[e]) in one
// dword, and one vdpbf16ps per head adds p_t v_t[e] + p_t+1 v_t+1[e] with the weight pair (p_t,
// p_t+1) broadcast. The unpacks keep elements in place only within 128-bit lanes, so the state
// is held in that order for the task and put back once at its end (Bf16OrderToElements).
//
// Widened (Bf16Plan::widen): where vdpbf16ps is slow (on Emerald Rapids it takes as long as 3.4
// F32 FMAs), a 16-bit unpack with zeros turns each BF16 chunk into two F32 vectors (each BF16 is
// the high half of its F32) in the values' unpack order, once per step of heads, and F32 FMAs
// multiply them by the query (kept F32 in that order, Bf16WidenQueries) or by each key's F32
// weight. Nothing is rounded then. Bf16WidenPays chooses by the instructions' costs, measured
// once per process.
//
// FP8 rows ([f16 scale][codes], E4M3 or E5M2) go through the same dot products: every E4M3 and
// E5M2 value is exact in BF16, so a code becomes its BF16 by two byte-table lookups (vpermt2b
// reads 7 index bits, the magnitude: one lookup for the high bytes, one for the low) and an OR
// of the sign, about 4 operations per 32 codes where the float reader's conversion to F32 and
// FMAs took about 16 (Fp8WordsToBf16). The row's scale multiplies the key's score, or the
// value's softmax weight before that is rounded to BF16. Nothing is rounded beyond what BF16
// rows round: the query and the weights.
//
// FP8 keys and values in FP16 (Bf16Plan::half_keys, half_values; CPUs with AVX512-FP16): the
// codes become IEEE halves by shifts and vfmadd231ph multiplies them, 32 per instruction
// (attention_half-inl.h).

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "represent/fp8.h"
#include "run/attention_kernels.h"

#if defined(KVSTACK_RUN_ATTENTION_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_BF16_INL_H_
#undef KVSTACK_RUN_ATTENTION_BF16_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_BF16_INL_H_
#endif

#include "hwy/highway.h"
#include "run/attention_half-inl.h"
#include "run/attention_readers-inl.h"

#if HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

// BF16 elements per vdpbf16ps operand: the unit head_dim comes in.
constexpr size_t kBf16Chunk = 32;
// Largest head_dim the BF16 readers take (Bf16OrderToElements' row is a fixed array).
constexpr size_t kBf16MaxHeadDim = 512;

// Which sides of a decode task the BF16 readers take, and the rows' format there (kBF16,
// kFp8E4M3 or kFp8E5M2).
struct Bf16Plan {
  bool keys = false;
  bool values = false;
  Reader key_reader = Reader::kBF16;
  Reader value_reader = Reader::kBF16;
  // Multiply by widening each BF16 to F32 (a 16-bit unpack) and FMAs instead of vdpbf16ps
  // (Bf16WidenPays).
  bool widen = false;
  // FP8 keys and values as FP16 halves, multiplied by vfmadd231ph (attention_half-inl.h): the
  // queries come from HalfPrepareQueries; the values' state is in element order.
  bool half_keys = false;
  bool half_values = false;
};

constexpr bool IsFp8Reader(Reader r) { return r == Reader::kFp8E4M3 || r == Reader::kFp8E5M2; }

#if HWY_TARGET == HWY_AVX3

// The AVX3 target's features plus AVX512_BF16 and VBMI (the byte permutes of FP8 rows,
// Fp8WordsToBf16), spelled out whole (see KVS_VNNI_ATTR: clang lets a function's target attribute
// replace the HWY_BEFORE_NAMESPACE pragma's list).
#define KVS_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,avx512vbmi")))

bool CpuHasBf16Dot() {
  static const bool has =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
  return has && !DotProductReadersDisabledForTest();
}

bool Bf16Applies(const SideSpec& side, size_t head_dim, size_t lanes) {
  const bool format = side.reader == Reader::kBF16 || IsFp8Reader(side.reader);
  return lanes == 16 && side.fill == FillKind::kDirect && format && head_dim % kBf16Chunk == 0 &&
         head_dim <= kBf16MaxHeadDim && CpuHasBf16Dot();
}

// What one 512-bit instruction costs on this CPU, in nanoseconds: the least of 7 timings of 8
// independent chains of 256. kKind 0: vdpbf16ps, 1: vfmadd231ps, 2: vpunpcklwd.
template <int kKind>
KVS_BF16_ATTR double NsPerInstruction() {
  constexpr int kChains = 8, kSteps = 256, kTimings = 7;
  double best = 1e9;
  for (int timing = 0; timing < kTimings; ++timing) {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1e-3f * static_cast<float>(c));
    const __m512 x = _mm512_set1_ps(0.999f);
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < kSteps; ++step) {
      for (int c = 0; c < kChains; ++c) {
        if constexpr (kKind == 0) {
          acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)x, (__m512bh)x);
        } else if constexpr (kKind == 1) {
          acc[c] = _mm512_fmadd_ps(acc[c], x, x);
        } else {
          acc[c] = _mm512_castsi512_ps(
              _mm512_unpacklo_epi16(_mm512_castps_si512(acc[c]), _mm512_castps_si512(x)));
        }
      }
      // (An empty asm per step keeps the compiler from reordering or folding the chains.)
      asm volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
      asm volatile("" : "+v"(acc[4]), "+v"(acc[5]), "+v"(acc[6]), "+v"(acc[7]));
    }
    const std::chrono::duration<double, std::nano> ns = std::chrono::steady_clock::now() - start;
    best = std::min(best, ns.count() / (kChains * kSteps));
  }
  return best;
}

// Whether the BF16 readers multiply faster here by widening each BF16 to F32 (one 16-bit unpack
// per 16 elements, shared by a step of heads) and F32 FMAs than by vdpbf16ps, for steps of
// `heads` query heads. Per 32-element chunk, a key and a pair of value rows: vdpbf16ps costs 3
// per head (1 for the key, 2 for the values) plus the values' 2 unpacks; widening 6 FMAs per
// head plus 6 unpacks (2 for the key, 4 for the two value rows). On Zen 4 all three
// instructions cost one cycle and vdpbf16ps wins; on Emerald Rapids (0.75, 0.22 and 0.34 ns)
// widening wins from 2 heads per step.
bool Bf16WidenPays(int heads) {
  switch (Bf16MultiplySetForTest()) {
    case Bf16MultiplyForTest::kDot:
      return false;
    case Bf16MultiplyForTest::kWiden:
      return true;
    case Bf16MultiplyForTest::kMeasured:
      break;
  }
  struct Costs {
    double dot, fma, unpack;
  };
  static const Costs kCosts = [] {
    Costs c{1e9, 1e9, 1e9};
    for (int round = 0; round < 3; ++round) {  // interleaved, so that a clock change hits all
      c.dot = std::min(c.dot, NsPerInstruction<0>());
      c.fma = std::min(c.fma, NsPerInstruction<1>());
      c.unpack = std::min(c.unpack, NsPerInstruction<2>());
    }
    return c;
  }();
  return 4 * kCosts.unpack + 6 * heads * kCosts.fma < 3 * heads * kCosts.dot;
}

// group: query heads per kv head.
Bf16Plan PlanBf16(const SideSpec& k_side, const SideSpec& v_side, size_t head_dim, size_t lanes,
                  int group) {
  Bf16Plan plan{Bf16Applies(k_side, head_dim, lanes), Bf16Applies(v_side, head_dim, lanes),
                k_side.reader, v_side.reader};
  plan.widen = (plan.keys || plan.values) && Bf16WidenPays(std::min(group, 4));
  plan.half_keys = plan.keys && IsFp8Reader(plan.key_reader) && CpuHasFp16();
  plan.half_values = plan.values && IsFp8Reader(plan.value_reader) && CpuHasFp16();
  return plan;
}

// The `group` query heads q: [group, head_dim] (scaled, rotated) as BF16, element order, into
// out: [group, head_dim] BF16 bits.
KVS_BF16_ATTR void Bf16PrepareQueries(const float* q, int group, size_t head_dim, uint16_t* out) {
  const size_t n = static_cast<size_t>(group) * head_dim;
  for (size_t e = 0; e < n; e += kBf16Chunk) {
    const __m512bh bf = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + e + 16), _mm512_loadu_ps(q + e));
    _mm512_storeu_si512(out + e, (__m512i)bf);
  }
}

// Where element e of a row sits in a state accumulated by Bf16AccumulateTile: within each
// 32-element chunk, the 16-bit unpacks put element 8 L + 4 h + i (128-bit lane L, half h) in
// slot 16 h + 4 L + i.
inline size_t Bf16Slot(size_t e) {
  const size_t in_chunk = e % kBf16Chunk, lane = in_chunk / 8, half = in_chunk / 4 % 2;
  return e - in_chunk + 16 * half + 4 * lane + in_chunk % 4;
}

// The `group` query heads q: [group, head_dim] as F32 in the order of Bf16Slot, into out:
// [group, head_dim], for the widening readers (Bf16Plan::widen).
void Bf16WidenQueries(const float* q, int group, size_t head_dim, float* out) {
  for (int j = 0; j < group; ++j) {
    for (size_t e = 0; e < head_dim; ++e) out[j * head_dim + Bf16Slot(e)] = q[j * head_dim + e];
  }
}

// Vector casts (a reference cast would send the vector through memory).
KVS_BF16_ATTR HWY_INLINE __m512bh AsBf16(__m512i bits) { return (__m512bh)bits; }

KVS_BF16_ATTR HWY_INLINE __m512bh LoadBf16(const void* p) { return AsBf16(_mm512_loadu_si512(p)); }

// The BF16 bytes of every FP8 magnitude (codes 0..127), from the codec's own scalar decode: exact,
// since E4M3 and E5M2 carry at most 3 mantissa bits and exponents well inside BF16's; NaN codes
// become BF16's quiet NaN, E5M2's infinity BF16's.
struct Fp8Bf16Bytes {
  alignas(64) uint8_t low[128];
  alignas(64) uint8_t high[128];
};

template <Reader kR>
const Fp8Bf16Bytes& Fp8Bf16BytesOf() {
  static const Fp8Bf16Bytes kBytes = [] {
    Fp8Bf16Bytes t{};
    for (int m = 0; m < 128; ++m) {
      const auto code = static_cast<uint8_t>(m);
      const float x = kR == Reader::kFp8E4M3 ? Fp8E4M3ToF32(code) : Fp8E5M2ToF32(code);
      const auto bits =
          static_cast<uint16_t>(std::isnan(x) ? 0x7FC0 : std::bit_cast<uint32_t>(x) >> 16);
      t.low[m] = static_cast<uint8_t>(bits & 0xFF);
      t.high[m] = static_cast<uint8_t>(bits >> 8);
    }
    return t;
  }();
  return kBytes;
}

// What Fp8WordsToBf16 and its callers keep in registers for one tile.
struct Fp8Lookup {
  __m512i low0, low1, high0, high1;  // the two 64-byte halves of each Fp8Bf16Bytes table
  __m512i twice;                     // vpermb index: code i of 32 into both bytes of word i
  __m512i pair[2];  // vpermt2b indexes of a key pair's codes into unpacklo/hi_epi16 order
};

template <Reader kR>
KVS_BF16_ATTR Fp8Lookup MakeFp8Lookup() {
  alignas(64) static constexpr auto kIndex = [] {
    std::array<std::array<uint8_t, 64>, 3> index{};
    for (int i = 0; i < 64; ++i) index[0][i] = static_cast<uint8_t>(i / 2);
    // Dword i of 128-bit lane L: element 8 L + i (low half) or 8 L + 4 + i (high half) of the
    // first row (bytes 0, 1) and of the second (bytes 2, 3), as the 16-bit unpacks of two BF16
    // chunks place them.
    for (int h = 0; h < 2; ++h) {
      for (int dword = 0; dword < 16; ++dword) {
        const int e = 8 * (dword / 4) + 4 * h + dword % 4;
        for (int b = 0; b < 4; ++b) {
          index[1 + h][4 * dword + b] = static_cast<uint8_t>(b < 2 ? e : 64 + e);
        }
      }
    }
    return index;
  }();
  const Fp8Bf16Bytes& bytes = Fp8Bf16BytesOf<kR>();
  const auto load = [](const void* p) { return _mm512_load_si512(p); };
  return {load(bytes.low),        load(bytes.low + 64),
          load(bytes.high),       load(bytes.high + 64),
          load(kIndex[0].data()), {load(kIndex[1].data()), load(kIndex[2].data())}};
}

// d holds an FP8 code in both bytes of each word: the BF16 of each (see the file comment).
KVS_BF16_ATTR HWY_INLINE __m512i Fp8WordsToBf16(__m512i d, const Fp8Lookup& t) {
  // High bytes from the high table (the low bytes keep the code), then the low bytes from the
  // low table, then the code's sign into bit 15: x | (d & 0x8000).
  const __m512i high = _mm512_mask2_permutex2var_epi8(t.high0, d, 0xAAAAAAAAAAAAAAAAull, t.high1);
  const __m512i x = _mm512_mask2_permutex2var_epi8(t.low0, high, 0x5555555555555555ull, t.low1);
  return _mm512_ternarylogic_epi32(x, d, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
}

// Elements [e, e + 32) of a row of reader kR as BF16, in element order.
template <Reader kR>
KVS_BF16_ATTR HWY_INLINE __m512bh LoadChunk(const std::byte* row, size_t e, const Fp8Lookup& t) {
  if constexpr (kR == Reader::kBF16) {
    return LoadBf16(row + e * sizeof(uint16_t));
  } else {
    const __m256i codes =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + sizeof(uint16_t) + e));
    return AsBf16(
        Fp8WordsToBf16(_mm512_permutexvar_epi8(t.twice, _mm512_castsi256_si512(codes)), t));
  }
}

// A BF16 chunk as F32 in the order of Bf16Slot: each BF16 is the high half of its F32, so a 16-bit
// unpack with zeros widens it exactly.
KVS_BF16_ATTR HWY_INLINE void WidenChunk(__m512bh chunk, __m512* lo, __m512* hi) {
  const __m512i zero = _mm512_setzero_si512();
  *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, (__m512i)chunk));
  *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, (__m512i)chunk));
}

// Scores of keys key0 .. key0 + 3 (rows of reader kR) against kNumQ query heads, written to
// s[j * s_stride + key0 + key]. The heads are q: [kNumQ, head_dim] BF16, or with kWiden qw:
// [kNumQ, head_dim] F32 in the order of Bf16Slot; the other is not read.
template <Reader kR, bool kWiden, int kNumQ>
KVS_BF16_ATTR HWY_INLINE void Bf16ScoreFourRows(const RowSet& keys, size_t key0, const uint16_t* q,
                                                const float* qw, size_t head_dim,
                                                const Fp8Lookup& lookup, float* s,
                                                size_t s_stride) {
  const DF df;
  __m512 acc[kNumQ][4];
  for (int j = 0; j < kNumQ; ++j) {
    for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_setzero_ps();
  }
  for (size_t e = 0; e < head_dim; e += kBf16Chunk) {
    __m512bh k[4];
    for (int key = 0; key < 4; ++key) k[key] = LoadChunk<kR>(keys.rows[key0 + key], e, lookup);
    if constexpr (kWiden) {
      __m512 lo[4], hi[4];
      for (int key = 0; key < 4; ++key) WidenChunk(k[key], &lo[key], &hi[key]);
      for (int j = 0; j < kNumQ; ++j) {
        const __m512 qlo = _mm512_loadu_ps(qw + j * head_dim + e);
        const __m512 qhi = _mm512_loadu_ps(qw + j * head_dim + e + 16);
        for (int key = 0; key < 4; ++key) {
          acc[j][key] = _mm512_fmadd_ps(qhi, hi[key], _mm512_fmadd_ps(qlo, lo[key], acc[j][key]));
        }
      }
    } else {
      for (int j = 0; j < kNumQ; ++j) {
        const __m512bh qv = LoadBf16(q + j * head_dim + e);
        for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_dpbf16_ps(acc[j][key], k[key], qv);
      }
    }
  }
  for (int j = 0; j < kNumQ; ++j) {
    SumOfLanes4(df, hn::Vec<DF>{acc[j][0]}, hn::Vec<DF>{acc[j][1]}, hn::Vec<DF>{acc[j][2]},
                hn::Vec<DF>{acc[j][3]}, s + j * s_stride + key0);
  }
  if constexpr (IsFp8Reader(kR)) {
    const __m128 scales = LoadRowScales(hn::FixedTag<float, 4>(), keys.rows + key0).raw;
    for (int j = 0; j < kNumQ; ++j) {
      float* sj = s + j * s_stride + key0;
      _mm_storeu_ps(sj, _mm_mul_ps(_mm_loadu_ps(sj), scales));
    }
  }
}

template <Reader kR, bool kWiden>
KVS_BF16_ATTR void Bf16ScoreTileOf(const RowSet& keys, const RowSet& values, size_t num_keys,
                                   const uint16_t* q, const float* qw, int group, size_t head_dim,
                                   float* s, size_t s_stride) {
  const Fp8Lookup lookup = IsFp8Reader(kR) ? MakeFp8Lookup<kR>() : Fp8Lookup{};
  for (size_t key = 0; key < num_keys; key += 4) {
    PrefetchAhead(keys, key, num_keys);
    PrefetchAhead(values, key, num_keys);
    // Heads by 4, 2, 1 (ForEachHeadStep's steps; a lambda would not carry KVS_BF16_ATTR).
    int j = 0;
    for (; j + 4 <= group; j += 4) {
      Bf16ScoreFourRows<kR, kWiden, 4>(keys, key, q + j * head_dim, qw + j * head_dim, head_dim,
                                       lookup, s + j * s_stride, s_stride);
    }
    for (; j + 2 <= group; j += 2) {
      Bf16ScoreFourRows<kR, kWiden, 2>(keys, key, q + j * head_dim, qw + j * head_dim, head_dim,
                                       lookup, s + j * s_stride, s_stride);
    }
    for (; j < group; ++j) {
      Bf16ScoreFourRows<kR, kWiden, 1>(keys, key, q + j * head_dim, qw + j * head_dim, head_dim,
                                       lookup, s + j * s_stride, s_stride);
    }
  }
}

template <Reader kR>
void Bf16ScoreTileIn(const Bf16Plan& plan, const RowSet& keys, const RowSet& values,
                     size_t num_keys, const uint16_t* q, const float* qw, int group,
                     size_t head_dim, float* s, size_t s_stride) {
  if (plan.widen) {
    return Bf16ScoreTileOf<kR, true>(keys, values, num_keys, q, qw, group, head_dim, s, s_stride);
  }
  Bf16ScoreTileOf<kR, false>(keys, values, num_keys, q, qw, group, head_dim, s, s_stride);
}

// Scores of a tile's keys (rows padded to a multiple of 4) for the `group` query heads:
//   q: [group, head_dim] FP16 with plan.half_keys (HalfPrepareQueries, its unscale in
//   half_unscale: [group]), else BF16 (Bf16PrepareQueries), read unless plan.widen;
//   qw: [group, head_dim] F32 (Bf16WidenQueries), read if plan.widen; s: [group, s_stride]
void Bf16ScoreTile(const Bf16Plan& plan, const RowSet& keys, const RowSet& values, size_t num_keys,
                   const uint16_t* q, const float* half_unscale, const float* qw, int group,
                   size_t head_dim, float* s, size_t s_stride) {
  if (plan.half_keys) {
    return HalfScoreTile(plan.key_reader, keys, values, num_keys, q, half_unscale, group, head_dim,
                         s, s_stride);
  }
  switch (plan.key_reader) {
    case Reader::kFp8E4M3:
      return Bf16ScoreTileIn<Reader::kFp8E4M3>(plan, keys, values, num_keys, q, qw, group, head_dim,
                                               s, s_stride);
    case Reader::kFp8E5M2:
      return Bf16ScoreTileIn<Reader::kFp8E5M2>(plan, keys, values, num_keys, q, qw, group, head_dim,
                                               s, s_stride);
    default:
      return Bf16ScoreTileIn<Reader::kBF16>(plan, keys, values, num_keys, q, qw, group, head_dim, s,
                                            s_stride);
  }
}

// state_j[e0, e0 + 32 kChunks) += the tile's weighted values (rows of reader kR), in the order of
// the file comment, for kNumQ query heads with weights w: [kNumQ][w_stride], one F32 per key
// (kWiden) or a BF16 pair (p_2i, p_2i+1) per dword; for FP8 rows each weight includes its row's
// scale. count: keys (kWiden) or pairs of keys.
template <Reader kR, bool kWiden, int kNumQ, int kChunks>
KVS_BF16_ATTR HWY_INLINE void Bf16AccumulateSlice(const RowSet& values, size_t count,
                                                  const uint32_t* w, size_t w_stride, size_t e0,
                                                  const Fp8Lookup& lookup, float* state,
                                                  size_t state_stride) {
  __m512 acc[kNumQ][kChunks][2];
  for (int j = 0; j < kNumQ; ++j) {
    for (int c = 0; c < kChunks; ++c) {
      for (int h = 0; h < 2; ++h) {
        acc[j][c][h] = _mm512_loadu_ps(state + j * state_stride + e0 + kBf16Chunk * c + 16 * h);
      }
    }
  }
  if constexpr (kWiden) {  // count keys, one F32 weight each
    const float* wf = reinterpret_cast<const float*>(w);
    for (size_t key = 0; key < count; ++key) {
      RequestStep(values);
      __m512 wv[kNumQ];
      for (int j = 0; j < kNumQ; ++j) wv[j] = _mm512_set1_ps(wf[j * w_stride + key]);
      for (int c = 0; c < kChunks; ++c) {
        __m512 lo, hi;
        WidenChunk(LoadChunk<kR>(values.rows[key], e0 + c * kBf16Chunk, lookup), &lo, &hi);
        for (int j = 0; j < kNumQ; ++j) {
          acc[j][c][0] = _mm512_fmadd_ps(lo, wv[j], acc[j][c][0]);
          acc[j][c][1] = _mm512_fmadd_ps(hi, wv[j], acc[j][c][1]);
        }
      }
    }
  } else {  // count pairs of keys, a BF16 weight pair each
    constexpr size_t kElementBytes = kR == Reader::kBF16 ? sizeof(uint16_t) : 1;
    const size_t offset = (kR == Reader::kBF16 ? 0 : sizeof(uint16_t)) + e0 * kElementBytes;
    for (size_t pair = 0; pair < count; ++pair) {
      RequestStep(values);
      const std::byte* first = values.rows[2 * pair] + offset;
      const std::byte* second = values.rows[2 * pair + 1] + offset;
      __m512bh wv[kNumQ];
      for (int j = 0; j < kNumQ; ++j) {
        const __m512i bits = _mm512_set1_epi32(static_cast<int>(w[j * w_stride + pair]));
        wv[j] = AsBf16(bits);
      }
      for (int c = 0; c < kChunks; ++c) {
        __m512i lo, hi;  // (v_t[e], v_t+1[e]) per dword, in the 16-bit unpacks' order
        if constexpr (kR == Reader::kBF16) {
          const __m512i a = _mm512_loadu_si512(first + c * kBf16Chunk * kElementBytes);
          const __m512i b = _mm512_loadu_si512(second + c * kBf16Chunk * kElementBytes);
          lo = _mm512_unpacklo_epi16(a, b);
          hi = _mm512_unpackhi_epi16(a, b);
        } else {
          const auto load = [&](const std::byte* row) {
            return _mm512_castsi256_si512(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kBf16Chunk)));
          };
          const __m512i a = load(first), b = load(second);
          lo = Fp8WordsToBf16(_mm512_permutex2var_epi8(a, lookup.pair[0], b), lookup);
          hi = Fp8WordsToBf16(_mm512_permutex2var_epi8(a, lookup.pair[1], b), lookup);
        }
        for (int j = 0; j < kNumQ; ++j) {
          acc[j][c][0] = _mm512_dpbf16_ps(acc[j][c][0], AsBf16(lo), wv[j]);
          acc[j][c][1] = _mm512_dpbf16_ps(acc[j][c][1], AsBf16(hi), wv[j]);
        }
      }
    }
  }
  for (int j = 0; j < kNumQ; ++j) {
    for (int c = 0; c < kChunks; ++c) {
      for (int h = 0; h < 2; ++h) {
        _mm512_storeu_ps(state + j * state_stride + e0 + kBf16Chunk * c + 16 * h, acc[j][c][h]);
      }
    }
  }
}

// Bf16AccumulateSlice for ForEachSlice: chunk `first` on, kChunks chunks.
template <Reader kR, bool kWiden, int kNumQ>
struct Bf16Slices {
  template <int kChunks>
  KVS_BF16_ATTR void operator()(size_t first) const {
    Bf16AccumulateSlice<kR, kWiden, kNumQ, kChunks>(values, count, w, w_stride, first * kBf16Chunk,
                                                    lookup, state, state_stride);
  }
  const RowSet& values;
  size_t count;
  const uint32_t* w;
  size_t w_stride;
  const Fp8Lookup& lookup;
  float* state;
  size_t state_stride;
};

// The same over all of head_dim: slices of as many chunks as keep 16 accumulators in registers,
// then the rest by ForEachSlice, so that each value row is passed over as few times as the
// registers allow.
template <Reader kR, bool kWiden, int kNumQ>
KVS_BF16_ATTR HWY_INLINE void Bf16AccumulateRows(const RowSet& values, size_t count,
                                                 const uint32_t* w, size_t w_stride,
                                                 size_t head_dim, const Fp8Lookup& lookup,
                                                 float* state, size_t state_stride) {
  ForEachSlice<8 / kNumQ>(
      head_dim / kBf16Chunk,
      Bf16Slices<kR, kWiden, kNumQ>{values, count, w, w_stride, lookup, state, state_stride});
}

template <Reader kR, bool kWiden>
KVS_BF16_ATTR void Bf16AccumulateTileOf(const RowSet& values, size_t num_keys, const float* p,
                                        size_t p_stride, int group, size_t head_dim, float* state,
                                        size_t state_stride) {
  const size_t num_keys16 = (num_keys + 15) / 16 * 16;
  // kWiden: one F32 weight per key; otherwise a BF16 pair per dword (each float of Scratch holds
  // one pair).
  const size_t w_stride = kWiden ? num_keys16 : num_keys16 / 2;
  float* wf = Scratch(kSlotBf16Weights, group * w_stride);
  uint32_t* w = reinterpret_cast<uint32_t*>(wf);
  for (size_t key = 0; key < num_keys16; key += 16) {
    const __m512 scale =
        IsFp8Reader(kR) ? LoadRowScales(DF(), values.rows + key).raw : _mm512_set1_ps(1.0f);
    for (int j = 0; j < group; ++j) {
      const __m512 pj = _mm512_loadu_ps(p + j * p_stride + key);
      const __m512 weight = IsFp8Reader(kR) ? _mm512_mul_ps(pj, scale) : pj;
      if constexpr (kWiden) {
        _mm512_storeu_ps(wf + j * w_stride + key, weight);
      } else {
        const __m256bh bf = _mm512_cvtneps_pbh(weight);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + j * w_stride + key / 2), (__m256i)bf);
      }
    }
  }
  const Fp8Lookup lookup = IsFp8Reader(kR) ? MakeFp8Lookup<kR>() : Fp8Lookup{};
  const size_t count = kWiden ? num_keys : (num_keys + 1) / 2;  // keys, or pairs of them
  int j = 0;  // heads by 4, 2, 1 (as Bf16ScoreTileOf)
  for (; j + 4 <= group; j += 4) {
    Bf16AccumulateRows<kR, kWiden, 4>(values, count, w + j * w_stride, w_stride, head_dim, lookup,
                                      state + j * state_stride, state_stride);
  }
  for (; j + 2 <= group; j += 2) {
    Bf16AccumulateRows<kR, kWiden, 2>(values, count, w + j * w_stride, w_stride, head_dim, lookup,
                                      state + j * state_stride, state_stride);
  }
  for (; j < group; ++j) {
    Bf16AccumulateRows<kR, kWiden, 1>(values, count, w + j * w_stride, w_stride, head_dim, lookup,
                                      state + j * state_stride, state_stride);
  }
}

template <Reader kR>
void Bf16AccumulateTileIn(const Bf16Plan& plan, const RowSet& values, size_t num_keys,
                          const float* p, size_t p_stride, int group, size_t head_dim, float* state,
                          size_t state_stride) {
  if (plan.widen) {
    return Bf16AccumulateTileOf<kR, true>(values, num_keys, p, p_stride, group, head_dim, state,
                                          state_stride);
  }
  Bf16AccumulateTileOf<kR, false>(values, num_keys, p, p_stride, group, head_dim, state,
                                  state_stride);
}

// Weighted sum of a tile's values (rows padded to a multiple of 16) into the running states of
// the `group` query heads, in the order of the file comment:
//   p: [group, p_stride] softmax weights, zero from num_keys to its multiple of 16
void Bf16AccumulateTile(const Bf16Plan& plan, const RowSet& values, size_t num_keys, const float* p,
                        size_t p_stride, int group, size_t head_dim, float* state,
                        size_t state_stride) {
  if (plan.half_values) {
    return HalfAccumulateTile(plan.value_reader, values, num_keys, p, p_stride, group, head_dim,
                              state, state_stride);
  }
  switch (plan.value_reader) {
    case Reader::kFp8E4M3:
      return Bf16AccumulateTileIn<Reader::kFp8E4M3>(plan, values, num_keys, p, p_stride, group,
                                                    head_dim, state, state_stride);
    case Reader::kFp8E5M2:
      return Bf16AccumulateTileIn<Reader::kFp8E5M2>(plan, values, num_keys, p, p_stride, group,
                                                    head_dim, state, state_stride);
    default:
      return Bf16AccumulateTileIn<Reader::kBF16>(plan, values, num_keys, p, p_stride, group,
                                                 head_dim, state, state_stride);
  }
}

// A task's `group` states [group, state_stride] from Bf16AccumulateTile's order back to element
// order, once per task (FP16 values are in element order already).
void Bf16OrderToElements(const Bf16Plan& plan, int group, size_t head_dim, float* state,
                         size_t state_stride) {
  if (!plan.values || plan.half_values) return;
  float row[kBf16MaxHeadDim];
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::memcpy(row, st, head_dim * sizeof(float));
    for (size_t e = 0; e < head_dim; ++e) st[e] = row[Bf16Slot(e)];
  }
}

#undef KVS_BF16_ATTR

#else  // not AVX3: the float readers everywhere

Bf16Plan PlanBf16(const SideSpec&, const SideSpec&, size_t, size_t, int) { return {}; }
void Bf16PrepareQueries(const float*, int, size_t, uint16_t*) {}
void Bf16WidenQueries(const float*, int, size_t, float*) {}
void Bf16ScoreTile(const Bf16Plan&, const RowSet&, const RowSet&, size_t, const uint16_t*,
                   const float*, const float*, int, size_t, float*, size_t) {}
void Bf16AccumulateTile(const Bf16Plan&, const RowSet&, size_t, const float*, size_t, int, size_t,
                        float*, size_t) {}
void Bf16OrderToElements(const Bf16Plan&, int, size_t, float*, size_t) {}

#endif  // HWY_TARGET == HWY_AVX3

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
