// Per-target code (included by the attention kernels' .cc files inside their
// hwy/foreach_target.h pass) shared by decode and prefill: per-thread scratch, how one stored row
// reads into F32 registers (floats as stored, integer codes unpacked, split order for packed
// codes), decoding arena tokens with the codec's own Decode, and the scaled (rotated) queries.
// The include guard toggles per target, as Highway's -inl.h headers do.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"
#include "kvstack/numeric.h"
#include "represent/hadamard.h"

#if defined(KVSTACK_RUN_ATTENTION_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_ROWS_INL_H_
#undef KVSTACK_RUN_ATTENTION_ROWS_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_ROWS_INL_H_
#endif

#include "hwy/highway.h"
#include "run/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Tasks per thread that decode and the prefill scores split their work into (load balance).
constexpr int kTasksPerThread = 4;

// Independent per-thread scratch buffers, so one use never invalidates another.
enum ScratchSlot {
  kSlotScores,
  kSlotKeys,
  kSlotValues,
  kSlotUnit,
  kSlotHeaders,
  kSlotQuery,
  kSlotSplitQuery,
  kSlotSplitState,
  kSlotBf16Weights,
  kSlotWeightStats,
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
  kFp8E4M3,  // [f16 scale][fp8 codes]; loads the unscaled fp8 values times 2^-8 (RowScale)
  kFp8E5M2,
  // kFp8E4M3 for the rows of a tile that hold no NaN code (checked per tile, AnyE4M3Nan):
  // loads them without turning NaN codes into NaN, 3 of 8 operations per vector.
  kFp8E4M3Finite,
  // kBF16 rows (keys and values) in split order (LoadSplit, SplitOrderReader): a BF16 is the
  // upper half of an F32, so the even elements of a dword are a shift away and the odd ones a
  // mask: one operation per Lanes(d) elements where widening costs two.
  kBF16Pairs,
  // kFp8E4M3 rows in kBF16Pairs' split order (SplitOrderReader): each code becomes BF16 bits
  // by a sign-extending widening, a shift and a mask per 2 Lanes(d) codes, then is read as a
  // BF16 pair; no IEEE-half conversion, which issues once per cycle where FMAs issue twice (Zen
  // 3). Values are loaded times 2^-120 (see kE4M3PairsScale). kFp8E4M3PairsFinite: for the
  // rows of a tile that hold no NaN code (AnyE4M3Nan).
  kFp8E4M3Pairs,
  kFp8E4M3PairsFinite,
};

constexpr bool IsE4M3PairsReader(Reader r) {
  return r == Reader::kFp8E4M3Pairs || r == Reader::kFp8E4M3PairsFinite;
}

// kFp8E4M3Pairs loads E4M3 value v as the F32 v * 2^-120: its 4 exponent bits become the low
// bits of an F32 exponent of bias 127 where E4M3's is 7, so E4M3's subnormals are F32
// subnormals and exact. Left there, products with a query element or a weight would underflow,
// so the query (SplitQueries) and the weights (RowScaleFactor) take 2^60 each, and the scores'
// row scales (RowScaleFactor) and the value states (SplitOrderFactor) the other 2^60; 2^60
// keeps a largest F16 row scale (65504) times a weight of 1 far below F32's largest.
constexpr float kE4M3PairsScale = 0x1p60f;

// Readers of [f16 scale][8-bit elements] rows: the scale multiplies the score or the weight.
constexpr bool IsE4M3Reader(Reader r) {
  return r == Reader::kFp8E4M3 || r == Reader::kFp8E4M3Finite;
}
constexpr bool IsRowScaled(Reader r) {
  return r == Reader::kInt8 || IsE4M3Reader(r) || r == Reader::kFp8E5M2 || IsE4M3PairsReader(r);
}

