// The SIMD attention kernels behind Attention() (src/run/attention.h): a flash-decoding kernel
// for one query token and a tiled online-softmax kernel for many. Both read keys and values in
// their stored codec through the view and are compiled for every Highway target; the best one
// is picked at run time.
//
// A view holds up to three sources of tokens: F32 sinks, the encoded arena and F32 pending
// tokens. Decode treats each non-empty source (and each chunk of the arena) as one split-K
// partial and merges them. Per tile of keys, a "fill" step finds where each key's and value's
// bytes are (or, for codecs without a fast path, decodes them into per-thread scratch with the
// codec's own Decode) and a reader, specialised at compile time per storage format, scores or
// accumulates them dequantising in registers. Key and value readers are chosen independently
// per tile, so every (key codec, value codec) pair gets both fast paths without instantiating
// the pairs. Prefill decodes small tiles of keys and values to F32 and runs the F32 math.
//
// This file is included once per target by hwy/foreach_target.h; everything between
// HWY_BEFORE_NAMESPACE and HWY_AFTER_NAMESPACE is compiled for each of them, the dispatch at
// the bottom (HWY_ONCE) only once.

#include "run/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvstack/numeric.h"
#include "represent/hadamard.h"

// SSSE3 machines fall back to the portable EMU128 build; compiling one target fewer keeps the
// readers x kernels affordable to build.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Decode: keys per score tile (scores of one tile stay in L1 between the passes) and the
// smallest chunk of keys worth a task of its own.
constexpr int kDecodeTile = 256;
constexpr int kMinDecodeChunk = 256;
constexpr int kDecodeTasksPerThread = 4;
constexpr size_t kPrefetchAhead = 16;  // keys
constexpr size_t kCacheLine = 64;
// Prefill: keys per tile. A multiple of kKeysPerStep.
constexpr int kPrefillKeyTile = 32;
constexpr int kKeysPerStep = 4;
// Integer-group readers keep a row's (scale, min) pairs as floats on the stack: at most this
// many floats (16 groups). Rows with more groups take the generic path.
constexpr int kMaxHeaderFloats = 32;

// Independent per-thread scratch buffers, so one use never invalidates another.
enum ScratchSlot {
  kSlotScores,
  kSlotKeys,
  kSlotValues,
  kSlotUnit,
  kSlotHeaders,
  kSlotQuery,
  kSlotSplitQuery,
  kNumSlots
};

// A per-thread scratch that only grows, so the hot path does not allocate once warm.
float* Scratch(ScratchSlot slot, size_t num_floats) {
  thread_local std::vector<float> buffers[kNumSlots];
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() < num_floats) buffer.resize(num_floats);
  return buffer.data();
}

// How a kernel reads one stored row in registers.
enum class Reader {
  kF32,
  kF16,
  kBF16,
  kInt8,     // [f16 scale][int8 codes]; loads raw codes, the caller applies the scale
  kInt4,     // asymmetric groups: header [(f16 scale, f16 min)...], codes elsewhere
  kInt2,     //   (per-token groups, or one pair per multi-token unit)
  kKivi4,    // KIVI keys: raw codes in split order (below); per-channel scale/min are folded
  kKivi2,    //   into the query
  kInt4S,    // kInt4 in split order, for groups that are whole blocks
  kFp8E4M3,  // [f16 scale][fp8 codes]; loads the unscaled fp8 values, like kInt8
  kFp8E5M2,
};

// Readers of [f16 scale][8-bit elements] rows: the scale multiplies the score or the weight.
constexpr bool IsRowScaled(Reader r) {
  return r == Reader::kInt8 || r == Reader::kFp8E4M3 || r == Reader::kFp8E5M2;
}

constexpr bool IsFloatReader(Reader r) {
  return r == Reader::kF32 || r == Reader::kF16 || r == Reader::kBF16;
}
constexpr int ReaderBits(Reader r) {
  return r == Reader::kInt4 || r == Reader::kKivi4 || r == Reader::kInt4S ? 4
         : r == Reader::kInt2 || r == Reader::kKivi2                      ? 2
                                                                          : 8;
}

// Where the keys (or values) of one tile are: rows[i] is the data of tile key i in the reader's
// format, hdrs[i] its header (integer groups and KIVI units). Padded to a multiple of 4 keys by
// repeating the last key.
struct RowSet {
  const std::byte* rows[kDecodeTile];
  const std::byte* hdrs[kDecodeTile];
  int group_elems = 0;         // kInt4/kInt2: elements per (scale, min) pair within a row
  int num_header_floats = 0;   // kInt4/kInt2: 2 * groups per row
  size_t prefetch_bytes = 0;   // bytes worth prefetching per row (0: do not prefetch)
  bool absmax_header = false;  // header holds one f16 d per group: (scale, min) = (d, -8 d)
};

// Scalar decode of element `i` of a stored float row.
template <Reader kR>
HWY_INLINE float LoadScalar(const std::byte* row, size_t i) {
  if constexpr (kR == Reader::kF32) {
    float f;
    std::memcpy(&f, row + i * sizeof(float), sizeof(f));
    return f;
  } else {
    uint16_t bits;
    std::memcpy(&bits, row + i * sizeof(uint16_t), sizeof(bits));
    return kR == Reader::kF16 ? F16ToF32(bits) : BF16ToF32(bits);
  }
}

// Elements [i, i + Lanes(d)) of a packed code block as floats (codes, not dequantised).
// kBits 8: signed bytes; 4 and 2: unsigned, element e in byte e*b/8 at bit (e*b)%8.
// Reads exactly the bytes of those elements. Needs at least 4 lanes.
template <int kBits, class D>
HWY_INLINE hn::Vec<D> LoadCodes(D d, const std::byte* codes, size_t i) {
  const hn::Rebind<int32_t, D> di;
  if constexpr (kBits == 8) {
    const hn::Rebind<int8_t, D> di8;
    return hn::ConvertTo(
        d, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(codes) + i)));
  } else {
    const hn::Rebind<uint8_t, D> du8;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(codes) + i * kBits / 8;
    hn::Vec<decltype(du8)> unpacked;
    if constexpr (kBits == 4) {
      // Each byte becomes a u16 holding the low nibble in its low byte and the high nibble
      // in its high byte: viewed as bytes, the elements in order.
      const hn::Half<D> dh;
      const hn::Rebind<uint8_t, decltype(dh)> du8h;
      const hn::Rebind<uint16_t, decltype(dh)> du16h;
      const auto b = hn::PromoteTo(du16h, hn::LoadU(du8h, bytes));
      const auto w = hn::Or(hn::And(b, hn::Set(du16h, 0x0F)),
                            hn::ShiftLeft<4>(hn::And(b, hn::Set(du16h, 0xF0))));
      unpacked = hn::BitCast(du8, w);
    } else {
      // The Lanes(d) / 4 code bytes are broadcast to every 128-bit block; a byte shuffle
      // puts byte l / 4 into i32 lane l, a per-lane shift by 2 * (l % 4) and a mask leave the
      // code: 5 operations per vector instead of 14 for the widen-and-merge above.
      static_assert(kBits == 2);
      constexpr size_t kLanes = hn::MaxLanes(D());
      const hn::Rebind<uint32_t, D> du32;
      const hn::Repartition<uint8_t, decltype(du32)> du8x4;
      uint32_t word = 0;
      std::memcpy(&word, bytes, kLanes / 4);
      alignas(64) static constexpr auto kShuffle = [] {
        std::array<uint8_t, 4 * kLanes> table{};
        for (size_t l = 0; l < kLanes; ++l) {
          table[4 * l] = static_cast<uint8_t>(l / 4);
          for (int k = 1; k < 4; ++k) table[4 * l + k] = 0x80;  // zero
        }
        return table;
      }();
      alignas(64) static constexpr auto kShift = [] {
        std::array<uint32_t, kLanes> shift{};
        for (size_t l = 0; l < kLanes; ++l) shift[l] = static_cast<uint32_t>(2 * (l % 4));
        return shift;
      }();
      const auto broadcast = hn::BitCast(du8x4, hn::Set(du32, word));
      const auto spread =
          hn::BitCast(du32, hn::TableLookupBytesOr0(broadcast, hn::Load(du8x4, kShuffle.data())));
      const auto codes2 = hn::And(hn::Shr(spread, hn::Load(du32, kShift.data())), hn::Set(du32, 3));
      return hn::ConvertTo(d, hn::BitCast(di, codes2));
    }
    return hn::ConvertTo(d, hn::PromoteTo(di, unpacked));
  }
}

// Split order. Unpacking b-bit codes into element order costs more than the arithmetic on
// them, so the split readers take a block of P = (8 / b) * Lanes(d) elements from Lanes(d)
// bytes with one widening load — byte l of the block in lane l — and part r of the block is
// then (x >> r*b) & mask: the elements l * (8 / b) + r. The kernels work in that order
// instead: queries are permuted into it once per tile and value accumulators are permuted
// back once per task. Position p of a row in split order holds element SplitElement(p).
HWY_INLINE size_t SplitElement(size_t pos, size_t lanes, size_t parts) {
  const size_t block = lanes * parts;
  const size_t in_block = pos % block;
  return pos - in_block + (in_block % lanes) * parts + in_block / lanes;
}

constexpr bool IsSplitReader(Reader r) {
  return r == Reader::kInt4S || r == Reader::kKivi4 || r == Reader::kKivi2;
}

// The bytes of one split block (P elements from `first`), one per i32 lane.
template <int kBits, class D>
HWY_INLINE hn::Vec<hn::Rebind<int32_t, D>> LoadSplitBlock(D d, const std::byte* codes,
                                                          size_t first) {
  const hn::Rebind<int32_t, D> di;
  const hn::Rebind<uint8_t, D> du8;
  return hn::BitCast(di, hn::PromoteTo(hn::Rebind<uint32_t, D>(),
                                       hn::LoadU(du8, reinterpret_cast<const uint8_t*>(codes) +
                                                          first * kBits / 8)));
}

