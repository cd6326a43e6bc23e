// Per-target decode readers for 4- and 2-bit integer keys and values and KIVI keys with AVX2
// (included by attention_decode.cc inside its foreach_target pass, after attention_vnni-inl.h;
// compiled only for the AVX2 target, which is what CPUs with AVX2 but without AVX-512 run: AMD
// Zen 1 to 3, Intel's client cores and Haswell to Broadwell servers).
//
// Why: the float readers convert every element to F32 and spend one FMA per query head on it.
// On an AMD EPYC (Zen 3) that made 4-bit caches slower than BF16 ones: end to end 51 tokens/s
// against BF16's 70 at 16k (docs/representation-speed.md, thirteenth round).
//
// Keys: the VNNI readers' design (attention_vnni-inl.h), with their plan and their quantised
// queries (VnniPlan, VnniQuery): 8 keys are transposed so that each i32 lane holds one key, and
// the 4 query bytes that match a column of 4 code bytes are a broadcast operand. AVX2 has no
// vpdpbusd: vpmaddubsw multiplies the u8 codes by the s8 query bytes and adds pairs into s16
// lanes, at most 2 * 15 * 127 = 3810 for 4-bit codes, so a 32-element block's 8 of them add up
// in s16 (at most 30480 < 32767) before one vpmaddwd by ones widens the sums to i32 per key.
// The query is quantised as for VNNI (step max|q| / 127 per block of 32 elements, 16 for
// 16-element groups; the minimum terms use the exact query sums); KIVI keys fold each unit's
// scales into it, as for VNNI.
//
// Values: int16 weights by vpmaddwd over pairs of keys (MaddAccumulateTile).
//
// int8 rows: their codes would reach 255 once made unsigned and saturate vpmaddubsw, so keys are
// read row by row as the float readers read them, sign-extended to words against the query in
// int16 (one step per head: 16 bits against the codes' 8) by vpmaddwd, summed in i32
// (MaddScoreTileInt8); values take the int16 weights as 4-bit ones do, on sign-extended codes.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "run/attention_kernels.h"

#if defined(KVSTACK_RUN_ATTENTION_MADD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_MADD_INL_H_
#undef KVSTACK_RUN_ATTENTION_MADD_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_MADD_INL_H_
#endif

#include "hwy/highway.h"
#include "run/attention_readers-inl.h"
#include "run/attention_vnni-inl.h"

#if HWY_TARGET == HWY_AVX2
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

#if HWY_TARGET == HWY_AVX2

// Keys per step: one per i32 lane.
constexpr size_t kMaddKeys = 8;

// The largest lane of v, and the sum of its lanes.
HWY_INLINE float MaxLane(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
HWY_INLINE float SumLanes(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// The largest |x[e]| of x[0, n), n a multiple of 8.
HWY_INLINE float MaxAbs8(const float* x, size_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 max_abs = _mm256_setzero_ps();
  for (size_t e = 0; e < n; e += 8) {
    max_abs = _mm256_max_ps(max_abs, _mm256_and_ps(_mm256_loadu_ps(x + e), abs_mask));
  }
  return MaxLane(max_abs);
}

// x rounded to the nearest integer (the default rounding mode), clamped to [-127, 127].
HWY_INLINE __m256i RoundToQueryCode(__m256 x) {
  const __m256i limit = _mm256_set1_epi32(127);
  return _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(x), limit),
                          _mm256_sub_epi32(_mm256_setzero_si256(), limit));
}

// The plan for 4- and 2-bit integer-group keys and KIVI keys (not ok for anything else, or where
// the dot product readers are switched off for a test). lanes: the float vector's.
VnniPlan PlanMaddKeys(const SideSpec& side, size_t head_dim, size_t lanes) {
  if (lanes != kMaddKeys || DotProductReadersDisabledForTest()) return {};
  VnniPlan plan = IntegerPlanShape(side, head_dim);
  return plan;
}

// The query codes[0, head_dim) (int32, within [-127, 127]) as bytes in [column][part][byte]
// order (VnniQuery::hi): element e is byte e / parts % 4 of column e / parts / 4, part e % parts.
// That order repeats every 8 bytes at 4 bits (dest 4 r + byte = source 2 byte + r) and every 16
// at 2 bits (dest 4 r + byte = source 4 byte + r): one byte shuffle per 32 codes once packed.
HWY_INLINE void StoreQueryColumns(const int32_t* codes, int head_dim, int parts, int8_t* hi) {
  alignas(32) static constexpr auto kShuffles = [] {
    std::array<std::array<uint8_t, 32>, 2> t{};  // [parts == 4]
    for (int i = 0; i < 32; ++i) {
      const int r2 = i % 8 / 4, byte2 = i % 4;  // 2 parts per byte: 8-byte pattern
      t[0][i] = static_cast<uint8_t>(i % 16 / 8 * 8 + 2 * byte2 + r2);
      const int r4 = i % 16 / 4, byte4 = i % 4;  // 4 parts: 16-byte pattern
      t[1][i] = static_cast<uint8_t>(4 * byte4 + r4);
    }
    return t;
  }();
  const __m256i shuffle =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(kShuffles[parts == 4].data()));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int e = 0; e < head_dim; e += 32) {
    const auto load = [&](int i) {
      return _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + e + 8 * i));
    };
    // Dwords of the packs: [v0 0-3, v1 0-3, v2 0-3, v3 0-3 | v0 4-7, ...], then into order.
    const __m256i packed =
        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(load(0), load(1)),
                                                       _mm256_packs_epi32(load(2), load(3))),
                                    order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + e), _mm256_shuffle_epi8(packed, shuffle));
  }
}

