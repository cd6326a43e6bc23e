// Per-target decode readers for FP8 keys and values in FP16 (included by attention_bf16-inl.h,
// whose plan chooses them, inside attention_decode.cc's foreach_target pass; compiled only for
// the AVX3 target, used only where the CPU reports avx512fp16 and the BF16 readers apply).
//
// Why: on CPUs with AVX512-FP16 an FP8 code becomes an IEEE half by shifts, where the BF16
// readers need byte-table lookups (vpermt2b: on Emerald Rapids 0.70 ns each, three F32 FMAs'
// time), and vfmadd231ph does 32 products per instruction, twice an F32 FMA's.
//
// Codes as halves (Fp8ChunkToHalves): E5M2 is the high byte of its half (same exponent bias;
// infinities and NaN included), so a half worth the value. E4M3: the sign-extended code shifted
// left by 7, the copy of the sign in bit 14 cleared, NaN codes replaced: a half worth the value
// times 2^-8, subnormals too.
//
// Keys: each query head is scaled by a power of two so that its largest |element| lies just
// below 2^kQueryTopLog2, then rounded to FP16 (relative 2^-11, finer than a BF16 query); each
// key's 32 lanes sum head_dim / 32 <= 16 products in FP16, each rounded to 2^-11 of the lane's
// sum, at most 16 x 2^kQueryTopLog2 x the largest half in magnitude (below FP16's 65504); they
// leave FP16 exactly and are summed in F32. The scales and the row's scale multiply the score.
//
// Values: per tile and query head, each key's weight p * row scale is scaled by the power of
// two that puts the tile's largest just below 2^kWeightTopLog2, and rounded to FP16 (relative
// 2^-11, finer than a BF16 weight); vfmadd231ph adds weight x code into 32 FP16 lanes for runs of
// kHalfRun keys, at most kHalfRun x 2^kWeightTopLog2 x the largest half in magnitude, and each
// run's sums leave FP16 exactly into the F32 state, times the powers of two undone. Each run's
// sums are off by at most (kHalfRun - 1) x 2^-11 of its terms' magnitudes. The state stays in
// element order.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "run/attention_kernels.h"

#if defined(KVSTACK_RUN_ATTENTION_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_HALF_INL_H_
#undef KVSTACK_RUN_ATTENTION_HALF_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_HALF_INL_H_
#endif

#include "hwy/highway.h"
#include "run/attention_readers-inl.h"
#include "run/attention_rows-inl.h"

#if HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

// The FP16 intrinsics need g++ (12 and later) or a clang from 15 on: clang 14's headers define
// them only where the whole file is compiled for AVX512-FP16. Elsewhere FP8 rows take the BF16
// readers.
#if HWY_TARGET == HWY_AVX3 && (!defined(__clang__) || __clang_major__ >= 15)
#define KVS_HALF_READERS 1
#else
#define KVS_HALF_READERS 0
#endif

#if KVS_HALF_READERS

#define KVS_HALF_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,avx512vbmi,avx512fp16")))

bool CpuHasFp16() {
  static const bool has = __builtin_cpu_supports("avx512fp16");
  return has && !HalfReadersDisabledForTest();
}

// Keys summed per value run in FP16 before their sums leave for the F32 state.
constexpr size_t kHalfRun = 8;
constexpr float kLargestHalf = 65504.0f;

// What a half of each FP8 format is worth (the file comment) and how large the FP16 operands
// are scaled: kQueryTopLog2 and kWeightTopLog2 keep every FP16 sum below FP16's largest.
template <Reader kR>
struct HalfFormat;
template <>
struct HalfFormat<Reader::kFp8E4M3> {
  static constexpr int kWorthLog2 = -8;     // a half is worth the value times 2^-8
  static constexpr float kLargest = 1.75f;  // 448 x 2^-8
  static constexpr int kQueryTopLog2 = 8;
  static constexpr int kWeightTopLog2 = 8;
};
template <>
struct HalfFormat<Reader::kFp8E5M2> {
  static constexpr int kWorthLog2 = 0;
  static constexpr float kLargest = 57344.0f;
  static constexpr int kQueryTopLog2 = -4;
  static constexpr int kWeightTopLog2 = -3;
};