// Part r of a split block as floats (codes, not dequantised).
template <int kBits, class D>
HWY_INLINE hn::Vec<D> SplitPart(D d, hn::Vec<hn::Rebind<int32_t, D>> block, int r) {
  const hn::Rebind<int32_t, D> di;
  return hn::ConvertTo(
      d, hn::And(hn::ShiftRightSame(block, r * kBits), hn::Set(di, (1 << kBits) - 1)));
}

// Loads Lanes(d) elements of a stored row starting at element `i`, converted to f32 in
// registers: floats as stored, integer groups dequantised with the (scale, min) of the group
// holding them, int8 and KIVI as raw codes (their callers apply the scales). One-lane tags
// take the scalar path: a one-lane 16-bit Highway load may read past the element, and the row
// may end the arena.
template <Reader kR, class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const std::byte* row, size_t i, hn::Vec<D> scale = hn::Zero(D()),
                              hn::Vec<D> min = hn::Zero(D())) {
  if constexpr (IsFloatReader(kR) && hn::MaxLanes(D()) == 1) {
    return hn::Set(d, LoadScalar<kR>(row, i));
  } else if constexpr (kR == Reader::kF32) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kR == Reader::kF16) {
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else if constexpr (kR == Reader::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  } else if constexpr (kR == Reader::kInt8) {
    return LoadCodes<8>(d, row + sizeof(uint16_t), i);
  } else if constexpr (kR == Reader::kFp8E5M2) {
    // E5M2 is the upper byte of an IEEE half: widen, shift, convert (Inf/NaN/subnormals
    // included).
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<uint16_t, D> du16;
    const auto bytes = hn::LoadU(du8, reinterpret_cast<const uint8_t*>(row + sizeof(uint16_t)) + i);
    return hn::PromoteTo(d, hn::BitCast(hn::Rebind<hwy::float16_t, D>(),
                                        hn::ShiftLeft<8>(hn::PromoteTo(du16, bytes))));
  } else if constexpr (kR == Reader::kFp8E4M3) {
    // Sign to bit 31, exponent and mantissa to bits 20..26: an F32 whose value is the E4M3
    // value times 2^-120 (subnormals too), so one exact multiply rebiases it. 0x7F is NaN.
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<uint32_t, D> du32;
    const auto b = hn::PromoteTo(
        du32, hn::LoadU(du8, reinterpret_cast<const uint8_t*>(row + sizeof(uint16_t)) + i));
    const auto magnitude = hn::And(b, hn::Set(du32, 0x7F));
    const auto bits =
        hn::Or(hn::ShiftLeft<24>(hn::And(b, hn::Set(du32, 0x80))), hn::ShiftLeft<20>(magnitude));
    const auto value = hn::Mul(hn::BitCast(d, bits), hn::Set(d, 0x1p120f));
    return hn::IfThenElse(hn::RebindMask(d, hn::Eq(magnitude, hn::Set(du32, 0x7F))),
                          hn::Set(d, std::numeric_limits<float>::quiet_NaN()), value);
  } else if constexpr (kR == Reader::kInt4 || kR == Reader::kInt2) {
    return hn::MulAdd(LoadCodes<ReaderBits(kR)>(d, row, i), scale, min);
  } else {
    return LoadCodes<ReaderBits(kR)>(d, row, i);
  }
}

// Decodes a whole float row of head_dim elements into dst, using full vectors, then 4-lane
// vectors, then scalars, so that any head_dim works.
template <Reader kR>
HWY_INLINE void ConvertRow(const std::byte* row, size_t head_dim, float* HWY_RESTRICT dst) {
  static_assert(IsFloatReader(kR));
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const size_t n = hn::Lanes(df);
  size_t i = 0;
  for (; i + n <= head_dim; i += n) {
    hn::StoreU(LoadRow<kR>(df, row, i), df, dst + i);
  }
  for (; i + 4 <= head_dim; i += 4) {
    hn::StoreU(LoadRow<kR>(d4, row, i), d4, dst + i);
  }
  for (; i < head_dim; ++i) dst[i] = LoadScalar<kR>(row, i);
}

float LoadF16Scalar(const std::byte* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return F16ToF32(bits);
}

// ---------------------------------------------------------------------------------------------
// Filling a tile's rows: where the bytes of keys or values [t0, t1) of one kv head are.

// Decodes tokens [t0, t1) of an arena to F32 rows with the codec's own Decode (whole units;
// the tokens of the range are kept). dst: [t1 - t0][head_dim].
void DecodeArenaTokens(const KvLayerView& view, const KvArenaView& arena, int kv_head, int t0,
                       int t1, float* HWY_RESTRICT dst) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int group_tokens = arena.group_tokens;
  if (arena.codec == CodecId::kF32 || arena.codec == CodecId::kF16 ||
      arena.codec == CodecId::kBF16) {
    view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
      const std::byte* src = arena.Row(block_id, row, kv_head);
      float* out = dst + static_cast<size_t>(logical - t0) * head_dim;
      for (int r = 0; r < count; ++r, src += arena.unit_bytes, out += head_dim) {
        switch (arena.codec) {
          case CodecId::kF32:
            ConvertRow<Reader::kF32>(src, head_dim, out);
            break;
          case CodecId::kF16:
            ConvertRow<Reader::kF16>(src, head_dim, out);
            break;
          default:
            ConvertRow<Reader::kBF16>(src, head_dim, out);
            break;
        }
      }
    });
    return;
  }
  KVS_CHECK(arena.codec_impl != nullptr && "a quantised arena needs its codec_impl");
  const Codec& codec = *arena.codec_impl;
  float* unit_buffer = group_tokens > 1 ? Scratch(kSlotUnit, group_tokens * head_dim) : nullptr;
  view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
    float* out = dst + static_cast<size_t>(logical - t0) * head_dim;
    if (group_tokens == 1) {  // consecutive rows: one Decode call for the run
      codec.DecodeHead(view.first_kv_head + kv_head,
                       {arena.Unit(block_id, row, kv_head), count * arena.unit_bytes},
                       {out, count * head_dim});
      return;
    }
    for (int r = 0; r < count;) {
      const int slot_row = row + r;
      const int in_unit = slot_row % group_tokens;
      const int num = std::min(count - r, group_tokens - in_unit);
      codec.DecodeHead(view.first_kv_head + kv_head,
                       {arena.Unit(block_id, slot_row / group_tokens, kv_head), arena.unit_bytes},
                       {unit_buffer, group_tokens * head_dim});
      std::memcpy(out + static_cast<size_t>(r) * head_dim, unit_buffer + in_unit * head_dim,
                  num * head_dim * sizeof(float));
      r += num;
    }
  });
}

// Copies tokens [t0, t1) of one kv head from any mix of the three sources into F32 rows.
// dst: [t1 - t0][head_dim].
void LoadTokensF32(const KvLayerView& view, bool keys, int kv_head, int t0, int t1,
                   float* HWY_RESTRICT dst) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  auto copy_segment = [&](const KvF32Segment& seg, int begin, int end) {
    for (int t = begin; t < end; ++t) {
      const float* src =
          keys ? seg.KRow(t, kv_head, view.head_dim) : seg.VRow(t, kv_head, view.head_dim);
      std::memcpy(dst + static_cast<size_t>(t - t0) * head_dim, src, head_dim * sizeof(float));
    }
  };
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  copy_segment(view.sinks, t0, std::min(t1, arena_begin));
  const int a0 = std::max(t0, arena_begin), a1 = std::min(t1, arena_end);
  if (a0 < a1) {
    DecodeArenaTokens(view, keys ? view.k : view.v, kv_head, a0, a1,
                      dst + static_cast<size_t>(a0 - t0) * head_dim);
  }
  copy_segment(view.pending, std::max(t0, arena_end), t1);
}

// How a tile's keys or values are found and read.
enum class FillKind {
  kDirect,   // T = 1 rows read in place (floats, int8, per-token integer groups)
  kSpanned,  // integer groups spanning T > 1 tokens: header = unit, codes = the token's slice
  kKivi,     // KIVI keys: header = unit (per-channel pairs), codes = the token's slice
  kDecoded,  // any other codec: decoded into scratch, read as F32
  kSinks,    // F32 segment rows
  kPending,
};

// Everything a decode task needs to read one side (keys or values).
struct SideSpec {
  FillKind fill = FillKind::kDecoded;
  Reader reader = Reader::kF32;
  const KvArenaView* arena = nullptr;
  size_t code_offset = 0;     // bytes from the unit start to the codes (integer groups)
  size_t row_code_bytes = 0;  // code bytes per token (spanned / KIVI)
  int group_elems = 0;
  int num_header_floats = 0;
  bool absmax_header = false;  // q4_absmax: one f16 d per group, meaning (d, -8 d)
};