// Quantises the `group` query heads q: [group, head_dim] (scaled, rotated) for `plan`, as
// VnniPrepareQueries does (its hi bytes alone: keys of 4 and 2 bits).
void MaddPrepareQueries(const VnniPlan& plan, const float* q, int group, VnniQuery* out) {
  const int head_dim = static_cast<int>(plan.head_dim);
  if (plan.bits == 8) {  // int16 words, one step per head
    for (int j = 0; j < group; ++j) {
      const float* qj = q + static_cast<size_t>(j) * head_dim;
      const float m = MaxAbs8(qj, head_dim);
      const __m256 inv = _mm256_set1_ps(m > 0.0f ? 32767.0f / m : 0.0f);
      for (int e = 0; e < head_dim; e += 16) {
        const auto code = [&](int i) {  // within +-32767 (m is the largest |q|)
          return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qj + e + i), inv));
        };
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[j].words + e),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(code(0), code(8)), 0xD8));
      }
      out[j].block_scale[0] = m / 32767.0f;
    }
    return;
  }
  const int block = plan.block_elems, parts = 8 / plan.bits;
  for (int j = 0; j < group; ++j) {
    const float* qj = q + static_cast<size_t>(j) * head_dim;
    VnniQuery& vq = out[j];
    alignas(32) int32_t codes[kVnniMaxHeadDim];
    for (int b0 = 0; b0 < head_dim; b0 += block) {
      const float m = MaxAbs8(qj + b0, block);
      const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
      for (int e = b0; e < b0 + block; e += 8) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + e),
                           RoundToQueryCode(_mm256_mul_ps(_mm256_loadu_ps(qj + e), inv)));
      }
      vq.block_scale[b0 / block] = m / 127.0f / 256.0f;
    }
    StoreQueryColumns(codes, head_dim, parts, reinterpret_cast<int8_t*>(vq.hi));
    for (int g = 0; g < plan.num_groups; ++g) {
      __m256 sum = _mm256_setzero_ps();
      for (int e = g * plan.group_elems; e < (g + 1) * plan.group_elems; e += 8) {
        sum = _mm256_add_ps(sum, _mm256_loadu_ps(qj + e));
      }
      vq.group_sum[g] = SumLanes(sum);
    }
  }
}

// Dwords [offset / 4, offset / 4 + n) (n <= 8) of 8 rows, row k in lanes k: the first n
// dwords of each row read (masked loads past them: a row may end at a page's end).
// cols[c] = dword c of rows 0..7.
HWY_INLINE void LoadColumnChunk(const std::byte* const* rows, size_t offset, int n, __m256i* cols) {
  if (n <= 4) {  // rows k and k + 4 share a vector; a 4x4 transpose within the 128-bit lanes
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3));
    __m256i a[4];
    for (int k = 0; k < 4; ++k) {
      const auto row = [&](int r) {
        const auto* p = reinterpret_cast<const int*>(rows[r] + offset);
        return n == 4 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                      : _mm_maskload_epi32(p, mask);
      };
      a[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(row(k)), row(k + 4), 1);
    }
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    cols[0] = _mm256_unpacklo_epi64(t0, t2);
    cols[1] = _mm256_unpackhi_epi64(t0, t2);
    cols[2] = _mm256_unpacklo_epi64(t1, t3);
    cols[3] = _mm256_unpackhi_epi64(t1, t3);
    return;
  }
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i r[8];
  for (int k = 0; k < 8; ++k) {
    const auto* p = reinterpret_cast<const int*>(rows[k] + offset);
    r[k] = n == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                  : _mm256_maskload_epi32(p, mask);
  }
  // An 8x8 dword transpose: pairs, then quads within the 128-bit lanes, then the lanes.
  __m256i t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);      // dwords 0 and 4 of rows k..k+3
    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);  // 1 and 5
    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    cols[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    cols[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

// Dwords [0, num_dwords) from `offset` of the 8 rows, dword c of every row in cols[c].
HWY_INLINE void LoadColumns8(const std::byte* const* rows, size_t offset, int num_dwords,
                             __m256i* cols) {
  for (int c0 = 0; c0 < num_dwords; c0 += 8) {
    LoadColumnChunk(rows, offset + 4 * static_cast<size_t>(c0), std::min(8, num_dwords - c0),
                    cols + c0);
  }
}

// The f16 halves of the dwords of x as floats: the low halves, and the high ones in *high.
HWY_INLINE __m256 SplitHalves(__m256i x, __m256* high) {
  // [low 0..3, high 0..3 | low 4..7, high 4..7], then the 64-bit quarters into order.
  const __m256i packed = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(x, 16)),
      0xD8);
  *high = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

// Where 8 keys of a -t16 tile lie: the tile (TileOf) and which 32-byte half of its 64-byte
// columns (a header pair or code word per key) is theirs.
struct TileHalf {
  const std::byte* tile = nullptr;
  size_t half = 0;
};

// TileHalf of the 8 keys from key0 (a multiple of 8): TileOf for the 16 keys from key0 rounded
// down to a multiple of 16, or for the second half that of `last`, the first half's (TileOf's
// copy is valid until its next call).
HWY_INLINE TileHalf TileOf8(const VnniPlan& plan, const RowSet& set, size_t key0, bool codes,
                            const TileHalf& last) {
  if (key0 % 16 == 8 && last.tile != nullptr) return {last.tile, 1};
  return {TileOf(plan, set, key0 - key0 % 16, codes), key0 % 16 / 8};
}

// The (scale, min) of every group of 8 keys of a -t16 tile as vectors over the keys.
HWY_INLINE void LoadTileScales8(const VnniPlan& plan, const TileHalf& at, __m256* scale,
                                __m256* min) {
  for (int g = 0; g < plan.num_groups; ++g) {
    const std::byte* pairs = at.tile + 64 * g + 32 * at.half;
    scale[g] = SplitHalves(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)), &min[g]);
  }
}

