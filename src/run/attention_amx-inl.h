// Per-target decode readers of int8 keys and values by Intel AMX tile multiplies (included by
// attention_decode.cc inside its foreach_target pass, after attention_vnni-inl.h; compiled only
// for the AVX3 target, used only where the CPU has AMX-INT8, Linux granted this process the
// tile data (base/amx.h) and the shape pays (AmxKeysApply); everywhere else the VNNI or float
// readers take these rows). Keys first; values below.
//
// Why: the VNNI reader transposes every 16 keys' codes (two 16x16 dword transposes at head_dim
// 128) and spends two vpdpbusd per 4 code bytes and query head. One tile multiply (tdpbssd)
// takes 16 keys x 64 code bytes, loaded straight from the cache with the rows' stride (a block's
// rows of one kv head lie back to back), against 64 query elements in up to 16 columns: 16 x 16
// x 64 multiply-adds, one every 16 cycles.
//
// Tiles: A = 16 keys x 64 codes (s8), one chunk of 64 elements; B (one per chunk, loaded once
// per tile of keys) = the chunk's query bytes, column 2 j the hi and 2 j + 1 the lo bytes of
// query head j, B[k][4 n + i] being element 4 k + i of column n; C = 16 keys x 2 group int32
// sums, turned into columns over the keys by LoadColumns. A column sums a whole row, so each
// query head is quantised with one step for the head (hi + lo / 256 as the VNNI reader's int8
// keys, but per head instead of per block of 32): each element is off by at most max|q| / 65024,
// below the rounding of an F16 query. The i32 sums stay below 2^31: 256 x 127 x 127 x 256 < 2^31
// at the largest head_dim. Keys whose 16 rows are not evenly spaced (a run that crosses a
// block, the repeated last key that pads a tile) are first copied to a staging tile.
#include <cstdint>
#include <cstring>

#include "base/amx.h"

#if defined(KVSTACK_RUN_ATTENTION_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_AMX_INL_H_
#undef KVSTACK_RUN_ATTENTION_AMX_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_AMX_INL_H_
#endif

#include "hwy/highway.h"
#include "run/attention_vnni-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

constexpr int kAmxMaxChunks = static_cast<int>(kVnniMaxHeadDim / 64);  // B tiles 0..3
constexpr int kAmxMaxGroup = 8;  // query heads per kv head: two C columns each, 16 at most

// The `group` query heads of one task as B tiles (see the file comment).
struct AmxQueries {
  alignas(64) int8_t b[kAmxMaxChunks][16][64];
  float step[kAmxMaxGroup];  // the head's step / 256: score = row scale * step * (256 hi + lo)
};

#if HWY_TARGET == HWY_AVX3

// (The AVX3 target's features spelled out whole, as KVS_VNNI_ATTR does, for clang.)
#define KVS_AMX_ATTR \
  __attribute__((target(HWY_TARGET_STR ",avx512vnni,avx512vbmi,amx-tile,amx-int8")))

// Whether the int8 keys of `plan` are scored by tile multiplies for `group` query heads. Where
// the tiles pay, measured against the VNNI readers (8 kv heads, 4k tokens, 2 threads, keys and
// values together): at head_dim 128, 1.1x faster for 2 query heads per kv head, 1.2x for 4,
// 1.5x for 8, equal for 1; at head_dim 64 3-5 % slower for 1, 2 and 4 (20 % at 1k tokens for 1),
// since their fixed costs per 16 keys (C's store and transpose) and per 64 (B and C tiles)
// are spread over fewer multiply-adds.
bool AmxKeysApply(const VnniPlan& plan, int group) {
  return plan.ok && plan.bits == 8 && !plan.kivi && plan.head_dim % 64 == 0 &&
         plan.head_dim >= 128 && 2 <= group && group <= kAmxMaxGroup &&
         !TileMultipliesDisabledForTest() && AmxInt8Usable();
}

// Quantises the `group` query heads q: [group, head_dim] (scaled, rotated) into B tiles.
KVS_AMX_ATTR void AmxPrepareQueries(const VnniPlan& plan, const float* q, int group,
                                    AmxQueries* out) {
  const int head_dim = static_cast<int>(plan.head_dim);
  for (int j = 0; j < group; ++j) {
    const float* qj = q + static_cast<size_t>(j) * head_dim;
    alignas(64) int8_t hi[kVnniMaxHeadDim], lo[kVnniMaxHeadDim];
    const float m = MaxAbs(qj, head_dim);
    QuantiseHiLo(qj, head_dim, m, hi, lo);
    out->step[j] = m / 127.0f / 256.0f;
    for (int e = 0; e < head_dim; e += 4) {
      int8_t* b_row = out->b[e / 64][e % 64 / 4];
      std::memcpy(b_row + 8 * j, hi + e, 4);
      std::memcpy(b_row + 8 * j + 4, lo + e, 4);
    }
  }
}