// Fills rows[0, t1 - t0) for one side, padded to a multiple of 4 with the last row.
void FillRows(const KvLayerView& view, const SideSpec& side, bool keys, int kv_head, int t0, int t1,
              RowSet* set) {
  const int num_keys = t1 - t0;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  set->group_elems = side.group_elems;
  set->num_header_floats = side.num_header_floats;
  set->absmax_header = side.absmax_header;
  set->prefetch_bytes = 0;
  switch (side.fill) {
    case FillKind::kSinks:
    case FillKind::kPending: {
      const KvF32Segment& seg = side.fill == FillKind::kSinks ? view.sinks : view.pending;
      for (int t = t0; t < t1; ++t) {
        const float* row =
            keys ? seg.KRow(t, kv_head, view.head_dim) : seg.VRow(t, kv_head, view.head_dim);
        set->rows[t - t0] = reinterpret_cast<const std::byte*>(row);
      }
      break;
    }
    case FillKind::kDecoded: {
      float* buffer = Scratch(keys ? kSlotKeys : kSlotValues, kDecodeTile * head_dim);
      DecodeArenaTokens(view, *side.arena, kv_head, t0, t1, buffer);
      for (int i = 0; i < num_keys; ++i) {
        set->rows[i] = reinterpret_cast<const std::byte*>(buffer + i * head_dim);
      }
      break;
    }
    case FillKind::kDirect:
    case FillKind::kSpanned:
    case FillKind::kKivi: {
      const KvArenaView& arena = *side.arena;
      const int group_tokens = arena.group_tokens;
      set->prefetch_bytes = group_tokens == 1 ? arena.unit_bytes : side.row_code_bytes;
      view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
        if (group_tokens == 1) {  // rows one unit apart: no division per row
          const std::byte* unit = arena.Unit(block_id, row, kv_head);
          const std::byte** hdrs = set->hdrs + (logical - t0);
          const std::byte** rows = set->rows + (logical - t0);
          for (int r = 0; r < count; ++r, unit += arena.unit_bytes) {
            hdrs[r] = unit;
            rows[r] = unit + side.code_offset;
          }
          return;
        }
        for (int r = 0; r < count; ++r) {
          const int slot_row = row + r;
          const std::byte* unit = arena.Unit(block_id, slot_row / group_tokens, kv_head);
          const int i = logical - t0 + r;
          set->hdrs[i] = unit;
          set->rows[i] = unit + side.code_offset +
                         static_cast<size_t>(slot_row % group_tokens) * side.row_code_bytes;
        }
      });
      break;
    }
  }
  const int num_keys4 = (num_keys + 3) / 4 * 4;
  for (int i = num_keys; i < num_keys4; ++i) {
    set->rows[i] = set->rows[num_keys - 1];
    set->hdrs[i] = set->hdrs[num_keys - 1];
  }
}

// ---------------------------------------------------------------------------------------------
// Decode readers.

// Stores the sum of the 128-bit blocks of v (4 lanes) to out[0, 4).
// (The one-lane HWY_SCALAR target has no block operations; it never needs them.)
#if HWY_TARGET != HWY_SCALAR
template <class D, class V>
HWY_INLINE void StoreSumOfBlocks(D d, V v, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreSumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}
#endif

// out[0..4) = the lane sums of a, b, c, e: four horizontal sums for the price of about one,
// by transposing pairs of lanes within each 128-bit block.
template <class D, class V>
HWY_INLINE void SumOfLanes4(D d, V a, V b, V c, V e, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    out[0] = hn::GetLane(a);
    out[1] = hn::GetLane(b);
    out[2] = hn::GetLane(c);
    out[3] = hn::GetLane(e);
  } else {
#if HWY_TARGET != HWY_SCALAR
    // Per block: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, e.
    const V ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
    const V ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
    const hn::Repartition<uint64_t, D> du64;
    const auto ab64 = hn::BitCast(du64, ab), ce64 = hn::BitCast(du64, ce);
    const V lo = hn::BitCast(d, hn::InterleaveLower(du64, ab64, ce64));
    const V hi = hn::BitCast(d, hn::InterleaveUpper(du64, ab64, ce64));
    StoreSumOfBlocks(d, hn::Add(lo, hi), out);
#endif
  }
}

// The header floats of a row of an integer-group reader: (scale, min) pairs.
// (F16 conversions in vectors: the software scalar one would cost more than the row.)
template <Reader kR>
HWY_INLINE void LoadHeader(const RowSet& set, size_t key, float* HWY_RESTRICT hf) {
  if constexpr (kR == Reader::kInt4 || kR == Reader::kInt2 || kR == Reader::kInt4S) {
    const std::byte* hdr = set.hdrs[key];
    if (set.absmax_header) {
      for (int g = 0; g < set.num_header_floats / 2; ++g) {
        const float d = LoadF16Scalar(hdr + g * sizeof(uint16_t));
        hf[2 * g] = d;
        hf[2 * g + 1] = -8.0f * d;
      }
      return;
    }
    const hn::CappedTag<float, 4> d4;
    const hn::Rebind<hwy::float16_t, decltype(d4)> d16;
    int i = 0;
    for (; i + 4 <= set.num_header_floats; i += 4) {
      hn::StoreU(
          hn::PromoteTo(d4, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(hdr) + i)), d4,
          hf + i);
    }
    for (; i < set.num_header_floats; ++i) hf[i] = LoadF16Scalar(hdr + i * sizeof(uint16_t));
  }
}

// Scores of four key rows against kNumQ query heads: s[j * s_stride + key] = q_j . k_key.
//   q: [kNumQ, head_dim] (already scaled)
template <int kNumQ, Reader kK, class D>
HWY_INLINE void ScoreFourRows(D d, const RowSet& keys, size_t key0, const float* HWY_RESTRICT q,
                              size_t head_dim, float* HWY_RESTRICT s, size_t s_stride) {
  const size_t n = hn::Lanes(d);
  float hf[4][kMaxHeaderFloats];
  const std::byte* rows[4];
  HWY_UNROLL(4)
  for (int key = 0; key < 4; ++key) {
    rows[key] = keys.rows[key0 + key];
    LoadHeader<kK>(keys, key0 + key, hf[key]);
  }
  constexpr bool kGroups = kK == Reader::kInt4 || kK == Reader::kInt2 || kK == Reader::kInt4S;
  // Loops over the (scale, min) groups, then their vectors: no division in the hot loop.
  const size_t group_elems = kGroups ? static_cast<size_t>(keys.group_elems) : head_dim;
  hn::Vec<D> acc[kNumQ][4];
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    HWY_UNROLL(8)
    for (int key = 0; key < 4; ++key) acc[j][key] = hn::Zero(d);
  }
  for (size_t g0 = 0, g = 0; g0 < head_dim; g0 += group_elems, ++g) {
    hn::Vec<D> scale[4], min[4];
    HWY_UNROLL(4)
    for (int key = 0; key < 4; ++key) {
      scale[key] = kGroups ? hn::Set(d, hf[key][2 * g]) : hn::Zero(d);
      min[key] = kGroups ? hn::Set(d, hf[key][2 * g + 1]) : hn::Zero(d);
    }
    if constexpr (IsSplitReader(kK)) {
      constexpr int kBits = ReaderBits(kK);
      constexpr int kParts = 8 / kBits;
      for (size_t b0 = g0; b0 < g0 + group_elems; b0 += kParts * n) {
        hn::Vec<hn::Rebind<int32_t, D>> x[4];
        HWY_UNROLL(4)
        for (int key = 0; key < 4; ++key) x[key] = LoadSplitBlock<kBits>(d, rows[key], b0);
        HWY_UNROLL(4)
        for (int r = 0; r < kParts; ++r) {
          hn::Vec<D> k[4];
          HWY_UNROLL(4)
          for (int key = 0; key < 4; ++key) {
            k[key] = SplitPart<kBits>(d, x[key], r);
            if constexpr (kGroups) k[key] = hn::MulAdd(k[key], scale[key], min[key]);
          }
          HWY_UNROLL(8)
          for (int j = 0; j < kNumQ; ++j) {
            const auto qv = hn::LoadU(d, q + j * head_dim + b0 + r * n);
            HWY_UNROLL(8)
            for (int key = 0; key < 4; ++key) acc[j][key] = hn::MulAdd(qv, k[key], acc[j][key]);
          }
        }
      }
    } else {
      for (size_t i = g0; i < g0 + group_elems; i += n) {
        hn::Vec<D> k[4];
        HWY_UNROLL(8)
        for (int key = 0; key < 4; ++key) {
          k[key] = LoadRow<kK>(d, rows[key], i, scale[key], min[key]);
        }
        HWY_UNROLL(8)
        for (int j = 0; j < kNumQ; ++j) {
          const auto qv = hn::LoadU(d, q + j * head_dim + i);
          HWY_UNROLL(8)
          for (int key = 0; key < 4; ++key) acc[j][key] = hn::MulAdd(qv, k[key], acc[j][key]);
        }
      }
    }
  }
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    SumOfLanes4(d, acc[j][0], acc[j][1], acc[j][2], acc[j][3], s + j * s_stride);
  }
  if constexpr (IsRowScaled(kK)) {
    HWY_UNROLL(4)
    for (int key = 0; key < 4; ++key) {
      const float scale = LoadF16Scalar(rows[key]);
      for (int j = 0; j < kNumQ; ++j) s[j * s_stride + key] *= scale;
    }
  }
}

// Query heads per scoring step: the accumulators of 4 heads x 4 keys fit in the 32 vector
// registers of AVX-512, and each key element is then converted once per 4 heads.
#if HWY_TARGET <= HWY_AVX3
constexpr int kScoreHeadStep = 4;
#else
constexpr int kScoreHeadStep = 2;
#endif

// Runs fn(j, num_q) over the query heads of a group in steps of kMaxStep (4 or 2), 2 and 1,
// so that each key or value element is converted once per step of heads.
template <int kMaxStep, class Fn>
HWY_INLINE void ForEachHeadStep(int group, Fn&& fn) {
  int j = 0;
  if constexpr (kMaxStep == 4) {
    for (; j + 4 <= group; j += 4) fn(j, std::integral_constant<int, 4>());
  }
  for (; j + 2 <= group; j += 2) fn(j, std::integral_constant<int, 2>());
  for (; j < group; ++j) fn(j, std::integral_constant<int, 1>());
}

// Requests the rows kPrefetchAhead keys past `key` (keys and values both: the value pass then
// reads from L2). Blocks of a paged cache are a few KiB apart from the next block of the same
// head, which stops the hardware prefetchers at every block. (Requesting only the start of
// each run of rows and leaving the rest to the hardware was faster for caches that fit in L2
// but a third slower from DRAM: bf16 at 32k tokens 9.6 ms instead of 6.2 ms.)
HWY_INLINE void PrefetchAhead(const RowSet& set, size_t key, size_t num_keys) {
  if (set.prefetch_bytes == 0) return;
  for (size_t ahead = key + kPrefetchAhead; ahead < std::min(num_keys, key + kPrefetchAhead + 4);
       ++ahead) {
    for (size_t line = 0; line < set.prefetch_bytes; line += kCacheLine) {
      hwy::Prefetch(set.rows[ahead] + line);
    }
  }
}