// The (scale, min) of every group of the 8 keys from key0, as vectors over the keys (int8 rows:
// their f16 scale, min 0).
HWY_INLINE void LoadGroupScales8(const VnniPlan& plan, const RowSet& keys, size_t key0,
                                 __m256* scale, __m256* min) {
  if (plan.bits == 8) {
    scale[0] = LoadRowScales(hn::CappedTag<float, 8>(), keys.hdrs + key0).raw;
    min[0] = _mm256_setzero_ps();
    return;
  }
  const int header_dwords = plan.absmax ? (plan.num_groups + 1) / 2 : plan.num_groups;
  __m256i cols[16];
  LoadColumns8(keys.hdrs + key0, 0, header_dwords, cols);
  for (int c = 0; c < header_dwords; ++c) {
    __m256 high;
    const __m256 low = SplitHalves(cols[c], &high);
    if (plan.absmax) {  // d of groups 2c and 2c + 1: (scale, min) = (d, -8 d)
      scale[2 * c] = low;
      min[2 * c] = _mm256_mul_ps(low, _mm256_set1_ps(-8.0f));
      if (2 * c + 1 < plan.num_groups) {
        scale[2 * c + 1] = high;
        min[2 * c + 1] = _mm256_mul_ps(high, _mm256_set1_ps(-8.0f));
      }
    } else {  // (scale, min) of group c
      scale[c] = low;
      min[c] = high;
    }
  }
}

// Scores of 8 keys (their code columns in cols) against kNumQ query heads, to s[j * s_stride].
template <int kBits, int kNumQ, int kBlockElems>
HWY_INLINE void MaddScoreColumns(const VnniPlan& plan, const __m256i* cols, const __m256* scale,
                                 const __m256* min, const VnniQuery* q, float* s, size_t s_stride) {
  constexpr int kParts = 8 / kBits;
  constexpr int kColsPerBlock = kBlockElems * kBits / 32;
  const int num_blocks = static_cast<int>(plan.head_dim) / kBlockElems;
  const int blocks_per_group = plan.group_elems / kBlockElems;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << kBits) - 1));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 total[kNumQ];
  for (int j = 0; j < kNumQ; ++j) total[j] = _mm256_setzero_ps();
  // Groups, then their blocks: no division per block.
  for (int g = 0, b = 0; b < num_blocks; ++g) {
    // hi alone: its step is 256 block_scale.
    const __m256 scale256 = _mm256_mul_ps(scale[g], _mm256_set1_ps(256.0f));
    for (const int group_end = b + blocks_per_group; b < group_end; ++b) {
      __m256i sums[kNumQ];  // s16: at most 8 products of pairs, below 2^15 (file comment)
      for (int j = 0; j < kNumQ; ++j) sums[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = b * kColsPerBlock; c < (b + 1) * kColsPerBlock; ++c) {
#pragma GCC unroll 4
        for (int r = 0; r < kParts; ++r) {
          const __m256i u =
              _mm256_and_si256(r == 0 ? cols[c] : _mm256_srli_epi32(cols[c], r * kBits), mask);
          for (int j = 0; j < kNumQ; ++j) {
            const __m256i query = _mm256_set1_epi32(q[j].hi[c * kParts + r]);
            sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(u, query));
          }
        }
      }
      for (int j = 0; j < kNumQ; ++j) {
        total[j] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[j], ones)),
            _mm256_mul_ps(scale256, _mm256_broadcast_ss(&q[j].block_scale[b])), total[j]);
      }
    }
    for (int j = 0; j < kNumQ; ++j) {  // the group's minimum term
      total[j] = _mm256_fmadd_ps(min[g], _mm256_broadcast_ss(&q[j].group_sum[g]), total[j]);
    }
  }
  for (int j = 0; j < kNumQ; ++j) _mm256_storeu_ps(s + j * s_stride, total[j]);
}

template <int kBits, int kBlockElems>
void MaddScoreTileBits(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                       size_t num_keys, const VnniQuery* q, int group, float* s, size_t s_stride) {
  const int code_dwords = static_cast<int>(plan.head_dim) * kBits / 32;
  TileHalf at;  // -t16 tiles: where the last 8 keys lie
  for (size_t key0 = 0; key0 < num_keys; key0 += kMaddKeys) {
    for (size_t k = key0; k < key0 + kMaddKeys; k += 4) {
      PrefetchAhead(keys, k, num_keys);
      PrefetchAhead(values, k, num_keys);
    }
    __m256 scale[16], min[16];
    __m256i cols[kVnniMaxHeadDim / 8];  // 4-bit codes: 8 elements per dword
    if (plan.tiled) {  // plain loads of 32 bytes of the tile's columns, no transposes
      at = TileOf8(plan, keys, key0, true, at);
      LoadTileScales8(plan, at, scale, min);
      const std::byte* codes = at.tile + plan.tile.code_offset + 32 * at.half;
      for (int c = 0; c < code_dwords; ++c) {
        cols[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * c));
      }
    } else {
      LoadGroupScales8(plan, keys, key0, scale, min);
      LoadColumns8(keys.rows + key0, 0, code_dwords, cols);
    }
    float* out = s + key0;
    int j = 0;
    for (; j + 4 <= group; j += 4) {
      MaddScoreColumns<kBits, 4, kBlockElems>(plan, cols, scale, min, q + j, out + j * s_stride,
                                              s_stride);
    }
    for (; j + 2 <= group; j += 2) {
      MaddScoreColumns<kBits, 2, kBlockElems>(plan, cols, scale, min, q + j, out + j * s_stride,
                                              s_stride);
    }
    for (; j < group; ++j) {
      MaddScoreColumns<kBits, 1, kBlockElems>(plan, cols, scale, min, q + j, out + j * s_stride,
                                              s_stride);
    }
  }
}

