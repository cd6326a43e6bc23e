// Per-target decode readers for BF16 keys and values with AVX512_BF16 (included by
// attention_decode.cc inside its foreach_target pass; compiled only for the AVX3 target, used only
// where the CPU reports avx512bf16; every other machine reads BF16 with the float readers).
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

#include <cstdint>
#include <cstring>

#include "run/attention_kernels.h"

#if defined(KVSTACK_RUN_ATTENTION_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_BF16_INL_H_
#undef KVSTACK_RUN_ATTENTION_BF16_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_BF16_INL_H_
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

// BF16 elements per vdpbf16ps operand: the unit head_dim comes in.
constexpr size_t kBf16Chunk = 32;
// Largest head_dim the BF16 readers take (Bf16OrderToElements' row is a fixed array).
constexpr size_t kBf16MaxHeadDim = 512;

// Which sides of a decode task the BF16 readers take.
struct Bf16Plan {
  bool keys = false;
  bool values = false;
};

#if HWY_TARGET == HWY_AVX3

// The AVX3 target's features plus AVX512_BF16, spelled out whole (see KVS_VNNI_ATTR: clang lets
// a function's target attribute replace the HWY_BEFORE_NAMESPACE pragma's list).
#define KVS_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

bool CpuHasBf16Dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && !DotProductReadersDisabledForTest();
}

bool Bf16Applies(const SideSpec& side, size_t head_dim, size_t lanes) {
  return lanes == 16 && side.fill == FillKind::kDirect && side.reader == Reader::kBF16 &&
         head_dim % kBf16Chunk == 0 && head_dim <= kBf16MaxHeadDim && CpuHasBf16Dot();
}