// Scores of a tile's keys for the `group` query heads of one kv head.
//   q: [group, head_dim] (scaled); s: [group, s_stride]
template <Reader kK, class D>
void ScoreTile(const RowSet& keys, const RowSet& values, size_t num_keys, const float* q, int group,
               size_t head_dim, float* s, size_t s_stride) {
  const D d;
  const size_t n = hn::Lanes(d);
  const size_t num_keys4 = (num_keys + 3) / 4 * 4;
  if constexpr (IsSplitReader(kK)) {
    // The queries in split order.
    const size_t parts = 8 / ReaderBits(kK);
    float* qs = Scratch(kSlotSplitQuery, group * head_dim);  // [group, head_dim]
    for (int j = 0; j < group; ++j) {
      for (size_t pos = 0; pos < head_dim; ++pos) {
        qs[j * head_dim + pos] = q[j * head_dim + SplitElement(pos, n, parts)];
      }
    }
    q = qs;
  }
  if constexpr (kK == Reader::kKivi4 || kK == Reader::kKivi2) {
    // Per unit: q'_c = q_c * scale_c and bias = sum_c q_c * min_c, so that each key's score
    // is q' . codes + bias with the codes read as integers.
    const size_t parts = 8 / ReaderBits(kK);
    float* header = Scratch(kSlotQuery, (4 + group) * head_dim + group);  // [2 * head_dim]
    float* split_scale = header + 2 * head_dim;                           // [head_dim]
    float* split_min = split_scale + head_dim;                            // [head_dim]
    float* qp = split_min + head_dim;                                     // [group, head_dim]
    float* bias = qp + group * head_dim;                                  // [group]
    size_t key = 0;
    while (key < num_keys) {
      const std::byte* unit = keys.hdrs[key];
      size_t run_end = key + 1;
      while (run_end < num_keys && keys.hdrs[run_end] == unit) ++run_end;
      // [head_dim x (scale, min)] as floats (header[2c], header[2c + 1]).
      ConvertRow<Reader::kF16>(unit, 2 * head_dim, header);
      for (size_t pos = 0; pos < head_dim; ++pos) {
        const size_t c = SplitElement(pos, n, parts);
        split_scale[pos] = header[2 * c];
        split_min[pos] = header[2 * c + 1];
      }
      for (int j = 0; j < group; ++j) {
        auto vbias = hn::Zero(d);
        for (size_t c = 0; c < head_dim; c += n) {
          const auto qv = hn::LoadU(d, q + j * head_dim + c);
          hn::StoreU(hn::Mul(qv, hn::LoadU(d, split_scale + c)), d, qp + j * head_dim + c);
          vbias = hn::MulAdd(qv, hn::LoadU(d, split_min + c), vbias);
        }
        bias[j] = hn::GetLane(hn::SumOfLanes(d, vbias));
      }
      // Steps of 4 may run past the unit: the next unit's scores overwrite those.
      for (size_t k4 = key; k4 < run_end; k4 += 4) {
        PrefetchAhead(keys, k4, num_keys);
        PrefetchAhead(values, k4, num_keys);
        ForEachHeadStep<kScoreHeadStep>(group, [&](int j, auto num_q) {
          ScoreFourRows<decltype(num_q)::value, kK>(d, keys, k4, qp + j * head_dim, head_dim,
                                                    s + j * s_stride + k4, s_stride);
        });
        const size_t k_end = std::min(k4 + 4, run_end);
        for (int j = 0; j < group; ++j) {
          for (size_t k = k4; k < k_end; ++k) s[j * s_stride + k] += bias[j];
        }
      }
      key = run_end;
    }
  } else {
    for (size_t key = 0; key < num_keys4; key += 4) {
      PrefetchAhead(keys, key, num_keys);
      PrefetchAhead(values, key, num_keys);
      ForEachHeadStep<kScoreHeadStep>(group, [&](int j, auto num_q) {
        ScoreFourRows<decltype(num_q)::value, kK>(d, keys, key, q + j * head_dim, head_dim,
                                                  s + j * s_stride + key, s_stride);
      });
    }
  }
}

// acc_j[i0, i0 + kVecs * Lanes(d)) += sum over keys of p[j * p_stride + key] * v_key, for
// kNumQ query heads. The accumulators stay in registers (kVecs is a compile-time count, so
// none spill) while all the tile's keys go by; each slice of a value row is converted once for
// all kNumQ heads.
//   acc: [kNumQ][acc_stride]; hf: [num_keys][kMaxHeaderFloats] headers (int8, integer groups)
template <int kNumQ, size_t kVecs, Reader kV, class D>
HWY_INLINE void AccumulateSlice(D d, const RowSet& values, size_t num_keys,
                                const float* HWY_RESTRICT p, size_t p_stride, size_t i0,
                                const float* HWY_RESTRICT hf, float* HWY_RESTRICT acc,
                                size_t acc_stride) {
  const size_t n = hn::Lanes(d);
  constexpr bool kGroups = kV == Reader::kInt4 || kV == Reader::kInt2 || kV == Reader::kInt4S;
  size_t header_idx[kVecs];  // where each vector's (scale, min) sits in a row's header
  HWY_UNROLL(8)
  for (size_t v = 0; v < kVecs; ++v) {
    header_idx[v] = kGroups ? 2 * ((i0 + v * n) / static_cast<size_t>(values.group_elems)) : 0;
  }
  hn::Vec<D> a[kNumQ][kVecs];
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    HWY_UNROLL(8)
    for (size_t v = 0; v < kVecs; ++v) a[j][v] = hn::LoadU(d, acc + j * acc_stride + i0 + v * n);
  }
  for (size_t key = 0; key < num_keys; ++key) {
    hn::Vec<D> w[kNumQ];
    // int8 rows are read as raw codes: their scale joins the weight.
    const float row_scale = IsRowScaled(kV) ? hf[key * kMaxHeaderFloats] : 1.0f;
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) w[j] = hn::Set(d, p[j * p_stride + key] * row_scale);
    const std::byte* row = values.rows[key];
    if constexpr (kV == Reader::kInt4S) {
      // kVecs is a multiple of the 2 parts of a block: a slice is whole blocks.
      HWY_UNROLL(8)
      for (size_t v = 0; v < kVecs; v += 2) {
        const auto block = LoadSplitBlock<4>(d, row, i0 + v * n);
        const float* h = hf + key * kMaxHeaderFloats + header_idx[v];
        const auto scale = hn::Set(d, h[0]), min = hn::Set(d, h[1]);
        HWY_UNROLL(2)
        for (int r = 0; r < 2; ++r) {
          const auto x = hn::MulAdd(SplitPart<4>(d, block, r), scale, min);
          HWY_UNROLL(8)
          for (int j = 0; j < kNumQ; ++j) a[j][v + r] = hn::MulAdd(w[j], x, a[j][v + r]);
        }
      }
      continue;
    }
    HWY_UNROLL(8)
    for (size_t v = 0; v < kVecs; ++v) {
      hn::Vec<D> x;
      if constexpr (kGroups) {
        const float* h = hf + key * kMaxHeaderFloats + header_idx[v];
        x = LoadRow<kV>(d, row, i0 + v * n, hn::Set(d, h[0]), hn::Set(d, h[1]));
      } else {
        x = LoadRow<kV>(d, row, i0 + v * n);
      }
      HWY_UNROLL(8)
      for (int j = 0; j < kNumQ; ++j) a[j][v] = hn::MulAdd(w[j], x, a[j][v]);
    }
  }
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    HWY_UNROLL(8)
    for (size_t v = 0; v < kVecs; ++v) hn::StoreU(a[j][v], d, acc + j * acc_stride + i0 + v * n);
  }
}

// The same over all of head_dim: full slices of 8 / kNumQ vectors, then single vectors
// (blocks for split readers).
template <int kNumQ, Reader kV, class D>
HWY_INLINE void AccumulateRows(D d, const RowSet& values, size_t num_keys,
                               const float* HWY_RESTRICT p, size_t p_stride, size_t head_dim,
                               const float* HWY_RESTRICT hf, float* HWY_RESTRICT acc,
                               size_t acc_stride) {
  constexpr size_t kMaxVecs = 8 / kNumQ;  // accumulators in registers: at most 8
  const size_t n = hn::Lanes(d);
  size_t i0 = 0;
  for (; i0 + kMaxVecs * n <= head_dim; i0 += kMaxVecs * n) {
    AccumulateSlice<kNumQ, kMaxVecs, kV>(d, values, num_keys, p, p_stride, i0, hf, acc, acc_stride);
  }
  if constexpr (kV == Reader::kInt4S) {  // whole blocks (head_dim is a multiple of them)
    for (; i0 < head_dim; i0 += 2 * n) {
      AccumulateSlice<kNumQ, 2, kV>(d, values, num_keys, p, p_stride, i0, hf, acc, acc_stride);
    }
  } else {
    for (; i0 < head_dim; i0 += n) {
      AccumulateSlice<kNumQ, 1, kV>(d, values, num_keys, p, p_stride, i0, hf, acc, acc_stride);
    }
  }
}

// Weighted sum of a tile's values into the running states of the `group` query heads.
//   p: [group, p_stride] softmax weights; state: [group, state_stride]
template <Reader kV, class D>
void AccumulateTile(const RowSet& values, size_t num_keys, const float* p, size_t p_stride,
                    int group, size_t head_dim, float* state, size_t state_stride) {
  const D d;
  // Headers once per tile, not once per slice of dimensions.
  float* hf = nullptr;
  if constexpr (IsRowScaled(kV) || kV == Reader::kInt4 || kV == Reader::kInt2 ||
                kV == Reader::kInt4S) {
    hf = Scratch(kSlotHeaders, num_keys * kMaxHeaderFloats);
    for (size_t key = 0; key < num_keys; ++key) {
      if constexpr (IsRowScaled(kV)) {
        hf[key * kMaxHeaderFloats] = LoadF16Scalar(values.rows[key]);
      } else {
        LoadHeader<kV>(values, key, hf + key * kMaxHeaderFloats);
      }
    }
  }
  ForEachHeadStep<4>(group, [&](int j, auto num_q) {
    AccumulateRows<decltype(num_q)::value, kV>(d, values, num_keys, p + j * p_stride, p_stride,
                                               head_dim, hf, state + j * state_stride,
                                               state_stride);
  });
}