// KIVI: the `group` query heads q: [group, head_dim] (scaled, rotated) into `out` (KiviQueries:
// q per block of 32 times 127 / its largest |q|, and those largest). Once per task.
void MaddKiviPrepareQueries(const VnniPlan& plan, const float* q, int group, KiviQueries* out) {
  const size_t head_dim = plan.head_dim;
  out->q = q;
  out->qhat.resize(group * head_dim);
  out->qmax.resize(group * head_dim / 32);
  for (size_t e = 0; e < group * head_dim; e += 32) {
    const float m = MaxAbs8(q + e, 32);
    out->qmax[e / 32] = m;
    const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    for (size_t i = e; i < e + 32; i += 8) {
      _mm256_storeu_ps(&out->qhat[i], _mm256_mul_ps(_mm256_loadu_ps(q + i), inv));
    }
  }
}

// KIVI: the query heads folded with one unit's per-channel (scale, min) pairs and quantised per
// block of 32 channels, as VnniPrepareKiviUnit: out[j] for q_j * scale (step max|q_j| x
// max|scale| / 127 per block: codes qhat * scale / max|scale|), bias[j] = q_j . min.
void MaddPrepareKiviUnit(const VnniPlan& plan, const std::byte* unit, const KiviQueries& queries,
                         int group, VnniQuery* out, float* bias) {
  const int head_dim = static_cast<int>(plan.head_dim), parts = 8 / plan.bits;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 ratio[kVnniMaxHeadDim / 8], min[kVnniMaxHeadDim / 8];
  float scale_max[kVnniMaxHeadDim / 32];
  for (int v = 0; v < head_dim / 8; ++v) {
    ratio[v] = SplitHalves(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit) + v), &min[v]);
  }
  for (int b = 0; b < head_dim / 32; ++b) {
    __m256 max_abs = _mm256_setzero_ps();
    for (int v = 4 * b; v < 4 * b + 4; ++v) {
      max_abs = _mm256_max_ps(max_abs, _mm256_and_ps(ratio[v], abs_mask));
    }
    scale_max[b] = MaxLane(max_abs);
    const __m256 inv = _mm256_set1_ps(scale_max[b] > 0.0f ? 1.0f / scale_max[b] : 0.0f);
    for (int v = 4 * b; v < 4 * b + 4; ++v) ratio[v] = _mm256_mul_ps(ratio[v], inv);
  }
  for (int j = 0; j < group; ++j) {
    const float* qj = queries.q + static_cast<size_t>(j) * head_dim;
    const float* qhat = queries.qhat.data() + static_cast<size_t>(j) * head_dim;
    VnniQuery& vq = out[j];
    __m256 sum = _mm256_setzero_ps();
    alignas(32) int32_t codes[kVnniMaxHeadDim];
    for (int v = 0; v < head_dim / 8; ++v) {
      sum = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8 * v), min[v], sum);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * v),
                         RoundToQueryCode(_mm256_mul_ps(_mm256_loadu_ps(qhat + 8 * v), ratio[v])));
    }
    bias[j] = SumLanes(sum);
    for (int b = 0; b < head_dim / 32; ++b) {
      vq.block_scale[b] =
          queries.qmax[static_cast<size_t>(j) * head_dim / 32 + b] * scale_max[b] / 127.0f / 256.0f;
    }
    StoreQueryColumns(codes, head_dim, parts, reinterpret_cast<int8_t*>(vq.hi));
    vq.group_sum[0] = 0.0f;  // (the unit's bias holds q . min)
  }
}