Bf16Plan PlanBf16(const SideSpec& k_side, const SideSpec& v_side, size_t head_dim, size_t lanes) {
  return {Bf16Applies(k_side, head_dim, lanes), Bf16Applies(v_side, head_dim, lanes)};
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

// Vector casts (a reference cast would send the vector through memory).
KVS_BF16_ATTR HWY_INLINE __m512bh AsBf16(__m512i bits) { return (__m512bh)bits; }

KVS_BF16_ATTR HWY_INLINE __m512bh LoadBf16(const void* p) { return AsBf16(_mm512_loadu_si512(p)); }

// Scores of keys key0 .. key0 + 3 against kNumQ query heads q: [kNumQ, head_dim] BF16, written
// to s[j * s_stride + key0 + key].
template <int kNumQ>
KVS_BF16_ATTR HWY_INLINE void Bf16ScoreFourRows(const RowSet& keys, size_t key0, const uint16_t* q,
                                                size_t head_dim, float* s, size_t s_stride) {
  const DF df;
  __m512 acc[kNumQ][4];
  for (int j = 0; j < kNumQ; ++j) {
    for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_setzero_ps();
  }
  for (size_t e = 0; e < head_dim; e += kBf16Chunk) {
    __m512bh k[4];
    for (int key = 0; key < 4; ++key) {
      k[key] = LoadBf16(keys.rows[key0 + key] + e * sizeof(uint16_t));
    }
    for (int j = 0; j < kNumQ; ++j) {
      const __m512bh qv = LoadBf16(q + j * head_dim + e);
      for (int key = 0; key < 4; ++key) acc[j][key] = _mm512_dpbf16_ps(acc[j][key], k[key], qv);
    }
  }
  for (int j = 0; j < kNumQ; ++j) {
    SumOfLanes4(df, hn::Vec<DF>{acc[j][0]}, hn::Vec<DF>{acc[j][1]}, hn::Vec<DF>{acc[j][2]},
                hn::Vec<DF>{acc[j][3]}, s + j * s_stride + key0);
  }
}

// Scores of a tile's keys (rows padded to a multiple of 4) for the `group` query heads:
//   q: [group, head_dim] BF16 (Bf16PrepareQueries); s: [group, s_stride]
KVS_BF16_ATTR void Bf16ScoreTile(const RowSet& keys, const RowSet& values, size_t num_keys,
                                 const uint16_t* q, int group, size_t head_dim, float* s,
                                 size_t s_stride) {
  for (size_t key = 0; key < num_keys; key += 4) {
    PrefetchAhead(keys, key, num_keys);
    PrefetchAhead(values, key, num_keys);
    // Heads by 4, 2, 1 (ForEachHeadStep's steps; a lambda would not carry KVS_BF16_ATTR).
    int j = 0;
    for (; j + 4 <= group; j += 4) {
      Bf16ScoreFourRows<4>(keys, key, q + j * head_dim, head_dim, s + j * s_stride, s_stride);
    }
    for (; j + 2 <= group; j += 2) {
      Bf16ScoreFourRows<2>(keys, key, q + j * head_dim, head_dim, s + j * s_stride, s_stride);
    }
    for (; j < group; ++j) {
      Bf16ScoreFourRows<1>(keys, key, q + j * head_dim, head_dim, s + j * s_stride, s_stride);
    }
  }
}

// state_j[e0, e0 + 32 kChunks) += the tile's weighted values, in the order of the file comment,
// for kNumQ query heads with weight pairs w: [kNumQ][w_stride] (BF16 (p_2i, p_2i+1) per dword).
template <int kNumQ, int kChunks>
KVS_BF16_ATTR HWY_INLINE void Bf16AccumulateSlice(const RowSet& values, size_t num_pairs,
                                                  const uint32_t* w, size_t w_stride, size_t e0,
                                                  float* state, size_t state_stride) {
  __m512 acc[kNumQ][kChunks][2];
  for (int j = 0; j < kNumQ; ++j) {
    for (int c = 0; c < kChunks; ++c) {
      for (int h = 0; h < 2; ++h) {
        acc[j][c][h] = _mm512_loadu_ps(state + j * state_stride + e0 + kBf16Chunk * c + 16 * h);
      }
    }
  }
  const size_t offset = e0 * sizeof(uint16_t);
  for (size_t pair = 0; pair < num_pairs; ++pair) {
    const std::byte* first = values.rows[2 * pair] + offset;
    const std::byte* second = values.rows[2 * pair + 1] + offset;
    __m512bh wv[kNumQ];
    for (int j = 0; j < kNumQ; ++j) {
      const __m512i bits = _mm512_set1_epi32(static_cast<int>(w[j * w_stride + pair]));
      wv[j] = AsBf16(bits);
    }
    for (int c = 0; c < kChunks; ++c) {
      const __m512i a = _mm512_loadu_si512(first + c * kBf16Chunk * sizeof(uint16_t));
      const __m512i b = _mm512_loadu_si512(second + c * kBf16Chunk * sizeof(uint16_t));
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      for (int j = 0; j < kNumQ; ++j) {
        acc[j][c][0] = _mm512_dpbf16_ps(acc[j][c][0], AsBf16(lo), wv[j]);
        acc[j][c][1] = _mm512_dpbf16_ps(acc[j][c][1], AsBf16(hi), wv[j]);
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
template <int kNumQ>
struct Bf16Slices {
  template <int kChunks>
  KVS_BF16_ATTR void operator()(size_t first) const {
    Bf16AccumulateSlice<kNumQ, kChunks>(values, num_pairs, w, w_stride, first * kBf16Chunk, state,
                                        state_stride);
  }
  const RowSet& values;
  size_t num_pairs;
  const uint32_t* w;
  size_t w_stride;
  float* state;
  size_t state_stride;
};

// The same over all of head_dim: slices of as many chunks as keep 16 accumulators in registers,
// then the rest by ForEachSlice, so that each value row is passed over as few times as the
// registers allow.
template <int kNumQ>
KVS_BF16_ATTR HWY_INLINE void Bf16AccumulateRows(const RowSet& values, size_t num_pairs,
                                                 const uint32_t* w, size_t w_stride,
                                                 size_t head_dim, float* state,
                                                 size_t state_stride) {
  ForEachSlice<8 / kNumQ>(head_dim / kBf16Chunk,
                          Bf16Slices<kNumQ>{values, num_pairs, w, w_stride, state, state_stride});
}

// Weighted sum of a tile's values (rows padded to a multiple of 16) into the running states of
// the `group` query heads, in the order of the file comment:
//   p: [group, p_stride] softmax weights, zero from num_keys to its multiple of 16
KVS_BF16_ATTR void Bf16AccumulateTile(const RowSet& values, size_t num_keys, const float* p,
                                      size_t p_stride, int group, size_t head_dim, float* state,
                                      size_t state_stride) {
  const size_t num_keys16 = (num_keys + 15) / 16 * 16;
  const size_t w_stride = num_keys16 / 2;
  // Scratch holds floats; each one holds a weight pair here.
  uint32_t* w = reinterpret_cast<uint32_t*>(Scratch(kSlotBf16Weights, group * w_stride));
  for (int j = 0; j < group; ++j) {
    for (size_t key = 0; key < num_keys16; key += 16) {
      const __m256bh bf = _mm512_cvtneps_pbh(_mm512_loadu_ps(p + j * p_stride + key));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + j * w_stride + key / 2), (__m256i)bf);
    }
  }
  const size_t num_pairs = (num_keys + 1) / 2;
  int j = 0;  // heads by 4, 2, 1 (as Bf16ScoreTile)
  for (; j + 4 <= group; j += 4) {
    Bf16AccumulateRows<4>(values, num_pairs, w + j * w_stride, w_stride, head_dim,
                          state + j * state_stride, state_stride);
  }
  for (; j + 2 <= group; j += 2) {
    Bf16AccumulateRows<2>(values, num_pairs, w + j * w_stride, w_stride, head_dim,
                          state + j * state_stride, state_stride);
  }
  for (; j < group; ++j) {
    Bf16AccumulateRows<1>(values, num_pairs, w + j * w_stride, w_stride, head_dim,
                          state + j * state_stride, state_stride);
  }
}

// Where element e of a row sits in a state accumulated by Bf16AccumulateTile: within each
// 32-element chunk, the 16-bit unpacks put element 8 L + 4 h + i (128-bit lane L, half h) in
// slot 16 h + 4 L + i.
inline size_t Bf16Slot(size_t e) {
  const size_t in_chunk = e % kBf16Chunk, lane = in_chunk / 8, half = in_chunk / 4 % 2;
  return e - in_chunk + 16 * half + 4 * lane + in_chunk % 4;
}

// A task's `group` states [group, state_stride] from Bf16AccumulateTile's order back to element
// order, once per task.
void Bf16OrderToElements(int group, size_t head_dim, float* state, size_t state_stride) {
  float row[kBf16MaxHeadDim];
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::memcpy(row, st, head_dim * sizeof(float));
    for (size_t e = 0; e < head_dim; ++e) st[e] = row[Bf16Slot(e)];
  }
}

#undef KVS_BF16_ATTR

#else  // not AVX3: the float readers everywhere

Bf16Plan PlanBf16(const SideSpec&, const SideSpec&, size_t, size_t) { return {}; }
void Bf16PrepareQueries(const float*, int, size_t, uint16_t*) {}
void Bf16ScoreTile(const RowSet&, const RowSet&, size_t, const uint16_t*, int, size_t, float*,
                   size_t) {}
void Bf16AccumulateTile(const RowSet&, size_t, const float*, size_t, int, size_t, float*, size_t) {}
void Bf16OrderToElements(int, size_t, float*, size_t) {}

#endif  // HWY_TARGET == HWY_AVX3

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