constexpr double Pow2(int exponent) {
  double x = 1.0;
  for (; exponent > 0; --exponent) x *= 2.0;
  for (; exponent < 0; ++exponent) x /= 2.0;
  return x;
}

template <Reader kR>
constexpr bool HalfSumsStayFinite() {
  using F = HalfFormat<kR>;
  // Key lanes sum at most 16 products (head_dim <= 512), value runs kHalfRun.
  return 16 * Pow2(F::kQueryTopLog2) * F::kLargest <= kLargestHalf &&
         kHalfRun * Pow2(F::kWeightTopLog2) * F::kLargest <= kLargestHalf;
}
static_assert(HalfSumsStayFinite<Reader::kFp8E4M3>() && HalfSumsStayFinite<Reader::kFp8E5M2>());

// The shift s for which largest x 2^s lies in [2^(top - 1), 2^top) (top itself for a largest
// that is 0 or not finite), clamped to [-118, 118] so that 2^s and the powers of two that undo it
// stay finite: a largest below 2^-110 then keeps fewer bits, one near F32's largest overflows its
// scores in the reference too.
inline int ShiftBelow(float largest, int top_log2) {
  int exponent = 0;  // largest = m 2^exponent, m in [0.5, 1)
  if (std::isfinite(largest) && largest > 0.0f) std::frexp(largest, &exponent);
  return std::clamp(top_log2 - exponent, -118, 118);
}

// Elements [e, e + 32) of an FP8 row ([f16 scale][codes]) as halves (the file comment), in
// element order.
template <Reader kR>
KVS_HALF_ATTR HWY_INLINE __m512h Fp8ChunkToHalves(const std::byte* row, size_t e) {
  const __m256i codes =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + sizeof(uint16_t) + e));
  if constexpr (kR == Reader::kFp8E5M2) {
    return _mm512_castsi512_ph(_mm512_slli_epi16(_mm512_cvtepu8_epi16(codes), 8));
  } else {
    const __m512i words = _mm512_cvtepi8_epi16(codes);
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(words, 7), _mm512_set1_epi16(0x3FFF - 0x8000));
    // The NaN codes (magnitude 0x7F) come out as +-1.875 (0x3F80, 0xBF80), which no other code
    // does.
    const __mmask32 nan =
        _mm512_cmpeq_epi16_mask(_mm512_or_si512(h, _mm512_set1_epi16(static_cast<int16_t>(0x8000))),
                                _mm512_set1_epi16(static_cast<int16_t>(0xBF80)));
    h = _mm512_mask_mov_epi16(h, nan, _mm512_set1_epi16(0x7E00));
    return _mm512_castsi512_ph(h);
  }
}

// The 32 FP16 lanes of x as F32: lanes 0..15 in *lo, 16..31 in *hi (each conversion exact).
KVS_HALF_ATTR HWY_INLINE void HalfToF32(__m512h x, __m512* lo, __m512* hi) {
  const __m512i bits = _mm512_castph_si512(x);
  *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(bits));
  *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1));
}

// The 32 FP16 lanes of x as 16 F32 lanes (pairs summed in F32).
KVS_HALF_ATTR HWY_INLINE __m512 HalfLanesToF32(__m512h x) {
  __m512 lo, hi;
  HalfToF32(x, &lo, &hi);
  return _mm512_add_ps(lo, hi);
}

// The `group` query heads q: [group, head_dim] (scaled, rotated), each times 2^s_j, as FP16 in
// element order into out: [group, head_dim], with unscale[j]: what a sum of products with the
// halves of kR's codes is multiplied by.
template <Reader kR>
KVS_HALF_ATTR void HalfPrepareQueriesOf(const float* q, int group, size_t head_dim, uint16_t* out,
                                        float* unscale) {
  using F = HalfFormat<kR>;
  for (int j = 0; j < group; ++j) {
    const float* qj = q + static_cast<size_t>(j) * head_dim;
    __m512 vmax = _mm512_setzero_ps();
    for (size_t e = 0; e < head_dim; e += 16) {
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(qj + e)));
    }
    const int shift = ShiftBelow(_mm512_reduce_max_ps(vmax), F::kQueryTopLog2);
    const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, shift));
    for (size_t e = 0; e < head_dim; e += 16) {
      const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(qj + e), scale),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * head_dim + e), h);
    }
    unscale[j] = std::ldexp(1.0f, -F::kWorthLog2 - shift);
  }
}