// KIVI keys: a unit's key is codes * scale_c + min_c per channel c, so q . k = (q * scale) .
// codes + q . min, with q * scale quantised per unit (MaddPrepareKiviUnit); runs of 8 keys that
// share a unit are scored with it.
template <int kBits>
void MaddScoreTileKivi(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                       size_t num_keys, const KiviQueries& queries, int group, float* s,
                       size_t s_stride) {
  const int code_dwords = static_cast<int>(plan.head_dim) * kBits / 32;
  thread_local std::vector<VnniQuery> unit_queries;
  thread_local std::vector<float> bias;  // [group] q . min of the unit
  unit_queries.resize(group);
  bias.resize(group);
  const std::byte* prepared_unit = nullptr;
  const __m256 scale[1] = {_mm256_set1_ps(1.0f)}, min[1] = {_mm256_setzero_ps()};
  alignas(32) float block_scores[4 * kMaddKeys];
  for (size_t key0 = 0; key0 < num_keys; key0 += kMaddKeys) {
    for (size_t k = key0; k < key0 + kMaddKeys; k += 4) {
      PrefetchAhead(keys, k, num_keys);
      PrefetchAhead(values, k, num_keys);
    }
    __m256i cols[kVnniMaxHeadDim / 8];
    LoadColumns8(keys.rows + key0, 0, code_dwords, cols);
    for (size_t k = key0; k < key0 + kMaddKeys;) {
      const std::byte* unit = keys.hdrs[k];
      size_t run_end = k + 1;
      while (run_end < key0 + kMaddKeys && keys.hdrs[run_end] == unit) ++run_end;
      if (unit != prepared_unit) {
        MaddPrepareKiviUnit(plan, unit, queries, group, unit_queries.data(), bias.data());
        prepared_unit = unit;
      }
      for (int j = 0; j < group;) {
        const int step = group - j >= 4 ? 4 : group - j >= 2 ? 2 : 1;
        if (step == 4) {
          MaddScoreColumns<kBits, 4, 32>(plan, cols, scale, min, &unit_queries[j], block_scores,
                                         kMaddKeys);
        } else if (step == 2) {
          MaddScoreColumns<kBits, 2, 32>(plan, cols, scale, min, &unit_queries[j], block_scores,
                                         kMaddKeys);
        } else {
          MaddScoreColumns<kBits, 1, 32>(plan, cols, scale, min, &unit_queries[j], block_scores,
                                         kMaddKeys);
        }
        for (int jj = 0; jj < step; ++jj) {
          for (size_t key = k; key < run_end; ++key) {
            s[(j + jj) * s_stride + key] = block_scores[jj * kMaddKeys + key - key0] + bias[j + jj];
          }
        }
        j += step;
      }
      k = run_end;
    }
  }
}

// The i32 lane sums of a, b, c, e, in that order.
HWY_INLINE __m128i SumLanes4(__m256i a, __m256i b, __m256i c, __m256i e) {
  // [a01 a23 b01 b23 | a45 a67 b45 b67], the same for c, e, then [a b c e | the upper lanes'].
  const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, e));
  return _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
}

// int8 keys: scores of kKeys rows from key0 against kNumQ query heads, in the query's steps
// (the rows' scales are applied per tile). Per 16 elements each row's codes are sign-extended
// to words once, and vpmaddwd multiplies them by each head's int16 query and adds pairs into
// i32 lanes: at most head_dim / 16 * 2 * 128 * 32767 < 2^31 at head_dim 256.
template <int kNumQ, int kKeys>
HWY_INLINE void MaddScoreInt8Rows(const VnniPlan& plan, const RowSet& keys, size_t key0,
                                  const VnniQuery* q, float* s, size_t s_stride) {
  static_assert(kKeys == 4 || (kKeys == 2 && kNumQ % 2 == 0), "sums are taken four at a time");
  __m256i acc[kNumQ][kKeys];
  for (int j = 0; j < kNumQ; ++j) {
    for (int key = 0; key < kKeys; ++key) acc[j][key] = _mm256_setzero_si256();
  }
  const std::byte* rows[kKeys];
  for (int key = 0; key < kKeys; ++key) rows[key] = keys.rows[key0 + key] + plan.code_offset;
  for (size_t e = 0; e < plan.head_dim; e += 16) {
    __m256i k[kKeys];
    for (int key = 0; key < kKeys; ++key) {
      k[key] =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[key] + e)));
    }
    for (int j = 0; j < kNumQ; ++j) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[j].words + e));
      for (int key = 0; key < kKeys; ++key) {
        acc[j][key] = _mm256_add_epi32(acc[j][key], _mm256_madd_epi16(k[key], qv));
      }
    }
  }
  if constexpr (kKeys == 4) {
    for (int j = 0; j < kNumQ; ++j) {
      const __m128 sums = _mm_cvtepi32_ps(SumLanes4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
      _mm_storeu_ps(s + j * s_stride, _mm_mul_ps(sums, _mm_set1_ps(q[j].block_scale[0])));
    }
  } else {  // two heads' pairs of keys per four sums
    for (int j = 0; j < kNumQ; j += 2) {
      const __m128 sums =
          _mm_cvtepi32_ps(SumLanes4(acc[j][0], acc[j][1], acc[j + 1][0], acc[j + 1][1]));
      alignas(16) float scaled[4];
      _mm_store_ps(scaled,
                   _mm_mul_ps(sums, _mm_setr_ps(q[j].block_scale[0], q[j].block_scale[0],
                                                q[j + 1].block_scale[0], q[j + 1].block_scale[0])));
      std::memcpy(s + j * s_stride, scaled, 2 * sizeof(float));
      std::memcpy(s + (j + 1) * s_stride, scaled + 2, 2 * sizeof(float));
    }
  }
}

void MaddScoreTileInt8(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                       size_t num_keys, const VnniQuery* q, int group, float* s, size_t s_stride) {
  for (size_t key0 = 0; key0 < num_keys; key0 += 4) {
    PrefetchAhead(keys, key0, num_keys);
    PrefetchAhead(values, key0, num_keys);
    float* out = s + key0;
    int j = 0;
    for (; j + 4 <= group; j += 4) {  // 4 heads x 2 keys: 8 accumulators of the 16 registers
      MaddScoreInt8Rows<4, 2>(plan, keys, key0, q + j, out + j * s_stride, s_stride);
      MaddScoreInt8Rows<4, 2>(plan, keys, key0 + 2, q + j, out + j * s_stride + 2, s_stride);
    }
    for (; j + 2 <= group; j += 2) {
      MaddScoreInt8Rows<2, 4>(plan, keys, key0, q + j, out + j * s_stride, s_stride);
    }
    for (; j < group; ++j) {
      MaddScoreInt8Rows<1, 4>(plan, keys, key0, q + j, out + j * s_stride, s_stride);
    }
  }
  ScaleScoresByRows<Reader::kInt8>(keys, num_keys, group, s, s_stride);
}