// What a row-scaled reader's loaded values are multiplied by besides the row's scale: E4M3
// loads its values times 2^-8 (see LoadRow), kFp8E4M3Pairs times 2^-120 (the query carries
// 2^60 of it, kE4M3PairsScale).
constexpr float RowScaleFactor(Reader r) {
  return IsE4M3Reader(r) ? 256.0f : IsE4M3PairsReader(r) ? kE4M3PairsScale : 1.0f;
}
// What a split reader's query is multiplied by (SplitQueries), and its value states when they go
// back to element order: the same factor, the half of kFp8E4M3Pairs' 2^-120 that the row scales
// do not take.
constexpr float SplitOrderFactor(Reader r) { return IsE4M3PairsReader(r) ? kE4M3PairsScale : 1; }

// Readers of 8-bit floating-point codes, in any of their forms.
constexpr bool IsFp8CodeReader(Reader r) {
  return IsE4M3Reader(r) || r == Reader::kFp8E5M2 || IsE4M3PairsReader(r);
}

constexpr bool IsFloatReader(Reader r) {
  return r == Reader::kF32 || r == Reader::kF16 || r == Reader::kBF16;
}
constexpr int ReaderBits(Reader r) {
  return r == Reader::kInt4 || r == Reader::kKivi4 || r == Reader::kInt4S ? 4
         : r == Reader::kInt2 || r == Reader::kKivi2                      ? 2
                                                                          : 8;
}

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
// instead: queries are permuted into it once per task and value accumulators are permuted
// back once per task. Position p of a row in split order holds element SplitElement(p).
HWY_INLINE size_t SplitElement(size_t pos, size_t lanes, size_t parts) {
  const size_t block = lanes * parts;
  const size_t in_block = pos % block;
  return pos - in_block + (in_block % lanes) * parts + in_block / lanes;
}

// Readers of BF16 pairs in dwords: BF16 rows, and E4M3 rows widened to BF16 bits.
constexpr bool IsPairsReader(Reader r) { return r == Reader::kBF16Pairs || IsE4M3PairsReader(r); }

constexpr bool IsSplitReader(Reader r) {
  return r == Reader::kInt4S || r == Reader::kKivi4 || r == Reader::kKivi2 || IsPairsReader(r);
}
// Parts per lane of a split reader: its elements per byte, or per dword of BF16 pairs.
constexpr int SplitParts(Reader r) { return IsPairsReader(r) ? 2 : 8 / ReaderBits(r); }

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

// One split block of a split reader's row (SplitParts(kR) * Lanes(d) elements from `first`), one
// lane per byte of codes or per dword of BF16 pairs.
template <Reader kR, class D>
HWY_INLINE hn::Vec<hn::Rebind<int32_t, D>> LoadSplit(D d, const std::byte* row, size_t first) {
  if constexpr (kR == Reader::kBF16Pairs) {
    const hn::Rebind<int32_t, D> di;
    return hn::LoadU(di, reinterpret_cast<const int32_t*>(row) + first / 2);
  } else if constexpr (IsE4M3PairsReader(kR)) {
    // 2 Lanes(d) codes sign-extended to 16 bits and shifted left by 4: the sign in bit 15
    // (copies in bits 11..14, masked off), exponent and mantissa in bits 4..10, the BF16 bits of
    // the E4M3 value times 2^-120 (kE4M3PairsScale). The NaN codes (0x7F, 0xFF) would read as
    // 1.875 * 2^-112: kFp8E4M3Pairs makes them a BF16 NaN.
    const hn::Rebind<int32_t, D> di;
    const hn::Repartition<int16_t, decltype(di)> di16;
    const hn::Rebind<int8_t, decltype(di16)> di8;
    const auto codes = hn::PromoteTo(
        di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(row + sizeof(uint16_t)) + first));
    auto bits = hn::And(hn::ShiftLeft<4>(codes), hn::Set(di16, static_cast<int16_t>(0x87F0)));
    if constexpr (kR == Reader::kFp8E4M3Pairs) {
      const auto magnitude = hn::Set(di16, int16_t{0x07F0});
      bits = hn::IfThenElse(hn::Eq(hn::And(bits, magnitude), magnitude),
                            hn::Set(di16, int16_t{0x7FC0}), bits);
    }
    return hn::BitCast(di, bits);
  } else {
    return LoadSplitBlock<ReaderBits(kR)>(d, row, first);
  }
}