// Scores of keys key0 .. key0 + 3 against kNumQ query heads qh: [kNumQ, head_dim] FP16
// (HalfPrepareQueries), written to s[j * s_stride + key0 + key].
template <Reader kR, int kNumQ>
KVS_HALF_ATTR HWY_INLINE void HalfScoreFourRows(const RowSet& keys, size_t key0, const uint16_t* qh,
                                                const float* unscale, size_t head_dim, float* s,
                                                size_t s_stride) {
  const DF df;
  __m512h acc[kNumQ][4];
  for (int j = 0; j < kNumQ; ++j) {
    for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_setzero_ph();
  }
  for (size_t e = 0; e < head_dim; e += 32) {
    __m512h k[4];
    for (int key = 0; key < 4; ++key) k[key] = Fp8ChunkToHalves<kR>(keys.rows[key0 + key], e);
    for (int j = 0; j < kNumQ; ++j) {
      const __m512h qv = _mm512_castsi512_ph(_mm512_loadu_si512(qh + j * head_dim + e));
      for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_fmadd_ph(qv, k[key], acc[j][key]);
    }
  }
  const __m128 scales = LoadRowScales(hn::FixedTag<float, 4>(), keys.rows + key0).raw;
  for (int j = 0; j < kNumQ; ++j) {
    float* sj = s + j * s_stride + key0;
    SumOfLanes4(df, hn::Vec<DF>{HalfLanesToF32(acc[j][0])}, hn::Vec<DF>{HalfLanesToF32(acc[j][1])},
                hn::Vec<DF>{HalfLanesToF32(acc[j][2])}, hn::Vec<DF>{HalfLanesToF32(acc[j][3])}, sj);
    _mm_storeu_ps(sj, _mm_mul_ps(_mm_loadu_ps(sj), _mm_mul_ps(scales, _mm_set1_ps(unscale[j]))));
  }
}

template <Reader kR>
KVS_HALF_ATTR void HalfScoreTileOf(const RowSet& keys, const RowSet& values, size_t num_keys,
                                   const uint16_t* qh, const float* unscale, int group,
                                   size_t head_dim, float* s, size_t s_stride) {
  for (size_t key = 0; key < num_keys; key += 4) {
    PrefetchAhead(keys, key, num_keys);
    PrefetchAhead(values, key, num_keys);
    // Heads by 4, 2, 1 (ForEachHeadStep's steps; a lambda would not carry KVS_HALF_ATTR).
    int j = 0;
    for (; j + 4 <= group; j += 4) {
      HalfScoreFourRows<kR, 4>(keys, key, qh + j * head_dim, unscale + j, head_dim,
                               s + j * s_stride, s_stride);
    }
    for (; j + 2 <= group; j += 2) {
      HalfScoreFourRows<kR, 2>(keys, key, qh + j * head_dim, unscale + j, head_dim,
                               s + j * s_stride, s_stride);
    }
    for (; j < group; ++j) {
      HalfScoreFourRows<kR, 1>(keys, key, qh + j * head_dim, unscale + j, head_dim,
                               s + j * s_stride, s_stride);
    }
  }
}