// Scores of a tile's keys (rows padded to a multiple of 16) for the `group` query heads:
// s: [group, s_stride], as ScoreTile; q from MaddPrepareQueries.
void MaddScoreTile(const VnniPlan& plan, const RowSet& keys, const RowSet& values, size_t num_keys,
                   const VnniQuery* q, const KiviQueries& kivi, int group, float* s,
                   size_t s_stride) {
  if (plan.kivi) {
    return plan.bits == 4
               ? MaddScoreTileKivi<4>(plan, keys, values, num_keys, kivi, group, s, s_stride)
               : MaddScoreTileKivi<2>(plan, keys, values, num_keys, kivi, group, s, s_stride);
  }
  if (plan.bits == 8) return MaddScoreTileInt8(plan, keys, values, num_keys, q, group, s, s_stride);
  const bool block32 = plan.block_elems == 32;
  if (plan.bits == 4) {
    return block32 ? MaddScoreTileBits<4, 32>(plan, keys, values, num_keys, q, group, s, s_stride)
                   : MaddScoreTileBits<4, 16>(plan, keys, values, num_keys, q, group, s, s_stride);
  }
  return block32 ? MaddScoreTileBits<2, 32>(plan, keys, values, num_keys, q, group, s, s_stride)
                 : MaddScoreTileBits<2, 16>(plan, keys, values, num_keys, q, group, s, s_stride);
}

// ---------------------------------------------------------------------------------------------
// Values of 4 and 2 bits in groups of a multiple of 32 elements: acc_j[e] += sum over keys t of
// p_j[t] * (scale_g[t] * code_t[e] + min_g[t]). As for VNNI (VnniAccumulateTile): per tile, head
// j and group g the weights p_j[t] * scale_g[t] are rounded to int16 against a bound on their
// largest, W = max p_j * max |scale_g| / 32767 (each off by at most W / 2), and the minima go in
// as sum_t p_j[t] * min_g[t] per group, in floats. vpmaddwd adds w_t0 * code_t0[e] + w_t1 *
// code_t1[e] for a pair of keys into i32 lane e.
//
// Order: the code bytes of a slice of 32 elements of a key pair (16 bytes at 4 bits, 8 at 2) are
// widened to words and interleaved, word pairs (key t0, key t1) per dword, in four vectors of 8
// elements (MaddValueElement). A task's state holds its elements in that order and goes back to
// element order once at its end (MaddValueOrderToElements).

// The element that state slot `slot` of a value row of `bits` holds: slot 32 s + 8 k + l is, at
// 4 bits, part k % 2 (the low or high nibble) of byte 4 (k / 2) + (l < 4 ? l : l + 4) of slice
// s (16 bytes); at 2 bits, part k of byte l of slice s (8 bytes); at 8 bits, byte
// 16 (k / 2) + 4 (k % 2) + (l < 4 ? l : l + 4) of slice s (32 bytes).
constexpr int MaddValueElement(int slot, int bits) {
  const int slice = slot / 32, k = slot % 32 / 8, l = slot % 8;
  if (bits == 8) return 32 * slice + 16 * (k / 2) + 4 * (k % 2) + (l < 4 ? l : l + 4);
  if (bits == 2) return 4 * (8 * slice + l) + k;
  const int byte = 16 * slice + 4 * (k / 2) + (l < 4 ? l : l + 4);
  return 2 * byte + k % 2;
}

// The plan for int8 and 4- and 2-bit integer-group values (not ok for anything else, or where
// the dot product readers are switched off for a test). lanes: the float vector's.
VnniPlan PlanMaddValues(const SideSpec& side, size_t head_dim, size_t lanes) {
  VnniPlan plan = PlanMaddKeys(side, head_dim, lanes);
  if (plan.kivi || plan.group_elems % 32 != 0) plan.ok = false;  // a slice within one group
  if (side.tiled) plan.ok = false;  // -t16 values' quads: the VNNI readers' (rows copied out here)
  return plan;
}