using ScoreFn = void (*)(const RowSet&, const RowSet&, size_t, const float*, int, size_t, float*,
                         size_t);
using AccumulateFn = void (*)(const RowSet&, size_t, const float*, size_t, int, size_t, float*,
                              size_t);

template <class D>
ScoreFn ScoreFor(Reader r) {
  if constexpr (hn::MaxLanes(D()) >= 4) {
    switch (r) {
      case Reader::kInt8:
        return &ScoreTile<Reader::kInt8, D>;
      case Reader::kFp8E4M3:
        return &ScoreTile<Reader::kFp8E4M3, D>;
      case Reader::kFp8E5M2:
        return &ScoreTile<Reader::kFp8E5M2, D>;
      case Reader::kInt4:
        return &ScoreTile<Reader::kInt4, D>;
      case Reader::kInt2:
        return &ScoreTile<Reader::kInt2, D>;
      case Reader::kKivi4:
        return &ScoreTile<Reader::kKivi4, D>;
      case Reader::kKivi2:
        return &ScoreTile<Reader::kKivi2, D>;
      case Reader::kInt4S:
        return &ScoreTile<Reader::kInt4S, D>;
      default:
        break;
    }
  }
  switch (r) {
    case Reader::kF16:
      return &ScoreTile<Reader::kF16, D>;
    case Reader::kBF16:
      return &ScoreTile<Reader::kBF16, D>;
    case Reader::kF32:
      return &ScoreTile<Reader::kF32, D>;
    default:
      KVS_CHECK(false && "no key reader for this vector width");
      return nullptr;
  }
}

template <class D>
AccumulateFn AccumulateFor(Reader r) {
  if constexpr (hn::MaxLanes(D()) >= 4) {
    switch (r) {
      case Reader::kInt8:
        return &AccumulateTile<Reader::kInt8, D>;
      case Reader::kFp8E4M3:
        return &AccumulateTile<Reader::kFp8E4M3, D>;
      case Reader::kFp8E5M2:
        return &AccumulateTile<Reader::kFp8E5M2, D>;
      case Reader::kInt4:
        return &AccumulateTile<Reader::kInt4, D>;
      case Reader::kInt2:
        return &AccumulateTile<Reader::kInt2, D>;
      case Reader::kInt4S:
        return &AccumulateTile<Reader::kInt4S, D>;
      default:
        break;
    }
  }
  switch (r) {
    case Reader::kF16:
      return &AccumulateTile<Reader::kF16, D>;
    case Reader::kBF16:
      return &AccumulateTile<Reader::kBF16, D>;
    case Reader::kF32:
      return &AccumulateTile<Reader::kF32, D>;
    default:
      KVS_CHECK(false && "no value reader for this vector width");
      return nullptr;
  }
}

// The fast reader for one arena, if its format has one at vector width `lanes`; otherwise the
// generic decoded path. Geometry comes from the view (unit_bytes, group_tokens), so a view
// that does not match the documented format falls back to the codec's own Decode.
SideSpec ArenaSide(const KvLayerView& view, const KvArenaView& arena, bool keys, size_t lanes) {
  SideSpec side;
  side.arena = &arena;
  side.fill = FillKind::kDecoded;
  side.reader = Reader::kF32;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int group_tokens = arena.group_tokens;
  auto direct = [&](Reader r) {
    side.fill = FillKind::kDirect;
    side.reader = r;
  };
  switch (arena.codec) {
    case CodecId::kF32:
      direct(Reader::kF32);
      return side;
    case CodecId::kF16:
      direct(Reader::kF16);
      return side;
    case CodecId::kBF16:
      direct(Reader::kBF16);
      return side;
    default:
      break;
  }
  if (lanes < 4 || head_dim % lanes != 0) return side;
  const CodecId codec = arena.codec;
  if (group_tokens == 1 && arena.unit_bytes == 2 + head_dim) {
    if (codec == CodecId::kInt8) direct(Reader::kInt8);
    if (codec == CodecId::kFp8E4M3) direct(Reader::kFp8E4M3);
    if (codec == CodecId::kFp8E5M2) direct(Reader::kFp8E5M2);
    if (side.fill == FillKind::kDirect) return side;
  }
  if (codec == CodecId::kQ4Absmax && group_tokens == 1) {
    // [num_blocks x f16 d][4-bit codes], x = (q - 8) * d: integer groups of B elements with
    // scale d and minimum -8 d.
    const size_t block = std::min<size_t>(32, head_dim);
    const size_t num_blocks = head_dim / block;
    if (head_dim % block != 0 || arena.unit_bytes != 2 * num_blocks + head_dim / 2 ||
        2 * num_blocks > static_cast<size_t>(kMaxHeaderFloats) || block % lanes != 0) {
      return side;
    }
    side.fill = FillKind::kSpanned;
    side.reader = block % (2 * lanes) == 0 ? Reader::kInt4S : Reader::kInt4;
    side.code_offset = 2 * num_blocks;
    side.group_elems = static_cast<int>(block);
    side.num_header_floats = static_cast<int>(2 * num_blocks);
    side.absmax_header = true;
    return side;
  }
  const bool is_int = codec == CodecId::kInt4 || codec == CodecId::kInt2;
  const bool is_kivi = codec == CodecId::kKivi4 || codec == CodecId::kKivi2;
  if (!is_int && !is_kivi) return side;
  const int bits = codec == CodecId::kInt4 || codec == CodecId::kKivi4 ? 4 : 2;
  const size_t row_code_bytes = head_dim * bits / 8;  // whole bytes: head_dim % lanes == 0
  // 4-bit groups of whole split blocks take the split reader.
  auto int_reader = [&](size_t group_elems) {
    if (bits == 4) return group_elems % (2 * lanes) == 0 ? Reader::kInt4S : Reader::kInt4;
    return Reader::kInt2;
  };
  if (group_tokens == 1) {
    // Per-token groups (int<b>, KIVI values; KIVI keys of one token are the same bytes).
    if (arena.unit_bytes <= row_code_bytes || (arena.unit_bytes - row_code_bytes) % 4 != 0) {
      return side;
    }
    const size_t num_groups = (arena.unit_bytes - row_code_bytes) / 4;
    if (num_groups == 0 || head_dim % num_groups != 0 ||
        2 * num_groups > static_cast<size_t>(kMaxHeaderFloats)) {
      return side;
    }
    const size_t group_elems = head_dim / num_groups;
    if (group_elems % lanes != 0) return side;  // a vector must not straddle groups
    side.fill = FillKind::kSpanned;             // header = row start, codes after it
    side.reader = int_reader(group_elems);
    side.code_offset = 4 * num_groups;
    side.row_code_bytes = 0;
    side.group_elems = static_cast<int>(group_elems);
    side.num_header_floats = static_cast<int>(2 * num_groups);
    return side;
  }
  const size_t unit_code_bytes = row_code_bytes * group_tokens;
  if (is_int && arena.unit_bytes == 4 + unit_code_bytes) {
    side.fill = FillKind::kSpanned;  // one (scale, min) for the whole unit
    side.reader = int_reader(head_dim);
    side.code_offset = 4;
    side.row_code_bytes = row_code_bytes;
    side.group_elems = static_cast<int>(head_dim);
    side.num_header_floats = 2;
    return side;
  }
  if (is_kivi && keys && arena.unit_bytes == 4 * head_dim + unit_code_bytes &&
      head_dim % (8 / bits * lanes) == 0) {
    side.fill = FillKind::kKivi;
    side.reader = bits == 4 ? Reader::kKivi4 : Reader::kKivi2;
    side.code_offset = 4 * head_dim;
    side.row_code_bytes = row_code_bytes;
    return side;
  }
  return side;
}

// One decode task: keys [begin, end) of one source of kv head `kv_head` against the `group`
// query heads that share it. Leaves the unnormalised partial result in `state` and, when
// `logits` is not null, each key's scaled score (logits[j * logit_stride + t], t in
// [begin, end)) for the attention scores of selection policies:
//   q:      [group, head_dim] (already scaled and rotated)
//   state:  [group, head_dim + 2]: acc[head_dim], running max, running sum
//   logits: [group, logit_stride] or null
template <class D>
void DecodeChunk(const KvLayerView& view, const SideSpec& k_side, const SideSpec& v_side,
                 int kv_head, int begin, int end, const float* HWY_RESTRICT q, int group,
                 float* HWY_RESTRICT state, float* HWY_RESTRICT logits, size_t logit_stride) {
  const DF df;
  const size_t nf = hn::Lanes(df);
  const size_t nd = hn::Lanes(D());
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const size_t state_stride = head_dim + 2;
  // Scores padded to whole vectors with -inf, so that max/exp/sum need no scalar tail.
  const size_t s_stride = (kDecodeTile + nf - 1) / nf * nf;
  float* s = Scratch(kSlotScores, static_cast<size_t>(group) * s_stride);  // [group, s_stride]
  const ScoreFn score = ScoreFor<D>(k_side.reader);
  const AccumulateFn accumulate = AccumulateFor<D>(v_side.reader);
  RowSet keys, values;
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::fill(st, st + head_dim, 0.0f);
    st[head_dim] = kNegInf;   // running max
    st[head_dim + 1] = 0.0f;  // running sum
  }

  for (int t0 = begin; t0 < end; t0 += kDecodeTile) {
    const int t1 = std::min(end, t0 + kDecodeTile);
    const size_t num_keys = static_cast<size_t>(t1 - t0);
    FillRows(view, k_side, true, kv_head, t0, t1, &keys);
    FillRows(view, v_side, false, kv_head, t0, t1, &values);
    score(keys, values, num_keys, q, group, head_dim, s, s_stride);
    if (logits != nullptr) {  // once per tile: the no-scores path pays one branch per tile
      for (int j = 0; j < group; ++j) {
        std::memcpy(logits + j * logit_stride + t0, s + j * s_stride, num_keys * sizeof(float));
      }
    }
    // Softmax of the tile, folded into the running state.
    const size_t padded = (num_keys + nf - 1) / nf * nf;
    for (int j = 0; j < group; ++j) {
      float* sj = s + j * s_stride;
      float* st = state + j * state_stride;
      for (size_t i = num_keys; i < padded; ++i) sj[i] = kNegInf;
      auto vmax = hn::Set(df, kNegInf);
      for (size_t i = 0; i < padded; i += nf) vmax = hn::Max(vmax, hn::LoadU(df, sj + i));
      const float tile_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float new_max = std::max(st[head_dim], tile_max);
      const auto vnew_max = hn::Set(df, new_max);
      auto vsum = hn::Zero(df);
      for (size_t i = 0; i < padded; i += nf) {
        const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, sj + i), vnew_max));
        hn::StoreU(p, df, sj + i);
        vsum = hn::Add(vsum, p);
      }
      // exp(-inf) == 0 on the first tile, where the accumulator is still empty.
      const float alpha = std::exp(st[head_dim] - new_max);
      if (alpha != 1.0f) {
        for (size_t i = 0; i < head_dim; ++i) st[i] *= alpha;
      }
      st[head_dim + 1] = st[head_dim + 1] * alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
      st[head_dim] = new_max;
    }
    accumulate(values, num_keys, s, s_stride, group, head_dim, state, state_stride);
  }
  if (IsSplitReader(v_side.reader)) {  // accumulated in split order: back to element order
    float* row = Scratch(kSlotSplitQuery, head_dim);
    const size_t parts = 8 / ReaderBits(v_side.reader);
    for (int j = 0; j < group; ++j) {
      float* st = state + j * state_stride;
      std::copy(st, st + head_dim, row);
      for (size_t pos = 0; pos < head_dim; ++pos) st[SplitElement(pos, nd, parts)] = row[pos];
    }
  }
}