// state_j[e0, e0 + 32 kChunks) += the weighted values (rows of reader kR) of keys 0 .. num_keys
// - 1 for kNumQ query heads: w: [kNumQ][w_stride] FP16 weights, flush: [kNumQ] what each run's
// sums are multiplied by (the file comment).
template <Reader kR, int kNumQ, int kChunks>
KVS_HALF_ATTR HWY_INLINE void HalfAccumulateSlice(const RowSet& values, size_t num_keys,
                                                  const uint16_t* w, size_t w_stride,
                                                  const float* flush, size_t e0, float* state,
                                                  size_t state_stride) {
  for (size_t run = 0; run < num_keys; run += kHalfRun) {
    __m512h acc[kNumQ][kChunks];
    for (int j = 0; j < kNumQ; ++j) {
      for (int c = 0; c < kChunks; ++c) acc[j][c] = _mm512_setzero_ph();
    }
    const size_t run_end = std::min(num_keys, run + kHalfRun);
    for (size_t key = run; key < run_end; ++key) {
      __m512h wv[kNumQ];
      for (int j = 0; j < kNumQ; ++j) {
        wv[j] = _mm512_castsi512_ph(_mm512_set1_epi16(static_cast<int16_t>(w[j * w_stride + key])));
      }
      for (int c = 0; c < kChunks; ++c) {
        const __m512h v = Fp8ChunkToHalves<kR>(values.rows[key], e0 + 32 * c);
        for (int j = 0; j < kNumQ; ++j) acc[j][c] = _mm512_fmadd_ph(v, wv[j], acc[j][c]);
      }
    }
    for (int j = 0; j < kNumQ; ++j) {
      const __m512 f = _mm512_set1_ps(flush[j]);
      for (int c = 0; c < kChunks; ++c) {
        float* st = state + j * state_stride + e0 + 32 * c;
        __m512 lo, hi;
        HalfToF32(acc[j][c], &lo, &hi);
        _mm512_storeu_ps(st, _mm512_fmadd_ps(lo, f, _mm512_loadu_ps(st)));
        _mm512_storeu_ps(st + 16, _mm512_fmadd_ps(hi, f, _mm512_loadu_ps(st + 16)));
      }
    }
  }
}

// HalfAccumulateSlice for ForEachSlice: chunk `first` on, kChunks chunks.
template <Reader kR, int kNumQ>
struct HalfSlices {
  template <int kChunks>
  KVS_HALF_ATTR void operator()(size_t first) const {
    HalfAccumulateSlice<kR, kNumQ, kChunks>(values, num_keys, w, w_stride, flush, first * 32, state,
                                            state_stride);
  }
  const RowSet& values;
  size_t num_keys;
  const uint16_t* w;
  size_t w_stride;
  const float* flush;
  float* state;
  size_t state_stride;
};

// Over all of head_dim: slices of as many chunks as keep 16 FP16 accumulators in registers (8
// chunks at most, as ForEachSlice walks).
template <Reader kR, int kNumQ>
KVS_HALF_ATTR HWY_INLINE void HalfAccumulateRows(const RowSet& values, size_t num_keys,
                                                 const uint16_t* w, size_t w_stride,
                                                 const float* flush, size_t head_dim, float* state,
                                                 size_t state_stride) {
  ForEachSlice<std::min(8, 16 / kNumQ)>(
      head_dim / 32,
      HalfSlices<kR, kNumQ>{values, num_keys, w, w_stride, flush, state, state_stride});
}

template <Reader kR>
KVS_HALF_ATTR void HalfAccumulateTileOf(const RowSet& values, size_t num_keys, const float* p,
                                        size_t p_stride, int group, size_t head_dim, float* state,
                                        size_t state_stride) {
  using F = HalfFormat<kR>;
  const size_t num_keys16 = (num_keys + 15) / 16 * 16;
  const size_t n = static_cast<size_t>(group) * num_keys16;
  // [group][num_keys16] F32 weights, then as many FP16 ones, then [group] flush factors.
  float* wf = Scratch(kSlotBf16Weights, n + n / 2 + group);
  uint16_t* wh = reinterpret_cast<uint16_t*>(wf + n);
  float* flush = wf + n + n / 2;
  for (size_t key = 0; key < num_keys16; key += 16) {
    const __m512 scale = LoadRowScales(DF(), values.rows + key).raw;
    for (int j = 0; j < group; ++j) {
      _mm512_storeu_ps(wf + j * num_keys16 + key,
                       _mm512_mul_ps(_mm512_loadu_ps(p + j * p_stride + key), scale));
    }
  }
  for (int j = 0; j < group; ++j) {
    float* wj = wf + j * num_keys16;
    __m512 vmax = _mm512_setzero_ps();
    for (size_t key = 0; key < num_keys16; key += 16) {
      vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(wj + key));
    }
    const int shift = ShiftBelow(_mm512_reduce_max_ps(vmax), F::kWeightTopLog2);
    const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, shift));
    for (size_t key = 0; key < num_keys16; key += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(wj + key), scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wh + j * num_keys16 + key),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    flush[j] = std::ldexp(1.0f, -shift - F::kWorthLog2);
  }
  int j = 0;  // heads by 4, 2, 1 (as HalfScoreTileOf)
  for (; j + 4 <= group; j += 4) {
    HalfAccumulateRows<kR, 4>(values, num_keys, wh + j * num_keys16, num_keys16, flush + j,
                              head_dim, state + j * state_stride, state_stride);
  }
  for (; j + 2 <= group; j += 2) {
    HalfAccumulateRows<kR, 2>(values, num_keys, wh + j * num_keys16, num_keys16, flush + j,
                              head_dim, state + j * state_stride, state_stride);
  }
  for (; j < group; ++j) {
    HalfAccumulateRows<kR, 1>(values, num_keys, wh + j * num_keys16, num_keys16, flush + j,
                              head_dim, state + j * state_stride, state_stride);
  }
}