// Scores of a tile's int8 keys (rows padded to a multiple of 16) for the `group` query heads:
// s: [group, s_stride], as VnniScoreTile; kChunks = head_dim / 64.
template <int kChunks>
KVS_AMX_ATTR void AmxScoreTileChunks(const VnniPlan& plan, const RowSet& keys, const RowSet& values,
                                     size_t num_keys, const AmxQueries& q, int group, float* s,
                                     size_t s_stride) {
  static_assert(1 <= kChunks && kChunks <= kAmxMaxChunks);
  // Tiles 0 .. kChunks - 1: B; 4: A; 5: C.
  AmxTileConfig config;
  const auto columns_bytes = static_cast<uint16_t>(8 * group);
  for (int t = 0; t < kChunks; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = columns_bytes;
  }
  config.rows[4] = 16;
  config.colsb[4] = 64;
  config.rows[5] = 16;
  config.colsb[5] = columns_bytes;
  _tile_loadconfig(&config);
  _tile_loadd(0, q.b[0], 64);
  if constexpr (kChunks > 1) _tile_loadd(1, q.b[1], 64);
  if constexpr (kChunks > 2) _tile_loadd(2, q.b[2], 64);
  if constexpr (kChunks > 3) _tile_loadd(3, q.b[3], 64);

  alignas(64) int32_t c[16][16];
  const std::byte* c_rows[16];
  for (int k = 0; k < 16; ++k) c_rows[k] = reinterpret_cast<const std::byte*>(c[k]);
  alignas(64) int8_t staging[16][64 * kChunks];
  const size_t unit = keys.prefetch_bytes;  // the rows' spacing within a block
  for (size_t key0 = 0; key0 < num_keys; key0 += 16) {
    PrefetchAhead16(keys, key0, num_keys);
    PrefetchAhead16(values, key0, num_keys);
    const std::byte* const* rows = keys.rows + key0;
    bool even = unit != 0;
    for (int k = 1; k < 16; ++k) even &= rows[k] == rows[0] + k * unit;
    const void* a = rows[0] + plan.code_offset;
    size_t a_stride = unit;
    if (!even) {
      for (int k = 0; k < 16; ++k)
        std::memcpy(staging[k], rows[k] + plan.code_offset, 64 * kChunks);
      a = staging;
      a_stride = 64 * kChunks;
    }
    const auto* a_bytes = static_cast<const std::byte*>(a);
    _tile_zero(5);
    _tile_loadd(4, a_bytes, a_stride);
    _tile_dpbssd(5, 4, 0);
    if constexpr (kChunks > 1) {
      _tile_loadd(4, a_bytes + 64, a_stride);
      _tile_dpbssd(5, 4, 1);
    }
    if constexpr (kChunks > 2) {
      _tile_loadd(4, a_bytes + 128, a_stride);
      _tile_dpbssd(5, 4, 2);
    }
    if constexpr (kChunks > 3) {
      _tile_loadd(4, a_bytes + 192, a_stride);
      _tile_dpbssd(5, 4, 3);
    }
    _tile_stored(5, c, 64);
    __m512i cols[16];
    LoadColumns(c_rows, 0, 2 * group, cols);
    __m512 scale[16], min[16];  // (int8 rows: one scale, no minimum)
    LoadGroupScales(plan, keys, key0, scale, min);
    for (int j = 0; j < group; ++j) {
      const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(cols[2 * j], 8), cols[2 * j + 1]);
      _mm512_storeu_ps(s + j * s_stride + key0,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(sum),
                                     _mm512_mul_ps(scale[0], _mm512_set1_ps(q.step[j]))));
    }
  }
  _tile_release();
}

// Scores of a tile's int8 keys for the `group` query heads (AmxKeysApply holds), as
// VnniScoreTile: s: [group, s_stride]; q: AmxPrepareQueries.
void AmxScoreTile(const VnniPlan& plan, const RowSet& keys, const RowSet& values, size_t num_keys,
                  const AmxQueries& q, int group, float* s, size_t s_stride) {
  switch (plan.head_dim / 64) {
    case 1:
      return AmxScoreTileChunks<1>(plan, keys, values, num_keys, q, group, s, s_stride);
    case 2:
      return AmxScoreTileChunks<2>(plan, keys, values, num_keys, q, group, s, s_stride);
    case 3:
      return AmxScoreTileChunks<3>(plan, keys, values, num_keys, q, group, s, s_stride);
    default:
      return AmxScoreTileChunks<4>(plan, keys, values, num_keys, q, group, s, s_stride);
  }
}