// The int16 weights of a tile (QuantiseWeights' for VNNI, 8 keys at a time): weights
// [group][num_groups][num_keys8 / 2] (dword u: keys 2u and 2u + 1), their steps w_scale and the
// minima's sums min_sum [group][num_groups]. p: [group, p_stride], 0 from num_keys to num_keys8;
// stats: p's (TileWeightStats).
void MaddQuantiseWeights(const VnniPlan& plan, const RowSet& values, size_t num_keys8,
                         const float* p, size_t p_stride, const TileWeightStats& stats, int group,
                         int32_t* weights, float* w_scale, float* min_sum) {
  const int num_groups = plan.num_groups;
  const size_t num_pairs = num_keys8 / 2;
  // Per group, the keys' scales and minima: [num_groups][num_keys8].
  float* hs = Scratch(kSlotHeaders, 2 * static_cast<size_t>(num_groups) * num_keys8);
  float* hm = hs + static_cast<size_t>(num_groups) * num_keys8;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 scale_max[16];
  for (int g = 0; g < num_groups; ++g) scale_max[g] = _mm256_setzero_ps();
  for (size_t key0 = 0; key0 < num_keys8; key0 += kMaddKeys) {
    __m256 scale[16], min[16];
    LoadGroupScales8(plan, values, key0, scale, min);
    for (int g = 0; g < num_groups; ++g) {
      _mm256_storeu_ps(hs + g * num_keys8 + key0, scale[g]);
      _mm256_storeu_ps(hm + g * num_keys8 + key0, min[g]);
      scale_max[g] = _mm256_max_ps(scale_max[g], _mm256_and_ps(scale[g], abs_mask));
    }
  }
  float s_factor[16], s_max[16];
  for (int g = 0; g < num_groups; ++g) {
    s_max[g] = MaxLane(scale_max[g]);
    s_factor[g] = s_max[g] > 0.0f ? 1.0f / s_max[g] : 0.0f;
  }
  for (int j = 0; j < group; ++j) {
    const float* pj = p + j * p_stride;
    const float largest = stats.max[j];
    const float p_factor = largest > 0.0f ? 32767.0f / largest : 0.0f;
    for (int g = 0; g < num_groups; ++g) {
      const size_t row = static_cast<size_t>(j) * num_groups + g;
      w_scale[row] = largest * s_max[g] / 32767.0f;
      const __m256 factor = _mm256_set1_ps(p_factor * s_factor[g]);
      __m256 sum = _mm256_setzero_ps();
      for (size_t k = 0; k < num_keys8; k += kMaddKeys) {
        const __m256 pk = _mm256_loadu_ps(pj + k);
        sum = _mm256_fmadd_ps(pk, _mm256_loadu_ps(hm + g * num_keys8 + k), sum);
        const __m256i w = _mm256_cvtps_epi32(
            _mm256_mul_ps(_mm256_mul_ps(pk, factor), _mm256_loadu_ps(hs + g * num_keys8 + k)));
        // Saturated to int16 (rounding can reach 32767.5), keys in order in the low 128 bits.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(w, w), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(weights + row * num_pairs + k / 2),
                         _mm256_castsi256_si128(packed));
      }
      min_sum[row] = SumLanes(sum);
    }
  }
}

// The i32 sums of one 32-element slice over the tile's key pairs for kNumQ heads, by
// MaddValueElement's vectors k: acc[j * 4 + k] for the code bytes shifted right by the bits of
// the parts before part k within its byte (4 bits: k % 2 parts; 2 bits: k), which are the parts'
// cumulative values, from which MaddAccumulateTile takes each part's own sums. (No masks: four
// ANDs fewer per pair, and the mask's register. At most 256 keys: 32767 * 255 * 256 < 2^31.)
// int8: the 32 codes sign-extended, bytes 0-3 | 8-11, 4-7 | 12-15, then the same from byte 16.
// weights[j]: head j's pairs for the slice's group.
template <int kBits, int kNumQ>
HWY_INLINE void MaddAccumulateSlice(const RowSet& values, size_t num_pairs, size_t offset,
                                    const int32_t* const* weights, __m256i* acc) {
  static_assert(32767LL * 255 * kDecodeTile <= INT32_MAX, "the i32 sums of a tile overflow");
  __m256i sums[4 * kNumQ];  // local, so that they stay in registers through the loop
  for (int i = 0; i < 4 * kNumQ; ++i) sums[i] = _mm256_setzero_si256();
  for (size_t u = 0; u < num_pairs; ++u) {
    RequestStep(values);
    __m256i w[kNumQ];
    for (int j = 0; j < kNumQ; ++j) w[j] = _mm256_set1_epi32(weights[j][u]);
    if constexpr (kBits == 8) {
      const auto load = [&](size_t key, int half) {
        return _mm256_cvtepi8_epi16(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(values.rows[key] + offset + 16 * half)));
      };
      for (int half = 0; half < 2; ++half) {
        const __m256i a = load(2 * u, half), b = load(2 * u + 1, half);
        const __m256i pairs[2] = {_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b)};
        for (int k = 2 * half; k < 2 * half + 2; ++k) {
          for (int j = 0; j < kNumQ; ++j) {
            sums[j * 4 + k] =
                _mm256_add_epi32(sums[j * 4 + k], _mm256_madd_epi16(pairs[k % 2], w[j]));
          }
        }
      }
      continue;
    }
    __m256i lo, hi;  // (key 2u, key 2u + 1) word pairs: 4 bits, bytes 0-3 | 8-11, 4-7 | 12-15
    if constexpr (kBits == 4) {
      const auto load = [&](size_t key) {
        return _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(values.rows[key] + offset)));
      };
      const __m256i a = load(2 * u), b = load(2 * u + 1);
      lo = _mm256_unpacklo_epi16(a, b);
      hi = _mm256_unpackhi_epi16(a, b);
    } else {  // 2 bits: bytes 0-7
      const auto load = [&](size_t key) {
        return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(values.rows[key] + offset));
      };
      lo = hi = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(load(2 * u), load(2 * u + 1)));
    }
    for (int k = 0; k < 4; ++k) {
      const __m256i pair = kBits == 2 || k < 2 ? lo : hi;
      const int shift = kBits == 4 ? 4 * (k % 2) : 2 * k;
      const __m256i x = shift == 0 ? pair : _mm256_srli_epi16(pair, shift);
      for (int j = 0; j < kNumQ; ++j) {
        sums[j * 4 + k] = _mm256_add_epi32(sums[j * 4 + k], _mm256_madd_epi16(x, w[j]));
      }
    }
  }
  for (int i = 0; i < 4 * kNumQ; ++i) acc[i] = sums[i];
}