// Scaled queries, rotated when the keys are: [num_rows, head_dim].
void PrepareQueries(const KvLayerView& view, const float* q, size_t num_rows, float scale,
                    float* HWY_RESTRICT dst) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  for (size_t i = 0; i < num_rows * head_dim; ++i) dst[i] = q[i] * scale;
  if (view.keys_rotated) {
    for (size_t r = 0; r < num_rows; ++r) HadamardRotate({dst + r * head_dim, head_dim});
  }
}

// Runs fn(i) for i in [0, n) on the pool (or the calling thread).
template <class Fn>
void RunTasks(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  } else {
    pool->Run(n, fn);
  }
}

// The decode step's attention scores, from the logits the score pass kept and each query
// head's final max and softmax sum: p = exp(logit - max) / sum per (head, token), aggregated
// over the group and added into scores->out. One task per kv head (they write disjoint rows).
//   logits: [num_heads][logit_stride]; head_max, head_inv_sum: [num_heads]
void AddDecodeScores(const float* logits, size_t logit_stride, const float* head_max,
                     const float* head_inv_sum, int num_kv_heads, int group, int num_tokens,
                     const AttentionScores& scores, ThreadPool* pool) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const bool use_max = scores.aggregation == ScoreAggregation::kMax;
  const float group_weight = use_max ? 1.0f : 1.0f / static_cast<float>(group);
  RunTasks(pool, num_kv_heads, [&](int64_t kv_head, int /*thread_idx*/) {
    float* row = scores.out + kv_head * static_cast<int64_t>(scores.stride);
    const int first_head = static_cast<int>(kv_head) * group;
    size_t t = 0;
    for (; t + n <= static_cast<size_t>(num_tokens); t += n) {
      auto agg = hn::Zero(df);
      for (int head = first_head; head < first_head + group; ++head) {
        const auto logit = hn::LoadU(df, logits + head * logit_stride + t);
        const auto p = hn::Mul(hn::Exp(df, hn::Sub(logit, hn::Set(df, head_max[head]))),
                               hn::Set(df, head_inv_sum[head]));
        agg = use_max ? hn::Max(agg, p) : hn::Add(agg, p);
      }
      hn::StoreU(hn::MulAdd(agg, hn::Set(df, group_weight), hn::LoadU(df, row + t)), df, row + t);
    }
    for (; t < static_cast<size_t>(num_tokens); ++t) {
      float agg = 0.0f;
      for (int j = 0; j < group; ++j) {
        const int head = first_head + j;
        const float p =
            std::exp(logits[head * logit_stride + t] - head_max[head]) * head_inv_sum[head];
        agg = use_max ? std::max(agg, p) : agg + p;
      }
      row[t] += agg * group_weight;
    }
  });
}