// ---------------------------------------------------------------------------------------------
// Values (int8 rows): acc_j[e] += sum over keys t of p_j[t] s_t v_t[e], s_t the row's scale. Per
// tile of keys, the weights w = p_j[t] s_t are quantised to int16 against their largest |w|,
// W_j = max |w| / 32639, and split into two signed bytes, w = 256 hi + lo with hi = (w + 128)
// >> 8 and lo in [-128, 127] (|w| <= 32639 keeps hi within [-127, 127]): each weight is off by
// at most W_j / 2, as the VNNI reader's. Per chunk of 64 keys, A holds row 2 j = hi and 2 j + 1 =
// lo of head j over the keys, and B tile 4 h + u (h a 64-element half of the row) holds
// B[k][4 n + i] = code of key 4 k + i at element 64 h + 16 L + 4 u + c (n = 4 L + c): two rounds
// of byte and word unpacks of 4 rows, within 128-bit lanes. One C per B tile (2 group rows x 16
// elements) sums over the tile's keys in memory: at most 256 keys x 127 x 128 in each i32.
// (Measured, not kept: C tiles held in registers over the whole tile, one half of the row at a
// time, 15-20 % slower; B for two chunks per C load, no faster. Building B for the chunk just
// read keeps it and the rows in L1.)

// Whether the int8 values of `plan` are summed by tile multiplies for `group` query heads.
bool AmxValuesApply(const VnniPlan& plan, int group) { return AmxKeysApply(plan, group); }

// Per-thread buffers of AmxAccumulateTile.
struct AmxValueTiles {
  alignas(64) int8_t a[16][64];                         // [2 j + part][key in the chunk]
  alignas(64) int8_t b[kVnniMaxHeadDim / 16][16][64];   // [B tile][k][4 n + i]
  alignas(64) int32_t c[kVnniMaxHeadDim / 16][16][16];  // [B tile][2 j + part][n]
  alignas(64) float scales[kDecodeTile];                // the keys' row scales
};