// The entry points, by the rows' reader (kFp8E4M3 or kFp8E5M2).

// The `group` query heads q: [group, head_dim] (scaled, rotated) as FP16 for keys of `reader`
// into out: [group, head_dim], with unscale: [group] (see HalfPrepareQueriesOf).
void HalfPrepareQueries(Reader reader, const float* q, int group, size_t head_dim, uint16_t* out,
                        float* unscale) {
  if (reader == Reader::kFp8E5M2) {
    return HalfPrepareQueriesOf<Reader::kFp8E5M2>(q, group, head_dim, out, unscale);
  }
  HalfPrepareQueriesOf<Reader::kFp8E4M3>(q, group, head_dim, out, unscale);
}

// Scores of a tile's keys (rows padded to a multiple of 4) for the `group` query heads:
// qh, unscale from HalfPrepareQueries; s: [group, s_stride].
void HalfScoreTile(Reader reader, const RowSet& keys, const RowSet& values, size_t num_keys,
                   const uint16_t* qh, const float* unscale, int group, size_t head_dim, float* s,
                   size_t s_stride) {
  if (reader == Reader::kFp8E5M2) {
    return HalfScoreTileOf<Reader::kFp8E5M2>(keys, values, num_keys, qh, unscale, group, head_dim,
                                             s, s_stride);
  }
  HalfScoreTileOf<Reader::kFp8E4M3>(keys, values, num_keys, qh, unscale, group, head_dim, s,
                                    s_stride);
}

// Weighted sum of a tile's values (rows padded to a multiple of 16) into the running states
// [group, state_stride] of the `group` query heads, in element order:
//   p: [group, p_stride] softmax weights, zero from num_keys to its multiple of 16
void HalfAccumulateTile(Reader reader, const RowSet& values, size_t num_keys, const float* p,
                        size_t p_stride, int group, size_t head_dim, float* state,
                        size_t state_stride) {
  if (reader == Reader::kFp8E5M2) {
    return HalfAccumulateTileOf<Reader::kFp8E5M2>(values, num_keys, p, p_stride, group, head_dim,
                                                  state, state_stride);
  }
  HalfAccumulateTileOf<Reader::kFp8E4M3>(values, num_keys, p, p_stride, group, head_dim, state,
                                         state_stride);
}

#undef KVS_HALF_ATTR

#else                       // no FP16 readers on this target or compiler

void HalfPrepareQueries(Reader, const float*, int, size_t, uint16_t*, float*) {}
#if HWY_TARGET == HWY_AVX3  // (the BF16 readers' plan and dispatch, which only AVX3 has)
bool CpuHasFp16() { return false; }
void HalfScoreTile(Reader, const RowSet&, const RowSet&, size_t, const uint16_t*, const float*, int,
                   size_t, float*, size_t) {}
void HalfAccumulateTile(Reader, const RowSet&, size_t, const float*, size_t, int, size_t, float*,
                        size_t) {}
#endif

#endif  // KVS_HALF_READERS
#undef KVS_HALF_READERS

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