template <class D>
void DecodeImpl(const KvLayerView& view, const float* q, const AttentionParams& params, float* out,
                ThreadPool* pool, const AttentionScores* scores) {
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const int num_kv_heads = view.num_kv_heads;
  const int group = params.num_heads / num_kv_heads;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const size_t lanes = hn::Lanes(D());
  const SideSpec k_arena = ArenaSide(view, view.k, true, lanes);
  const SideSpec v_arena = ArenaSide(view, view.v, false, lanes);
  SideSpec sinks, pending;
  sinks.fill = FillKind::kSinks;
  pending.fill = FillKind::kPending;

  // Split-K partials: the sinks, chunks of the arena, the pending tokens. Arena chunks start
  // on unit boundaries of both arenas, so no unit is read by two tasks.
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  const int num_arena = arena_end - arena_begin;
  const int align = std::lcm(std::max(1, view.k.group_tokens), std::max(1, view.v.group_tokens));
  const int wanted_chunks = (kDecodeTasksPerThread * num_threads + num_kv_heads - 1) / num_kv_heads;
  const int max_chunks = (num_arena + kMinDecodeChunk - 1) / kMinDecodeChunk;
  const int num_chunks = std::max(1, std::min(wanted_chunks, max_chunks));
  const int chunk_len = ((num_arena + num_chunks - 1) / num_chunks + align - 1) / align * align;
  std::vector<std::pair<FillKind, std::pair<int, int>>> ranges;
  if (view.sinks.end > 0) ranges.push_back({FillKind::kSinks, {0, view.sinks.end}});
  for (int c = 0; c < num_chunks; ++c) {
    // Boundaries on absolute multiples of the unit length (the first may sit mid-unit).
    const int b =
        c == 0 ? arena_begin : std::min(arena_end, (arena_begin + c * chunk_len) / align * align);
    const int e = c == num_chunks - 1
                      ? arena_end
                      : std::min(arena_end, (arena_begin + (c + 1) * chunk_len) / align * align);
    if (b < e) ranges.push_back({FillKind::kDirect, {b, e}});
  }
  if (arena_end < view.num_tokens)
    ranges.push_back({FillKind::kPending, {arena_end, view.num_tokens}});
  const int num_parts = static_cast<int>(ranges.size());
  const int num_tasks = num_kv_heads * num_parts;

  const size_t state_stride = head_dim + 2;
  const size_t q_floats = static_cast<size_t>(params.num_heads) * head_dim;
  // With scores: every head's logits, whole vectors apart, and its final max and 1 / sum.
  const size_t logit_stride =
      scores == nullptr ? 0 : (static_cast<size_t>(view.num_tokens) + 15) / 16 * 16;
  const size_t logit_floats = logit_stride * params.num_heads;
  const size_t stat_floats = scores == nullptr ? 0 : 2 * static_cast<size_t>(params.num_heads);
  thread_local std::vector<float> call_scratch;
  call_scratch.resize(q_floats + static_cast<size_t>(num_tasks) * group * state_stride +
                      logit_floats + stat_floats);
  float* q_scaled = call_scratch.data();
  float* states = q_scaled + q_floats;
  float* logits = scores == nullptr ? nullptr : states + num_tasks * group * state_stride;
  float* head_max = logits + logit_floats;
  float* head_inv_sum = head_max + params.num_heads;
  PrepareQueries(view, q, params.num_heads, params.scale, q_scaled);

  auto task = [&](int64_t task_idx, int /*thread_idx*/) {
    const int kv_head = static_cast<int>(task_idx / num_parts);
    const auto& [source, range] = ranges[task_idx % num_parts];
    const SideSpec& k_side = source == FillKind::kSinks     ? sinks
                             : source == FillKind::kPending ? pending
                                                            : k_arena;
    const SideSpec& v_side = source == FillKind::kSinks     ? sinks
                             : source == FillKind::kPending ? pending
                                                            : v_arena;
    float* state = states + static_cast<size_t>(task_idx) * group * state_stride;
    DecodeChunk<D>(view, k_side, v_side, kv_head, range.first, range.second,
                   q_scaled + static_cast<size_t>(kv_head) * group * head_dim, group, state,
                   logits == nullptr ? nullptr : logits + kv_head * group * logit_stride,
                   logit_stride);
  };
  RunTasks(pool, num_tasks, task);

  // Merge the partials of each query head: rescale each to the common max.
  for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
    for (int j = 0; j < group; ++j) {
      const float* first =
          states + (static_cast<size_t>(kv_head) * num_parts * group + j) * state_stride;
      const size_t part_stride = static_cast<size_t>(group) * state_stride;
      float global_max = kNegInf;
      for (int c = 0; c < num_parts; ++c) {
        global_max = std::max(global_max, first[c * part_stride + head_dim]);
      }
      float* o = out + (static_cast<size_t>(kv_head) * group + j) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      float denom = 0.0f;
      for (int c = 0; c < num_parts; ++c) {
        const float* st = first + c * part_stride;
        const float w = std::exp(st[head_dim] - global_max);
        if (w == 0.0f) continue;
        denom += w * st[head_dim + 1];
        for (size_t i = 0; i < head_dim; ++i) o[i] += w * st[i];
      }
      const float inv = 1.0f / denom;
      for (size_t i = 0; i < head_dim; ++i) o[i] *= inv;
      if (scores != nullptr) {
        head_max[kv_head * group + j] = global_max;
        head_inv_sum[kv_head * group + j] = inv;
      }
    }
  }
  if (scores != nullptr) {
    AddDecodeScores(logits, logit_stride, head_max, head_inv_sum, num_kv_heads, group,
                    view.num_tokens, *scores, pool);
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill.
//
// A task owns one kv head and a tile of consecutive queries; its rows are (query, head of the
// group) pairs, r = query_in_tile * group + j, padded to whole pairs of vectors. Everything is
// kept transposed — queries, scores and outputs as [head_dim or key][row] — so that one vector
// holds the same quantity for many rows: the softmax needs no horizontal reductions, and each
// key or value element is broadcast once and reused by a whole vector of rows. Keys and values
// are decoded one small tile at a time into per-thread scratch (like SRAM tiles on a GPU),
// amortised over every row of the query tile.

// St[k][rows] = Qt[:, rows] . Kf[k] for kKeysPerStep keys and two row vectors.
//   qt: [head_dim][row_stride], kf: [kKeysPerStep][head_dim], st: [kKeysPerStep][row_stride]
HWY_INLINE void ScoreStep(const float* HWY_RESTRICT qt, const float* HWY_RESTRICT kf,
                          size_t head_dim, size_t row_stride, float* HWY_RESTRICT st) {
  const DF df;
  const size_t n = hn::Lanes(df);
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
  for (size_t i = 0; i < head_dim; ++i) {
    const auto q0 = hn::LoadU(df, qt + i * row_stride);
    const auto q1 = hn::LoadU(df, qt + i * row_stride + n);
    const auto k0 = hn::Set(df, kf[i]);
    const auto k1 = hn::Set(df, kf[head_dim + i]);
    const auto k2 = hn::Set(df, kf[2 * head_dim + i]);
    const auto k3 = hn::Set(df, kf[3 * head_dim + i]);
    a00 = hn::MulAdd(q0, k0, a00);
    a01 = hn::MulAdd(q1, k0, a01);
    a10 = hn::MulAdd(q0, k1, a10);
    a11 = hn::MulAdd(q1, k1, a11);
    a20 = hn::MulAdd(q0, k2, a20);
    a21 = hn::MulAdd(q1, k2, a21);
    a30 = hn::MulAdd(q0, k3, a30);
    a31 = hn::MulAdd(q1, k3, a31);
  }
  hn::StoreU(a00, df, st);
  hn::StoreU(a01, df, st + n);
  hn::StoreU(a10, df, st + row_stride);
  hn::StoreU(a11, df, st + row_stride + n);
  hn::StoreU(a20, df, st + 2 * row_stride);
  hn::StoreU(a21, df, st + 2 * row_stride + n);
  hn::StoreU(a30, df, st + 3 * row_stride);
  hn::StoreU(a31, df, st + 3 * row_stride + n);
}

// Ot[i][rows] = Ot[i][rows] * alpha[rows] + sum_k P[k][rows] * Vf[k][i] for kDims dims i and
// two row vectors.
//   ot: [head_dim][row_stride], p: [num_keys][row_stride], vf: [num_keys][head_dim]
template <int kDims>
HWY_INLINE void AccumulateStep(const float* HWY_RESTRICT p, const float* HWY_RESTRICT vf,
                               size_t num_keys, size_t head_dim, size_t row_stride,
                               const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const auto alpha0 = hn::LoadU(df, alpha), alpha1 = hn::LoadU(df, alpha + n);
  hn::Vec<DF> a0[kDims], a1[kDims];
  for (int i = 0; i < kDims; ++i) {
    a0[i] = hn::Mul(hn::LoadU(df, ot + i * row_stride), alpha0);
    a1[i] = hn::Mul(hn::LoadU(df, ot + i * row_stride + n), alpha1);
  }
  for (size_t k = 0; k < num_keys; ++k) {
    const auto p0 = hn::LoadU(df, p + k * row_stride);
    const auto p1 = hn::LoadU(df, p + k * row_stride + n);
    for (int i = 0; i < kDims; ++i) {
      const auto v = hn::Set(df, vf[k * head_dim + i]);
      a0[i] = hn::MulAdd(p0, v, a0[i]);
      a1[i] = hn::MulAdd(p1, v, a1[i]);
    }
  }
  for (int i = 0; i < kDims; ++i) {
    hn::StoreU(a0[i], df, ot + i * row_stride);
    hn::StoreU(a1[i], df, ot + i * row_stride + n);
  }
}

// Loads keys or values [t0, t1) as F32 rows into [kPrefillKeyTile][head_dim], zero-padding
// to a whole number of kKeysPerStep.
void LoadTile(const KvLayerView& view, bool keys, int kv_head, int t0, int t1,
              float* HWY_RESTRICT tile) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  LoadTokensF32(view, keys, kv_head, t0, t1, tile);
  const int padded = (t1 - t0 + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
  std::fill(tile + static_cast<size_t>(t1 - t0) * head_dim,
            tile + static_cast<size_t>(padded) * head_dim, 0.0f);
}

// The main prefill pass. With `stats` (for attention scores), also leaves each row's final
// softmax max and sum for queries [first_scored, num_queries):
//   stats: [num_queries - first_scored][num_heads][2] (max, sum), or null
void PrefillImpl(const KvLayerView& view, const float* q, int num_queries,
                 const AttentionParams& params, float* out, ThreadPool* pool, int first_scored,
                 float* stats) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const int group = params.num_heads / view.num_kv_heads;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int first_query_pos = view.num_tokens - num_queries;
  // About four row vectors' worth of rows per tile, but at least one query.
  const int queries_per_tile = std::max(1, static_cast<int>(4 * n) / group);
  const int num_tiles = (num_queries + queries_per_tile - 1) / queries_per_tile;
  const size_t row_block = 2 * n;
  const size_t row_stride =
      (static_cast<size_t>(queries_per_tile) * group + row_block - 1) / row_block * row_block;

  auto task = [&](int64_t task_idx, int /*thread_idx*/) {
    // Latest query tiles attend to the most keys: hand them out first.
    const int tile_idx = num_tiles - 1 - static_cast<int>(task_idx % num_tiles);
    const int kv_head = static_cast<int>(task_idx / num_tiles);
    const int q0 = tile_idx * queries_per_tile;
    const int q1 = std::min(num_queries, q0 + queries_per_tile);
    const int num_rows = (q1 - q0) * group;

    float* qt = Scratch(kSlotScores, row_stride * (2 * head_dim + kPrefillKeyTile + 4) +
                                         2 * kPrefillKeyTile * head_dim);
    float* qrow = Scratch(kSlotQuery, head_dim);         // one scaled (and rotated) query
    float* ot = qt + head_dim * row_stride;              // [head_dim][row_stride]
    float* st = ot + head_dim * row_stride;              // [kPrefillKeyTile][row_stride]
    float* row_max = st + kPrefillKeyTile * row_stride;  // [row_stride]
    float* row_sum = row_max + row_stride;               // [row_stride]
    float* alpha = row_sum + row_stride;                 // [row_stride]
    float* row_limit = alpha + row_stride;               // [row_stride] last allowed key
    float* kf = row_limit + row_stride;                  // [kPrefillKeyTile][head_dim]
    float* vf = kf + kPrefillKeyTile * head_dim;         // [kPrefillKeyTile][head_dim]

    for (size_t r = 0; r < row_stride; ++r) {
      // Padding rows repeat the tile's last query so that their softmax stays finite.
      const int qi = std::min(static_cast<int>(r) / group, q1 - q0 - 1);
      const int j = static_cast<int>(r) % group;
      const bool real = static_cast<int>(r) < num_rows;
      PrepareQueries(
          view,
          q + (static_cast<size_t>(q0 + qi) * params.num_heads + kv_head * group + j) * head_dim, 1,
          params.scale, qrow);
      for (size_t i = 0; i < head_dim; ++i) {
        qt[i * row_stride + r] = real ? qrow[i] : 0.0f;
        ot[i * row_stride + r] = 0.0f;
      }
      row_max[r] = kNegInf;
      row_sum[r] = 0.0f;
      row_limit[r] = static_cast<float>(first_query_pos + q0 + qi);
    }
    const int min_limit = first_query_pos + q0;
    const int num_keys_total = first_query_pos + q1;  // the tile's last query sees these

    for (int t0 = 0; t0 < num_keys_total; t0 += kPrefillKeyTile) {
      const int t1 = std::min(num_keys_total, t0 + kPrefillKeyTile);
      const size_t num_keys = static_cast<size_t>(t1 - t0);
      const size_t num_steps = (num_keys + kKeysPerStep - 1) / kKeysPerStep;
      LoadTile(view, true, kv_head, t0, t1, kf);
      LoadTile(view, false, kv_head, t0, t1, vf);
      // Only the diagonal tiles hold keys past some row's causal limit. (The zero-padded keys
      // of a short last tile are scored but never read.)
      const bool masked = t1 - 1 > min_limit;
      for (size_t rb = 0; rb < row_stride; rb += row_block) {
        for (size_t step = 0; step < num_steps; ++step) {
          ScoreStep(qt + rb, kf + step * kKeysPerStep * head_dim, head_dim, row_stride,
                    st + step * kKeysPerStep * row_stride + rb);
        }
        for (size_t h = 0; h < row_block; h += n) {
          const size_t r = rb + h;
          if (masked) {
            const auto limit = hn::LoadU(df, row_limit + r);
            for (size_t k = 0; k < num_keys; ++k) {
              float* s = st + k * row_stride + r;
              const auto pos = hn::Set(df, static_cast<float>(t0 + static_cast<int>(k)));
              hn::StoreU(hn::IfThenElse(hn::Gt(pos, limit), hn::Set(df, kNegInf), hn::LoadU(df, s)),
                         df, s);
            }
          }
          auto vmax = hn::LoadU(df, row_max + r);
          const auto old_max = vmax;
          for (size_t k = 0; k < num_keys; ++k) {
            vmax = hn::Max(vmax, hn::LoadU(df, st + k * row_stride + r));
          }
          auto vsum = hn::Zero(df);
          for (size_t k = 0; k < num_keys; ++k) {
            float* s = st + k * row_stride + r;
            const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, s), vmax));
            hn::StoreU(p, df, s);
            vsum = hn::Add(vsum, p);
          }
          // Exp(-inf) == 0: the first tile starts the accumulator from nothing.
          const auto va = hn::Exp(df, hn::Sub(old_max, vmax));
          hn::StoreU(va, df, alpha + r);
          hn::StoreU(hn::MulAdd(hn::LoadU(df, row_sum + r), va, vsum), df, row_sum + r);
          hn::StoreU(vmax, df, row_max + r);
        }
        size_t i = 0;
        for (; i + 4 <= head_dim; i += 4) {
          AccumulateStep<4>(st + rb, vf + i, num_keys, head_dim, row_stride, alpha + rb,
                            ot + i * row_stride + rb);
        }
        for (; i < head_dim; ++i) {
          AccumulateStep<1>(st + rb, vf + i, num_keys, head_dim, row_stride, alpha + rb,
                            ot + i * row_stride + rb);
        }
      }
    }

    for (int r = 0; r < num_rows; ++r) {
      const int qi = r / group;
      const int j = r % group;
      float* orow =
          out + (static_cast<size_t>(q0 + qi) * params.num_heads + kv_head * group + j) * head_dim;
      const float inv = 1.0f / row_sum[r];
      for (size_t i = 0; i < head_dim; ++i) orow[i] = ot[i * row_stride + r] * inv;
      const int query = q0 + qi;
      if (stats != nullptr && query >= first_scored) {
        float* stat = stats + (static_cast<size_t>(query - first_scored) * params.num_heads +
                               kv_head * group + j) *
                                  2;
        stat[0] = row_max[r];
        stat[1] = row_sum[r];
      }
    }
  };
  RunTasks(pool, static_cast<int64_t>(view.num_kv_heads) * num_tiles, task);
}