// Part r of a block from LoadSplit as floats: codes (not dequantised), or BF16 elements 2l + r.
template <Reader kR, class D>
HWY_INLINE hn::Vec<D> SplitPartOf(D d, hn::Vec<hn::Rebind<int32_t, D>> block, int r) {
  if constexpr (IsPairsReader(kR)) {
    const hn::Rebind<int32_t, D> di;
    return hn::BitCast(d, r == 0 ? hn::ShiftLeft<16>(block)
                                 : hn::And(block, hn::Set(di, static_cast<int32_t>(0xFFFF0000u))));
  } else {
    return SplitPart<ReaderBits(kR)>(d, block, r);
  }
}

// IEEE halves to F32, infinities and NaNs included: on targets without F16C, Highway's
// emulated PromoteTo turns the all-ones exponent into finite values of magnitude >= 2^16, which
// no finite half reaches (its largest is 65504), so those are put right here.
template <class D>
HWY_INLINE hn::Vec<D> HalfToF32(D d, hn::Vec<hn::Rebind<hwy::float16_t, D>> halves) {
  const auto f = hn::PromoteTo(d, halves);
#if HWY_TARGET >= HWY_SSE4
  const auto magnitude = hn::Abs(f);
  const auto limit = hn::Set(d, 65536.0f);
  const auto special =
      hn::IfThenElse(hn::Eq(magnitude, limit), hn::Set(d, std::numeric_limits<float>::infinity()),
                     hn::Set(d, std::numeric_limits<float>::quiet_NaN()));
  return hn::IfThenElse(hn::Ge(magnitude, limit), hn::CopySign(special, f), f);
#else
  return f;
#endif
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
    return HalfToF32(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(row) + i));
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
    return HalfToF32(d, hn::BitCast(hn::Rebind<hwy::float16_t, D>(),
                                    hn::ShiftLeft<8>(hn::PromoteTo(du16, bytes))));
  } else if constexpr (IsE4M3Reader(kR)) {
    // The sign-extended code shifted left by 7 puts the sign in bit 15 (and a copy in bit 14,
    // cleared) and exponent and mantissa in bits 7..13: an IEEE half whose value is the E4M3
    // value times 2^-8, subnormals included (E4M3's exponent bias is 7, the half's 15; the
    // row's scale takes the 2^8, see RowScale). 0x7F and 0xFF are NaN (kFp8E4M3Finite: none
    // in these rows).
    const hn::Rebind<int8_t, D> di8;
    const hn::Rebind<int16_t, D> di16;
    const hn::Rebind<hwy::float16_t, D> df16;
    const auto codes = hn::PromoteTo(
        di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(row + sizeof(uint16_t)) + i));
    const auto half = hn::And(hn::ShiftLeft<7>(codes), hn::Set(di16, int16_t{-0x4001}));
    if constexpr (kR == Reader::kFp8E4M3Finite) return HalfToF32(d, hn::BitCast(df16, half));
    const auto nan = hn::Eq(hn::And(half, hn::Set(di16, 0x7FFF)), hn::Set(di16, 0x3F80));
    return HalfToF32(d, hn::BitCast(df16, hn::IfThenElse(nan, hn::Set(di16, 0x7E00), half)));
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

// Scaled queries, rotated when the keys are: [num_rows, head_dim].
void PrepareQueries(const KvLayerView& view, const float* q, size_t num_rows, float scale,
                    float* HWY_RESTRICT dst) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  for (size_t i = 0; i < num_rows * head_dim; ++i) dst[i] = q[i] * scale;
  if (view.keys_rotated) {
    for (size_t r = 0; r < num_rows; ++r) HadamardRotate({dst + r * head_dim, head_dim});
  }
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