// Weighted sum of a tile's values (rows padded to a multiple of 16) into the running states of
// the `group` query heads, as AccumulateTile, in MaddValueElement's order: p: [group, p_stride]
// softmax weights (0 past num_keys, up to the next multiple of 8) and stats their largest and sum
// per head (TileWeightStats); state: [group, state_stride].
void MaddAccumulateTile(const VnniPlan& plan, const RowSet& values, size_t num_keys, const float* p,
                        size_t p_stride, const TileWeightStats& stats, int group, float* state,
                        size_t state_stride) {
  const size_t num_keys8 = (num_keys + kMaddKeys - 1) / kMaddKeys * kMaddKeys;
  const size_t num_pairs = num_keys8 / 2;
  const int num_groups = plan.num_groups;
  const ValueWeights tile = ValueWeightsScratch(group, num_groups, num_pairs);
  MaddQuantiseWeights(plan, values, num_keys8, p, p_stride, stats, group, tile.weights,
                      tile.w_scale, tile.min_sum);
  const int num_slices = static_cast<int>(plan.head_dim) / 32;
  for (int slice = 0; slice < num_slices; ++slice) {
    const int g = slice * 32 / plan.group_elems;
    // Two heads at a time: 8 accumulators, 4 code vectors and a weight in the 16 registers.
    for (int j = 0; j < group;) {
      const int num_q = group - j >= 2 ? 2 : 1;
      const int32_t* w[2];
      for (int jj = 0; jj < num_q; ++jj) {
        w[jj] = tile.weights + (static_cast<size_t>(j + jj) * num_groups + g) * num_pairs;
      }
      __m256i acc[8];
      const size_t offset = plan.code_offset + static_cast<size_t>(slice) * 32 * plan.bits / 8;
      if (plan.bits == 8) {
        num_q == 2 ? MaddAccumulateSlice<8, 2>(values, num_pairs, offset, w, acc)
                   : MaddAccumulateSlice<8, 1>(values, num_pairs, offset, w, acc);
      } else if (plan.bits == 4) {
        num_q == 2 ? MaddAccumulateSlice<4, 2>(values, num_pairs, offset, w, acc)
                   : MaddAccumulateSlice<4, 1>(values, num_pairs, offset, w, acc);
      } else {
        num_q == 2 ? MaddAccumulateSlice<2, 2>(values, num_pairs, offset, w, acc)
                   : MaddAccumulateSlice<2, 1>(values, num_pairs, offset, w, acc);
      }
      for (int jj = 0; jj < num_q; ++jj) {
        const size_t row = static_cast<size_t>(j + jj) * num_groups + g;
        const __m256 scale = _mm256_set1_ps(tile.w_scale[row]),
                     min = _mm256_set1_ps(tile.min_sum[row]);
        float* st = state + (j + jj) * state_stride + 32 * slice;
        for (int k = 0; k < 4; ++k) {
          // A part's own sums: its cumulative sums less 2^bits times the next part's, but for
          // the byte's last part.
          const bool last = plan.bits == 8 || (plan.bits == 4 ? k % 2 == 1 : k == 3);
          const __m256i sums =
              last ? acc[jj * 4 + k]
                   : _mm256_sub_epi32(
                         acc[jj * 4 + k],
                         _mm256_sll_epi32(acc[jj * 4 + k + 1], _mm_cvtsi32_si128(plan.bits)));
          const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, min);
          _mm256_storeu_ps(st + 8 * k, _mm256_add_ps(_mm256_loadu_ps(st + 8 * k), v));
        }
      }
      j += num_q;
    }
  }
}

// The `group` heads' states from MaddValueElement's order back to element order.
void MaddValueOrderToElements(const VnniPlan& plan, int group, float* state, size_t state_stride) {
  // Every slice of 32 slots holds the same elements of its own 32: one table per width.
  static constexpr auto kElements = [] {
    std::array<std::array<uint8_t, 32>, 3> t{};  // [2, 4, 8 bits][slot]
    for (int slot = 0; slot < 32; ++slot) {
      for (int w = 0; w < 3; ++w) t[w][slot] = static_cast<uint8_t>(MaddValueElement(slot, 2 << w));
    }
    return t;
  }();
  const uint8_t* elements = kElements[plan.bits == 2 ? 0 : plan.bits == 4 ? 1 : 2].data();
  alignas(32) float row[kVnniMaxHeadDim];
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::memcpy(row, st, plan.head_dim * sizeof(float));
    for (size_t s0 = 0; s0 < plan.head_dim; s0 += 32) {
      for (size_t slot = 0; slot < 32; ++slot) st[s0 + elements[slot]] = row[s0 + slot];
    }
  }
}

#else  // not AVX2: the VNNI readers or the float readers

VnniPlan PlanMaddKeys(const SideSpec&, size_t, size_t) { return {}; }
void MaddPrepareQueries(const VnniPlan&, const float*, int, VnniQuery*) {}
void MaddKiviPrepareQueries(const VnniPlan&, const float*, int, KiviQueries*) {}
void MaddScoreTile(const VnniPlan&, const RowSet&, const RowSet&, size_t, const VnniQuery*,
                   const KiviQueries&, int, float*, size_t) {}
VnniPlan PlanMaddValues(const SideSpec&, size_t, size_t) { return {}; }
void MaddAccumulateTile(const VnniPlan&, const RowSet&, size_t, const float*, size_t,
                        const TileWeightStats&, int, float*, size_t) {}
void MaddValueOrderToElements(const VnniPlan&, int, float*, size_t) {}

#endif  // HWY_TARGET == HWY_AVX2

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