// The attention scores of prefill queries [scores.first_query, num_queries): a second pass
// that recomputes their logits tile by tile with the main pass's arithmetic (ScoreStep on the
// same decoded keys, so the same floats), turns them into probabilities with the main pass's
// final max and sum (`stats`, as PrefillImpl leaves them), aggregates over the group and adds
// them up per key. Cost: one more q.k pass (no p.v, no online rescaling) over the scored
// queries' keys, i.e. about half the main pass's arithmetic when every query is scored (H2O,
// first_query 0) and W / num_queries of it for a window of W queries (SnapKV, TOVA). A task
// owns one kv head and one range of keys, so no two tasks add into the same scores.
void PrefillScores(const KvLayerView& view, const float* q, int num_queries,
                   const AttentionParams& params, const AttentionScores& scores, const float* stats,
                   ThreadPool* pool) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const int group = params.num_heads / view.num_kv_heads;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const int first_query_pos = view.num_tokens - num_queries;
  const size_t block = 2 * n;  // queries per block: the two row vectors of a ScoreStep
  const bool use_max = scores.aggregation == ScoreAggregation::kMax;
  const float group_weight = use_max ? 1.0f : 1.0f / static_cast<float>(group);
  const int num_key_tiles = (view.num_tokens + kPrefillKeyTile - 1) / kPrefillKeyTile;
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const int wanted_chunks =
      (kDecodeTasksPerThread * num_threads + view.num_kv_heads - 1) / view.num_kv_heads;
  const int tiles_per_chunk = (num_key_tiles + std::min(wanted_chunks, num_key_tiles) - 1) /
                              std::min(wanted_chunks, num_key_tiles);
  const int chunk_len = tiles_per_chunk * kPrefillKeyTile;
  const int num_chunks = (num_key_tiles + tiles_per_chunk - 1) / tiles_per_chunk;

  auto task = [&](int64_t task_idx, int /*thread_idx*/) {
    const int kv_head = static_cast<int>(task_idx / num_chunks);
    const int k0 = static_cast<int>(task_idx % num_chunks) * chunk_len;
    const int k1 = std::min(view.num_tokens, k0 + chunk_len);
    float* qt = Scratch(kSlotScores, group * (head_dim + 2) * block + block +
                                         kPrefillKeyTile * (2 * block + head_dim) + chunk_len);
    float* row_max = qt + group * head_dim * block;  // [group][block]
    float* inv_sum = row_max + group * block;        // [group][block]
    float* limit = inv_sum + group * block;          // [block] last allowed key
    float* st = limit + block;                       // [kPrefillKeyTile][block]
    float* agg = st + kPrefillKeyTile * block;       // [kPrefillKeyTile][block]
    float* kf = agg + kPrefillKeyTile * block;       // [kPrefillKeyTile][head_dim]
    float* acc = kf + kPrefillKeyTile * head_dim;    // [chunk_len]
    float* qrow = Scratch(kSlotQuery, head_dim);
    std::fill(acc, acc + chunk_len, 0.0f);

    for (int b0 = scores.first_query; b0 < num_queries; b0 += static_cast<int>(block)) {
      const int b1 = std::min(num_queries, b0 + static_cast<int>(block));
      const int keys_end = std::min(k1, first_query_pos + b1);  // the block's last query sees
      if (keys_end <= k0) continue;
      // Rows past b1 are padding: zero queries, weight 0 and every key masked.
      for (size_t r = 0; r < block; ++r) {
        const int query = b0 + static_cast<int>(r);
        const bool real = query < b1;
        limit[r] = real ? static_cast<float>(first_query_pos + query) : -1.0f;
        for (int j = 0; j < group; ++j) {
          const int head = kv_head * group + j;
          const float* stat =
              stats +
              (static_cast<size_t>(query - scores.first_query) * params.num_heads + head) * 2;
          if (real) {
            PrepareQueries(view,
                           q + (static_cast<size_t>(query) * params.num_heads + head) * head_dim, 1,
                           params.scale, qrow);
          }
          for (size_t i = 0; i < head_dim; ++i) {
            qt[(j * head_dim + i) * block + r] = real ? qrow[i] : 0.0f;
          }
          row_max[j * block + r] = real ? stat[0] : 0.0f;
          inv_sum[j * block + r] = real ? 1.0f / stat[1] : 0.0f;
        }
      }
      for (int t0 = k0; t0 < keys_end; t0 += kPrefillKeyTile) {
        const int t1 = std::min(keys_end, t0 + kPrefillKeyTile);
        const size_t num_keys = static_cast<size_t>(t1 - t0);
        LoadTile(view, true, kv_head, t0, t1, kf);
        for (int j = 0; j < group; ++j) {
          for (size_t step = 0; step * kKeysPerStep < num_keys; ++step) {
            ScoreStep(qt + j * head_dim * block, kf + step * kKeysPerStep * head_dim, head_dim,
                      block, st + step * kKeysPerStep * block);
          }
          for (size_t k = 0; k < num_keys; ++k) {
            const auto pos = hn::Set(df, static_cast<float>(t0 + static_cast<int>(k)));
            for (size_t h = 0; h < block; h += n) {
              const auto logit = hn::LoadU(df, st + k * block + h);
              const auto p =
                  hn::Mul(hn::Exp(df, hn::Sub(logit, hn::LoadU(df, row_max + j * block + h))),
                          hn::LoadU(df, inv_sum + j * block + h));
              const auto masked = hn::IfThenZeroElse(hn::Gt(pos, hn::LoadU(df, limit + h)), p);
              float* a = agg + k * block + h;
              const auto prev = j == 0 ? hn::Zero(df) : hn::LoadU(df, a);
              hn::StoreU(use_max ? hn::Max(prev, masked) : hn::Add(prev, masked), df, a);
            }
          }
        }
        for (size_t k = 0; k < num_keys; ++k) {
          const auto both =
              hn::Add(hn::LoadU(df, agg + k * block), hn::LoadU(df, agg + k * block + n));
          acc[t0 - k0 + static_cast<int>(k)] +=
              hn::GetLane(hn::SumOfLanes(df, both)) * group_weight;
        }
      }
    }
    float* row = scores.out + static_cast<size_t>(kv_head) * scores.stride;
    for (int t = k0; t < k1; ++t) row[t] += acc[t - k0];
  };
  RunTasks(pool, static_cast<int64_t>(view.num_kv_heads) * num_chunks, task);
}

// ---------------------------------------------------------------------------------------------
// Entry: the one runtime switch over the vector width; codecs are chosen per tile.

}  // namespace

void AttentionKernel(const KvLayerView& view, const float* q, int num_queries,
                     const AttentionParams& params, float* out, ThreadPool* pool,
                     const AttentionScores* scores) {
  if (num_queries > 1) {
    if (scores == nullptr) return PrefillImpl(view, q, num_queries, params, out, pool, 0, nullptr);
    thread_local std::vector<float> stats;  // [scored queries][num_heads][2]
    stats.resize(static_cast<size_t>(num_queries - scores->first_query) * params.num_heads * 2);
    PrefillImpl(view, q, num_queries, params, out, pool, scores->first_query, stats.data());
    return PrefillScores(view, q, num_queries, params, *scores, stats.data(), pool);
  }
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const DF df;
  if (head_dim % hn::Lanes(df) == 0) return DecodeImpl<DF>(view, q, params, out, pool, scores);
  if (head_dim % 4 == 0) {
    return DecodeImpl<hn::CappedTag<float, 4>>(view, q, params, out, pool, scores);
  }
  DecodeImpl<hn::CappedTag<float, 1>>(view, q, params, out, pool, scores);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(AttentionKernel);

void Attention(const KvLayerView& view, const float* q, int num_queries,
               const AttentionParams& params, float* out, ThreadPool* pool,
               const AttentionScores* scores) {
  KVS_CHECK(view.num_kv_heads > 0 && view.head_dim > 0);
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  KVS_CHECK(!view.keys_rotated || IsPowerOfTwo(view.head_dim));
  if (num_queries == 0) return;
  if (scores != nullptr) {
    KVS_CHECK(scores->out != nullptr && scores->stride >= view.num_tokens);
    KVS_CHECK(0 <= scores->first_query && scores->first_query < num_queries);
  }
  HWY_DYNAMIC_DISPATCH(AttentionKernel)(view, q, num_queries, params, out, pool, scores);
}

}  // namespace kvstack
#endif  // HWY_ONCE
