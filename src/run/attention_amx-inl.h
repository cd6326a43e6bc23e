// Per-target decode scores of int8 keys by Intel AMX tile multiplies (included by
// attention_decode.cc inside its foreach_target pass, after attention_vnni-inl.h; compiled only
// for the AVX3 target, used only where the CPU has AMX-INT8 and Linux granted this process the
// tile data, base/amx.h; everywhere else the VNNI or float readers score these keys).
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

#define KVS_AMX_ATTR __attribute__((target("avx512vnni,avx512vbmi,amx-tile,amx-int8")))

// Whether the int8 keys of `plan` are scored by tile multiplies for `group` query heads.
bool AmxKeysApply(const VnniPlan& plan, int group) {
  return plan.ok && plan.bits == 8 && !plan.kivi && plan.head_dim % 64 == 0 &&
         group <= kAmxMaxGroup && !TileMultipliesDisabledForTest() && AmxInt8Usable();
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

// The tile configuration (palette 1), as ldtilecfg reads it.
struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile i
  uint8_t rows[16] = {};
};

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
    for (size_t k = key0; k < key0 + 16; k += 4) {
      PrefetchAhead(keys, k, num_keys);
      PrefetchAhead(values, k, num_keys);
    }
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

#undef KVS_AMX_ATTR

#else  // not AVX3: no tile multiplies

bool AmxKeysApply(const VnniPlan&, int) { return false; }
void AmxPrepareQueries(const VnniPlan&, const float*, int, AmxQueries*) {}
void AmxScoreTile(const VnniPlan&, const RowSet&, const RowSet&, size_t, const AmxQueries&, int,
                  float*, size_t) {}

#endif  // HWY_TARGET == HWY_AVX3

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