// Weighted sum of a tile's int8 values (rows padded to a multiple of 16) into the running
// states of the `group` query heads (AmxValuesApply holds), as VnniAccumulateTile: p: [group,
// p_stride] softmax weights (0 past num_keys, up to the next multiple of 16); state: [group,
// state_stride], in element order.
KVS_AMX_ATTR void AmxAccumulateTile(const VnniPlan& plan, const RowSet& values, size_t num_keys,
                                    const float* p, size_t p_stride, int group, float* state,
                                    size_t state_stride) {
  thread_local AmxValueTiles tiles;
  const size_t num_keys16 = (num_keys + 15) / 16 * 16;
  const int halves = static_cast<int>(plan.head_dim / 64);
  const int num_b = 4 * halves;
  for (size_t key0 = 0; key0 < num_keys16; key0 += 16) {
    __m512 scale[16], min[16];  // (int8 rows: one scale, no minimum)
    LoadGroupScales(plan, values, key0, scale, min);
    _mm512_store_ps(tiles.scales + key0, scale[0]);
  }
  float step[kAmxMaxGroup], inv[kAmxMaxGroup];
  for (int j = 0; j < group; ++j) {
    const float* pj = p + j * p_stride;
    __m512 vmax = _mm512_setzero_ps();
    for (size_t k = 0; k < num_keys16; k += 16) {
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_mul_ps(_mm512_loadu_ps(pj + k),
                                                             _mm512_load_ps(tiles.scales + k))));
    }
    const float m = _mm512_reduce_max_ps(vmax);
    step[j] = m / 32639.0f;
    inv[j] = m > 0.0f ? 32639.0f / m : 0.0f;
  }
  std::memset(tiles.c, 0, sizeof(tiles.c[0]) * num_b);
  AmxTileConfig config;  // 0: A, 1: B, 2: C
  const auto a_rows = static_cast<uint8_t>(2 * group);
  config.rows[0] = config.rows[2] = a_rows;
  config.colsb[0] = config.colsb[1] = config.colsb[2] = 64;
  config.rows[1] = 16;
  _tile_loadconfig(&config);
  const __m512i round = _mm512_set1_epi32(128);
  for (size_t k0 = 0; k0 < num_keys16; k0 += 64) {
    const size_t n = std::min<size_t>(64, num_keys16 - k0);  // a multiple of 16
    for (int j = 0; j < group; ++j) {
      const float* pj = p + j * p_stride + k0;
      for (size_t k = 0; k < n; k += 16) {
        const __m512i w = _mm512_cvtps_epi32(_mm512_mul_ps(
            _mm512_mul_ps(_mm512_loadu_ps(pj + k), _mm512_load_ps(tiles.scales + k0 + k)),
            _mm512_set1_ps(inv[j])));
        const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(w, round), 8);
        const __m512i lo = _mm512_sub_epi32(w, _mm512_slli_epi32(hi, 8));
        _mm_store_si128(reinterpret_cast<__m128i*>(tiles.a[2 * j] + k), _mm512_cvtepi32_epi8(hi));
        _mm_store_si128(reinterpret_cast<__m128i*>(tiles.a[2 * j + 1] + k),
                        _mm512_cvtepi32_epi8(lo));
      }
      if (n < 64) {  // zero weights past the keys (their B rows keep what they held)
        std::memset(tiles.a[2 * j] + n, 0, 64 - n);
        std::memset(tiles.a[2 * j + 1] + n, 0, 64 - n);
      }
    }
    const std::byte* const* rows = values.rows + k0;
    for (size_t k4 = 0; k4 < n; k4 += 4) {
      for (int h = 0; h < halves; ++h) {
        const size_t offset = plan.code_offset + 64 * static_cast<size_t>(h);
        const __m512i r0 = _mm512_loadu_si512(rows[k4] + offset);
        const __m512i r1 = _mm512_loadu_si512(rows[k4 + 1] + offset);
        const __m512i r2 = _mm512_loadu_si512(rows[k4 + 2] + offset);
        const __m512i r3 = _mm512_loadu_si512(rows[k4 + 3] + offset);
        const __m512i lo01 = _mm512_unpacklo_epi8(r0, r1), hi01 = _mm512_unpackhi_epi8(r0, r1);
        const __m512i lo23 = _mm512_unpacklo_epi8(r2, r3), hi23 = _mm512_unpackhi_epi8(r2, r3);
        int8_t(*b)[16][64] = tiles.b + 4 * h;
        _mm512_store_si512(b[0][k4 / 4], _mm512_unpacklo_epi16(lo01, lo23));
        _mm512_store_si512(b[1][k4 / 4], _mm512_unpackhi_epi16(lo01, lo23));
        _mm512_store_si512(b[2][k4 / 4], _mm512_unpacklo_epi16(hi01, hi23));
        _mm512_store_si512(b[3][k4 / 4], _mm512_unpackhi_epi16(hi01, hi23));
      }
    }
    _tile_loadd(0, tiles.a, 64);
    for (int t = 0; t < num_b; ++t) {
      _tile_loadd(1, tiles.b[t], 64);
      _tile_loadd(2, tiles.c[t], 64);
      _tile_dpbssd(2, 0, 1);
      _tile_stored(2, tiles.c[t], 64);
    }
  }
  _tile_release();
  // Into the states: C row 2 j of B tile 4 h + u holds in 128-bit lane L elements 64 h + 16 L +
  // 4 u + [0, 4); a 4x4 transpose of 128-bit lanes puts them in element order.
  for (int j = 0; j < group; ++j) {
    const __m512 w = _mm512_set1_ps(step[j]);
    for (int h = 0; h < halves; ++h) {
      __m512 f[4];
      for (int u = 0; u < 4; ++u) {
        const int32_t* c = tiles.c[4 * h + u][2 * j];
        const __m512i sum =
            _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c), 8), _mm512_load_si512(c + 16));
        f[u] = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), w);
      }
      const __m512 f01_lo = _mm512_shuffle_f32x4(f[0], f[1], 0x44);
      const __m512 f23_lo = _mm512_shuffle_f32x4(f[2], f[3], 0x44);
      const __m512 f01_hi = _mm512_shuffle_f32x4(f[0], f[1], 0xEE);
      const __m512 f23_hi = _mm512_shuffle_f32x4(f[2], f[3], 0xEE);
      const __m512 e[4] = {
          _mm512_shuffle_f32x4(f01_lo, f23_lo, 0x88), _mm512_shuffle_f32x4(f01_lo, f23_lo, 0xDD),
          _mm512_shuffle_f32x4(f01_hi, f23_hi, 0x88), _mm512_shuffle_f32x4(f01_hi, f23_hi, 0xDD)};
      float* st = state + j * state_stride + 64 * h;
      for (int l = 0; l < 4; ++l) {
        _mm512_storeu_ps(st + 16 * l, _mm512_add_ps(_mm512_loadu_ps(st + 16 * l), e[l]));
      }
    }
  }
}

#undef KVS_AMX_ATTR

#else  // not AVX3: no tile multiplies

bool AmxKeysApply(const VnniPlan&, int) { return false; }
void AmxPrepareQueries(const VnniPlan&, const float*, int, AmxQueries*) {}
void AmxScoreTile(const VnniPlan&, const RowSet&, const RowSet&, size_t, const AmxQueries&, int,
                  float*, size_t) {}
bool AmxValuesApply(const VnniPlan&, int) { return false; }
void AmxAccumulateTile(const VnniPlan&, const RowSet&, size_t, const float*, size_t, int, float*,
                       size_t) {}

#endif  // HWY_TARGET == HWY_AVX3

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
