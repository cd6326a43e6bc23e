// Per-target decode readers (included by attention_decode.cc inside its foreach_target pass):
// where a tile's keys and values are (FillRows), which reader each arena's storage format takes
// (ArenaSide), and the readers themselves, specialised at compile time per format: scores of
// four key rows against up to four query heads at a time, and weighted sums of value rows into
// accumulators that stay in registers, dequantising in registers. Key and value readers are
// chosen independently per tile, so every (key codec, value codec) pair gets both fast paths
// without instantiating the pairs.

#include "represent/codec_name.h"
#include "run/attention_rows-inl.h"

#if defined(KVSTACK_RUN_ATTENTION_READERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVSTACK_RUN_ATTENTION_READERS_INL_H_
#undef KVSTACK_RUN_ATTENTION_READERS_INL_H_
#else
#define KVSTACK_RUN_ATTENTION_READERS_INL_H_
#endif

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "run/lane_sums-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Keys per score tile (scores of one tile stay in L1 between the passes) and the smallest
// chunk of keys worth a task of its own.
constexpr int kDecodeTile = 256;
constexpr int kMinDecodeChunk = 256;
constexpr size_t kPrefetchAhead = 16;  // keys
constexpr size_t kCacheLine = 64;
// Integer-group readers keep a row's (scale, min) pairs as floats on the stack: at most this
// many floats (16 groups). Rows with more groups take the generic path.
constexpr int kMaxHeaderFloats = 32;

// An F16 scalar (headers and row scales).
float LoadF16Scalar(const std::byte* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return F16ToF32(bits);
}

// The f16 scales at the start of rows[0, Lanes(d)) (row-scaled readers, IsRowScaled), as floats,
// one lane each. d: a tag of a fixed number of lanes.
template <class D>
HWY_INLINE hn::Vec<D> LoadRowScales(D d, const std::byte* const* rows) {
  HWY_ALIGN uint16_t bits[hn::MaxLanes(D())];
  for (size_t i = 0; i < hn::Lanes(d); ++i) std::memcpy(&bits[i], rows[i], sizeof(uint16_t));
  const hn::Rebind<hwy::float16_t, D> d16;
  return hn::PromoteTo(d, hn::Load(d16, reinterpret_cast<const hwy::float16_t*>(bits)));
}

// The factor of a row-scaled reader's row (IsRowScaled): its f16 scale, times what LoadRow
// leaves out of the values.
template <Reader kR>
float RowScale(const std::byte* row) {
  return LoadF16Scalar(row) * RowScaleFactor(kR);
}

// The factors of rows[0, num_rows) of a row-scaled reader (RowScale), num_rows rounded up to 4
// (the rows are padded to whole 16s): scales[0, num_rows4).
template <Reader kR>
void LoadRowScalesOfTile(const std::byte* const* rows, size_t num_rows,
                         float* HWY_RESTRICT scales) {
  const hn::CappedTag<float, 4> d4;
  for (size_t r = 0; r < num_rows; r += 4) {
    hn::StoreU(hn::Mul(LoadRowScales(d4, rows + r), hn::Set(d4, RowScaleFactor(kR))), d4,
               scales + r);
  }
}

struct RowRequests;

// Where the keys (or values) of one tile are: rows[i] is the data of tile key i in the reader's
// format, hdrs[i] its header (integer groups and KIVI units). Padded to a multiple of 16 keys by
// repeating the last key.
struct RowSet {
  const std::byte* rows[kDecodeTile];
  const std::byte* hdrs[kDecodeTile];
  int group_elems = 0;            // kInt4/kInt2: elements per (scale, min) pair within a row
  int num_header_floats = 0;      // kInt4/kInt2: 2 * groups per row
  size_t prefetch_bytes = 0;      // bytes worth prefetching per row (0: do not prefetch)
  size_t prefetch_lead = 0;       // header bytes before a unit's first row (tiles, KIVI units)
  bool requests_into_l2 = false;  // RequestLine's cache level
  bool absmax_header = false;     // header holds one f16 d per group: (scale, min) = (d, -8 d)
  // Rows of another tile that the readers of this set request as they go (RequestStep), or
  // null. A value pass's set carries the next tile's keys.
  RowRequests* requests = nullptr;
};

// Scores of keys read as unscaled codes (row-scaled readers, IsRowScaled) times each key
// row's factor, once per tile: s[j * s_stride + key] for key < num_keys, j < group.
template <Reader kR>
void ScaleScoresByRows(const RowSet& keys, size_t num_keys, int group, float* HWY_RESTRICT s,
                       size_t s_stride) {
  float* scales = Scratch(kSlotHeaders, (num_keys + 3) / 4 * 4);
  LoadRowScalesOfTile<kR>(keys.rows, num_keys, scales);
  for (int j = 0; j < group; ++j) {
    for (size_t key = 0; key < num_keys; ++key) s[j * s_stride + key] *= scales[key];
  }
}

// How a tile's keys or values are found and read.
enum class FillKind {
  kDirect,   // T = 1 rows read in place (floats, int8, per-token integer groups)
  kSpanned,  // integer groups spanning T > 1 tokens: header = unit, codes = the token's slice
  kKivi,     // KIVI keys: header = unit (per-channel pairs), codes = the token's slice
  kDecoded,  // any other codec: decoded into scratch, read as F32
  kUntiled,  // -t16 tiles for readers of rows: each token's row copied out of its tile
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
  // -t16 tiles (codec_name.h): units of 16 tokens whose header pairs (and key codes) are stored
  // by column, value codes by quads of 4 tokens. FillRows fills them as spanned units (hdrs: the
  // unit; rows: unit + code_offset + t * row_code_bytes, which for values is where token t's quad
  // starts when t is its first and for keys only says t); only the VNNI integer readers (and for
  // keys the AVX2 ones) read them so (the others take UntiledSide).
  bool tiled = false;
  TileGeometry tile() const {
    return {static_cast<size_t>(num_header_floats / 2), code_offset, row_code_bytes};
  }
};

// The side that reads -t16 tiles as rows (FillKind::kUntiled): each token's header pairs and
// codes copied out of its tile into scratch in the untiled layout, then read by the row readers.
inline SideSpec UntiledSide(const SideSpec& tiled) {
  SideSpec side = tiled;
  side.fill = FillKind::kUntiled;
  side.tiled = false;
  return side;
}

// Copies token t of a -t16 tile `unit` into `row` in the untiled layout: [num_groups x (scale,
// min)][codes].
inline void UntileRow(const TileGeometry& tile, bool keys, const std::byte* unit, int t,
                      std::byte* row) {
  if (keys) {
    tile.ForEachRowPiece(keys, static_cast<size_t>(t),
                         [&](size_t in_row, size_t in_tile, size_t n) {
                           std::memcpy(row + in_row, unit + in_tile, n);
                         });
    return;
  }
  // Values: the header pairs, then every 4th byte of the quad (one loop, not a call per byte).
  for (size_t g = 0; g < tile.num_groups; ++g) {
    std::memcpy(row + 4 * g, unit + tile.HeaderPair(g, static_cast<size_t>(t)), 4);
  }
  std::byte* codes = row + 4 * tile.num_groups;
  const std::byte* from = unit + tile.ValueByte(0, static_cast<size_t>(t));
  for (size_t b = 0; b < tile.row_code_bytes; ++b) codes[b] = from[kQuadTokens * b];
}

// Fills rows[0, t1 - t0) for one side, padded to a multiple of 4 with the last row.
void FillRows(const KvLayerView& view, const SideSpec& side, bool keys, int kv_head, int t0, int t1,
              RowSet* set) {
  const int num_keys = t1 - t0;
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  set->group_elems = side.group_elems;
  set->num_header_floats = side.num_header_floats;
  set->absmax_header = side.absmax_header;
  set->prefetch_bytes = 0;
  set->prefetch_lead = side.tiled || side.fill == FillKind::kKivi ? side.code_offset : 0;
  set->requests_into_l2 = !IsFp8CodeReader(side.reader);
  set->requests = nullptr;
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
    case FillKind::kUntiled: {
      const KvArenaView& arena = *side.arena;
      const size_t header_bytes = 2 * static_cast<size_t>(side.num_header_floats);
      const size_t row_bytes = header_bytes + side.row_code_bytes;
      std::byte* buffer = reinterpret_cast<std::byte*>(
          Scratch(keys ? kSlotKeys : kSlotValues, (kDecodeTile * row_bytes + 3) / 4));
      view.ForEachRun(t0, t1, [&](int logical, int count, int32_t block_id, int row) {
        for (int r = 0; r < count; ++r) {
          const int i = logical - t0 + r;
          std::byte* out = buffer + i * row_bytes;
          UntileRow(side.tile(), keys, arena.Unit(block_id, (row + r) / kTileTokens, kv_head),
                    (row + r) % kTileTokens, out);
          set->hdrs[i] = out;
          set->rows[i] = out + header_bytes;
        }
      });
      break;
    }
    case FillKind::kDirect:
    case FillKind::kSpanned:
    case FillKind::kKivi: {
      const KvArenaView& arena = *side.arena;
      const int group_tokens = arena.group_tokens;
      set->prefetch_bytes = group_tokens == 1 ? arena.unit_bytes : side.row_code_bytes;
      // Runs over whole blocks where they lie back to back (ArenaRunAt), in this loop rather
      // than a ForEachRun callback, which is compiled for the baseline target and so calls it
      // once per block: with blocks of 16 tokens that made 7 % of int4's decode at 32k.
      for (int logical = t0; logical < t1;) {
        const KvLayerView::Run run = view.ArenaRunAt(arena, logical, t1);
        const std::byte** hdrs = set->hdrs + (logical - t0);
        const std::byte** rows = set->rows + (logical - t0);
        logical += run.count;
        if (group_tokens == 1) {  // rows one unit apart: no division per row
          const std::byte* unit = arena.Unit(run.block_id, run.row, kv_head);
          for (int r = 0; r < run.count; ++r, unit += arena.unit_bytes) {
            hdrs[r] = unit;
            rows[r] = unit + side.code_offset;
          }
          continue;
        }
        // The run's units are consecutive: one division per run, not per row, and no branch
        // per row.
        const std::byte* unit = arena.Unit(run.block_id, run.row / group_tokens, kv_head);
        int in_unit = run.row % group_tokens;
        for (int r = 0; r < run.count; unit += arena.unit_bytes, in_unit = 0) {
          const int n = std::min(run.count - r, group_tokens - in_unit);
          const std::byte* code = unit + side.code_offset + in_unit * side.row_code_bytes;
          for (int i = 0; i < n; ++i, code += side.row_code_bytes) {
            hdrs[r + i] = unit;
            rows[r + i] = code;
          }
          r += n;
        }
      }
      break;
    }
  }
  // Readers step over 4 keys (the VNNI scorer over 16) at a time.
  const int num_keys16 = (num_keys + 15) / 16 * 16;
  for (int i = num_keys; i < num_keys16; ++i) {
    set->rows[i] = set->rows[num_keys - 1];
    set->hdrs[i] = set->hdrs[num_keys - 1];
  }
}

// ---------------------------------------------------------------------------------------------
// Decode readers.

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

// Scores of kKeys (4, or 2 with an even kNumQ) key rows against kNumQ query heads:
// s[j * s_stride + key] = q_j . k_key.
//   q: [kNumQ, head_dim] (already scaled)
template <int kNumQ, int kKeys, Reader kK, class D>
HWY_INLINE void ScoreRows(D d, const RowSet& keys, size_t key0, const float* HWY_RESTRICT q,
                          size_t head_dim, float* HWY_RESTRICT s, size_t s_stride) {
  static_assert(kKeys == 4 || (kKeys == 2 && kNumQ % 2 == 0), "sums are taken four at a time");
  const size_t n = hn::Lanes(d);
  float hf[kKeys][kMaxHeaderFloats];
  const std::byte* rows[kKeys];
  HWY_UNROLL(4)
  for (int key = 0; key < kKeys; ++key) {
    rows[key] = keys.rows[key0 + key];
    LoadHeader<kK>(keys, key0 + key, hf[key]);
  }
  constexpr bool kGroups = kK == Reader::kInt4 || kK == Reader::kInt2 || kK == Reader::kInt4S;
  // Loops over the (scale, min) groups, then their vectors: no division in the hot loop.
  const size_t group_elems = kGroups ? static_cast<size_t>(keys.group_elems) : head_dim;
  hn::Vec<D> acc[kNumQ][kKeys];
  HWY_UNROLL(8)
  for (int j = 0; j < kNumQ; ++j) {
    HWY_UNROLL(8)
    for (int key = 0; key < kKeys; ++key) acc[j][key] = hn::Zero(d);
  }
  for (size_t g0 = 0, g = 0; g0 < head_dim; g0 += group_elems, ++g) {
    hn::Vec<D> scale[kKeys], min[kKeys];
    HWY_UNROLL(4)
    for (int key = 0; key < kKeys; ++key) {
      scale[key] = kGroups ? hn::Set(d, hf[key][2 * g]) : hn::Zero(d);
      min[key] = kGroups ? hn::Set(d, hf[key][2 * g + 1]) : hn::Zero(d);
    }
    if constexpr (IsSplitReader(kK)) {
      constexpr int kParts = SplitParts(kK);
      for (size_t b0 = g0; b0 < g0 + group_elems; b0 += kParts * n) {
        hn::Vec<hn::Rebind<int32_t, D>> x[kKeys];
        HWY_UNROLL(4)
        for (int key = 0; key < kKeys; ++key) x[key] = LoadSplit<kK>(d, rows[key], b0);
        HWY_UNROLL(4)
        for (int r = 0; r < kParts; ++r) {
          hn::Vec<D> k[kKeys];
          HWY_UNROLL(4)
          for (int key = 0; key < kKeys; ++key) {
            k[key] = SplitPartOf<kK>(d, x[key], r);
            if constexpr (kGroups) k[key] = hn::MulAdd(k[key], scale[key], min[key]);
          }
          HWY_UNROLL(8)
          for (int j = 0; j < kNumQ; ++j) {
            const auto qv = hn::LoadU(d, q + j * head_dim + b0 + r * n);
            HWY_UNROLL(8)
            for (int key = 0; key < kKeys; ++key) acc[j][key] = hn::MulAdd(qv, k[key], acc[j][key]);
          }
        }
      }
    } else {
      for (size_t i = g0; i < g0 + group_elems; i += n) {
        hn::Vec<D> k[kKeys];
        HWY_UNROLL(8)
        for (int key = 0; key < kKeys; ++key) {
          k[key] = LoadRow<kK>(d, rows[key], i, scale[key], min[key]);
        }
        HWY_UNROLL(8)
        for (int j = 0; j < kNumQ; ++j) {
          const auto qv = hn::LoadU(d, q + j * head_dim + i);
          HWY_UNROLL(8)
          for (int key = 0; key < kKeys; ++key) acc[j][key] = hn::MulAdd(qv, k[key], acc[j][key]);
        }
      }
    }
  }
  if constexpr (kKeys == 4) {
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) {
      SumOfLanes4(d, acc[j][0], acc[j][1], acc[j][2], acc[j][3], s + j * s_stride);
    }
  } else {  // two heads' pairs of keys per four sums
    HWY_UNROLL(4)
    for (int j = 0; j < kNumQ; j += 2) {
      float sums[4];
      SumOfLanes4(d, acc[j][0], acc[j][1], acc[j + 1][0], acc[j + 1][1], sums);
      std::memcpy(s + j * s_stride, sums, 2 * sizeof(float));
      std::memcpy(s + (j + 1) * s_stride, sums + 2, 2 * sizeof(float));
    }
  }
}

// Query heads per scoring step of reader kR, so that each key element is converted once per
// step: 4 with AVX-512, whose 32 registers hold the accumulators of 4 heads x 4 keys. With 16
// (AVX2 and below) 4 heads take the keys in pairs (ScoreFourRows), which pays where converting
// a key costs (FP8 E4M3, ~7 operations per 8 elements, scored slower than BF16 on Zen 3 at 2
// heads per step); F32, F16 and BF16 rows in element order (a load, one conversion, a widening
// and a shift) keep 2 heads x 4 keys: their pairs were 7-20 % slower on Zen 3
// (OneThreadB/.../1024). BF16 keys in split order (kBF16Pairs: a shift or a mask per vector)
// take pairs: 7 % faster there than 2 heads x 4 keys in element order.
#if HWY_TARGET <= HWY_AVX3
constexpr int kVectorRegisters = 32;
#else
constexpr int kVectorRegisters = 16;
#endif
template <Reader kR>
constexpr int ScoreHeadStep() {
  return kVectorRegisters == 32 || !IsFloatReader(kR) ? 4 : 2;
}

// Scores of four key rows (ScoreRows) against kNumQ query heads (ScoreHeadStep).
template <int kNumQ, Reader kK, class D>
HWY_INLINE void ScoreFourRows(D d, const RowSet& keys, size_t key0, const float* HWY_RESTRICT q,
                              size_t head_dim, float* HWY_RESTRICT s, size_t s_stride) {
  // Accumulators in at most half the registers: 4 keys, or pairs.
  constexpr int kKeys = kNumQ * 4 <= kVectorRegisters / 2 ? 4 : 2;
  HWY_UNROLL(2)
  for (int k = 0; k < 4; k += kKeys) {
    ScoreRows<kNumQ, kKeys, kK>(d, keys, key0 + k, q, head_dim, s + k, s_stride);
  }
}

// Walks the units [0, num_units) (vectors or chunks of a row) in slices of kMax units (1, 2, 4
// or 8: as many as the accumulators in registers allow), then the rest in at most one slice
// each of 4, 2 and 1, so that a row is passed over as few times as the registers allow:
// calls slice.template operator()<kUnits>(first_unit). Not forced inline, so that a slice may
// carry a wider target attribute than this walker (the BF16 readers'); a call per slice of a
// tile's keys costs nothing next to the slice.
template <int kMax, class Slice>
inline void ForEachSlice(size_t num_units, const Slice& slice) {
  static_assert(kMax == 1 || kMax == 2 || kMax == 4 || kMax == 8, "the rest is walked by 4, 2, 1");
  size_t u = 0;
  for (; u + kMax <= num_units; u += kMax) slice.template operator()<kMax>(u);
  if constexpr (kMax > 4) {
    if (u + 4 <= num_units) {
      slice.template operator()<4>(u);
      u += 4;
    }
  }
  if constexpr (kMax > 2) {
    if (u + 2 <= num_units) {
      slice.template operator()<2>(u);
      u += 2;
    }
  }
  if constexpr (kMax > 1) {
    if (u < num_units) slice.template operator()<1>(u);
  }
}

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

// Requests the cache line at `p` of `set`: into L2 where the set asks for it on the AVX-512
// targets, else into L1. On AMD Zen 4 a request into L1 holds one of the L1's few miss buffers
// until its line arrives, which capped what one core had in flight from DRAM: into L2, shape B
// from memory was 10-30 % faster (bf16, int8, int4 at 16k-64k, one thread and two) and as fast
// from cache; on the Intel AMX kind it was neutral (twenty-third round). FP8 rows, whose readers
// are bound by their conversions, were 3-8 % slower with it (end to end at 16k and shape B on
// two threads), so they stay in L1; so does the AVX2 target, where bf16 at 32k was 21 % slower
// with it on Zen 3 (seventeenth round). docs/representation-speed.md, twenty-eighth round.
// `far`: a line wanted a whole pass later (RowRequests), into L2 on the AVX-512 targets whatever
// the set asks: for FP8 keys, 5 % faster at 32k on one thread than into L1 (twenty-ninth round).
HWY_INLINE void RequestLine(const RowSet& set, const std::byte* p, bool far) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (far || set.requests_into_l2) {
    __builtin_prefetch(p, 0, 2);
    return;
  }
#endif
  hwy::Prefetch(p);
}

// Requests rows [first, end) of `set`: as one byte range, each line once, where they lie back
// to back (within a block), else row by row.
HWY_INLINE bool PrefetchRange(const RowSet& set, size_t first, size_t end, bool far) {
  const std::byte* begin = set.rows[first];
  if (set.rows[end - 1] != begin + (end - 1 - first) * set.prefetch_bytes) return false;
  const std::byte* last = set.rows[end - 1] + set.prefetch_bytes - 1;
  // A unit's header goes with the run that starts at its first row. (KIVI keys' unit headers,
  // 512 bytes of per-channel pairs per 32 tokens at head_dim 128, were demand misses from DRAM
  // until the thirty-first round: requested, kivi2 and kivi4 ran 7-26 % faster from 16k.)
  const size_t lead_bytes = begin == set.hdrs[first] + set.prefetch_lead ? set.prefetch_lead : 0;
  const std::byte* lead = begin - lead_bytes;
  const std::byte* line = lead - reinterpret_cast<uintptr_t>(lead) % kCacheLine;
  for (; line <= last; line += kCacheLine) RequestLine(set, line, far);
  return true;
}

// Requests rows [first, end) of `set` (a few): as one range where they lie back to
// back (PrefetchRange: 5 requests instead of 8 for 4-bit rows of head_dim 128, OneThreadB/int4/
// 1024 1-3 % faster), else row by row.
HWY_INLINE void PrefetchRows(const RowSet& set, size_t first, size_t end, bool far) {
  if (first >= end || PrefetchRange(set, first, end, far)) return;
  for (size_t row = first; row < end; ++row) {
    for (size_t line = 0; line < set.prefetch_bytes; line += kCacheLine) {
      RequestLine(set, set.rows[row] + line, far);
    }
  }
}

// PrefetchRows for rows [first, end) of `set` (many), four rows a call: the run PrefetchRows
// checks for is at most four rows, the width its by-fours callers request.
HWY_INLINE void PrefetchRowsByFours(const RowSet& set, size_t first, size_t end, bool far) {
  for (; first < end; first += 4) PrefetchRows(set, first, std::min(end, first + 4), far);
}

// The rows of another tile requested during a pass that reads its own rows from cache: the
// value pass requests the next tile's keys, so that the memory does not idle while it runs (the
// key pass requests its own tile's keys and values). Spread evenly over the pass's steps, at
// the rate that its step count in the tile before gave (the first tile: one row per key);
// requested all at once, most requests were dropped (twenty-eighth round), and over half the
// pass, bf16 at 32k was 25 % slower than over all of it (twenty-ninth round).
struct RowRequests {
  // Starts requesting rows [0, num_rows) of `rows` (null: none) over `expected_steps` calls of
  // Step.
  void Start(const RowSet* rows, size_t num_rows, size_t expected_steps) {
    set = rows;
    next = 0;
    end = rows == nullptr || rows->prefetch_bytes == 0 ? 0 : num_rows;
    num_steps = 0;
    credit = 0;
    rate = end == 0 ? 0 : static_cast<uint32_t>((end << 16) / std::max<size_t>(1, expected_steps));
  }
  // One step of the pass: the rows now due.
  HWY_INLINE void Step() {
    ++num_steps;
    credit += rate;
    const size_t due = credit >> 16;
    if (due == 0 || next >= end) return;
    credit &= 0xFFFF;
    const size_t last = std::min(end, next + due);
    PrefetchRows(*set, next, last, true);
    next = last;
  }
  // Requests what no step has (readers that do not step: AMX, FP16).
  void Finish() {
    if (next < end) PrefetchRowsByFours(*set, next, end, true);
    next = end;
  }

  size_t steps() const { return num_steps; }  // Step calls since Start

 private:
  size_t num_steps = 0;
  const RowSet* set = nullptr;
  size_t next = 0;
  size_t end = 0;
  uint32_t credit = 0;  // rows due, 16.16 fixed point
  uint32_t rate = 0;    // rows per step, 16.16 fixed point
};

// Whether the value pass requests the next tile's keys (RowRequests): on the AVX-512 targets.
// On the AVX2 target (measured on Zen 4, --avx2) it made bf16 25 % slower at 1k and every codec
// 4-15 % slower at 1k and 32k: its readers take more, shorter passes over a tile, each step of
// which paid for the bookkeeping, and its requests go into L1.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kValuePassRequests = true;
#else
constexpr bool kValuePassRequests = false;
#endif

// One step of a pass over `set` (a step of a value reader's loop over its keys): requests the
// rows of another tile now due (RowSet::requests).
HWY_INLINE void RequestStep(const RowSet& set) {
  if constexpr (kValuePassRequests) {
    if (set.requests != nullptr) set.requests->Step();
  }
}

// Requests the four rows kPrefetchAhead keys past `key` (callers step by 4 keys; keys and values
// both: the value pass then reads from cache). Blocks of a paged cache are a few KiB apart from
// the next block of the same head, which stops the hardware prefetchers at every block.
// (Requesting only the start of each run of rows and leaving the rest to the hardware was
// faster for caches that fit in L2 but a third slower from DRAM: bf16 at 32k tokens 9.6 ms
// instead of 6.2 ms.)
HWY_INLINE void PrefetchAhead(const RowSet& set, size_t key, size_t num_keys) {
  if (set.prefetch_bytes == 0) return;
  const size_t first = key + kPrefetchAhead;
  PrefetchRows(set, first, std::min(num_keys, first + 4), false);
}

// Requests a tile's first kPrefetchAhead rows, which no PrefetchAhead within the tile requests:
// once per tile, before its key pass. On Zen 4 from DRAM: int4 and int8 on two threads 3-17 %
// faster, fp8_e4m3 end to end at 16k 6-12 %, bf16 within the noise (twenty-eighth round).
HWY_INLINE void PrefetchTileStart(const RowSet& set, size_t num_keys) {
  if (set.prefetch_bytes == 0) return;
  PrefetchRowsByFours(set, 0, std::min(num_keys, kPrefetchAhead), false);
}

// PrefetchAhead for the 16 keys from `key`, for readers that step by 16 keys: one range where
// all 16 rows lie back to back (a block of 16 tokens or more), else by fours. The same lines as
// four PrefetchAhead calls, with one check instead of four (in int4's key pass the look-ahead
// calls held 15 % of the samples).
HWY_INLINE void PrefetchAhead16(const RowSet& set, size_t key, size_t num_keys) {
  if (set.prefetch_bytes == 0) return;
  const size_t first = key + kPrefetchAhead;
  const size_t end = std::min(num_keys, first + 16);
  if (first >= end || PrefetchRange(set, first, end, false)) return;
  for (size_t k = key; k < key + 16; k += 4) PrefetchAhead(set, k, num_keys);
}

// Whether any of rows[0, num_rows) of an E4M3 reader holds a NaN code (0x7F or 0xFF): the
// largest code magnitude, one AND and one MAX per vector of codes. Meant for rows in cache
// (a scan that brought a tile from memory cost E4M3 its gain over BF16 end to end).
bool AnyE4M3Nan(const RowSet& set, size_t num_rows, size_t head_dim) {
  const hn::ScalableTag<uint8_t> du8;
  const size_t n = hn::Lanes(du8);
  const auto magnitude = hn::Set(du8, 0x7F);
  auto largest = hn::Zero(du8);
  uint8_t tail_largest = 0;
  for (size_t r = 0; r < num_rows; ++r) {
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(set.rows[r] + sizeof(uint16_t));
    size_t i = 0;
    for (; i + n <= head_dim; i += n) {
      largest = hn::Max(largest, hn::And(hn::LoadU(du8, codes + i), magnitude));
    }
    for (; i < head_dim; ++i) tail_largest = std::max<uint8_t>(tail_largest, codes[i] & 0x7F);
  }
  HWY_ALIGN uint8_t lanes[hn::MaxLanes(du8)];  // (this Highway has no 8-bit MaxOfLanes)
  hn::Store(largest, du8, lanes);
  return *std::max_element(lanes, lanes + n) == 0x7F || tail_largest == 0x7F;
}

// The query rows q[0, num) (whole split blocks) in the order split reader `r` reads its rows
// (SplitElement) into qs: once per decode task, for ScoreTile.
template <class D>
void SplitQueries(D d, Reader r, const float* HWY_RESTRICT q, size_t num, float* HWY_RESTRICT qs) {
  const size_t n = hn::Lanes(d);
#if HWY_TARGET != HWY_SCALAR               // (no ConcatEven there; it never takes kBF16Pairs)
  if constexpr (hn::MaxLanes(D()) >= 4) {  // (nor do narrower vectors: SplitOrderReader)
    if (IsPairsReader(r)) {                // even elements, then odd ones, per 2n
      const auto factor = hn::Set(d, SplitOrderFactor(r));
      for (size_t i = 0; i < num; i += 2 * n) {
        const auto lo = hn::LoadU(d, q + i), hi = hn::LoadU(d, q + i + n);
        hn::StoreU(hn::Mul(hn::ConcatEven(d, hi, lo), factor), d, qs + i);
        hn::StoreU(hn::Mul(hn::ConcatOdd(d, hi, lo), factor), d, qs + i + n);
      }
      return;
    }
  }
#endif
  const size_t parts = SplitParts(r);
  for (size_t pos = 0; pos < num; ++pos) qs[pos] = q[SplitElement(pos, n, parts)];
}

// Scores of a tile's keys for the `group` query heads of one kv head (ScoreTile).
template <Reader kK, class D>
void ScoreTileAs(const RowSet& keys, const RowSet& values, size_t num_keys, const float* q,
                 int group, size_t head_dim, float* s, size_t s_stride) {
  const D d;
  const size_t n = hn::Lanes(d);
  const size_t num_keys4 = (num_keys + 3) / 4 * 4;
  if constexpr (kK == Reader::kKivi4 || kK == Reader::kKivi2) {
    // Per unit: q'_c = q_c * scale_c and bias = sum_c q_c * min_c, so that each key's score
    // is q' . codes + bias with the codes read as integers.
    const size_t parts = SplitParts(kK);
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
        ForEachHeadStep<ScoreHeadStep<kK>()>(group, [&](int j, auto num_q) {
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
      ForEachHeadStep<ScoreHeadStep<kK>()>(group, [&](int j, auto num_q) {
        ScoreFourRows<decltype(num_q)::value, kK>(d, keys, key, q + j * head_dim, head_dim,
                                                  s + j * s_stride + key, s_stride);
      });
    }
    if constexpr (IsRowScaled(kK)) ScaleScoresByRows<kK>(keys, num_keys, group, s, s_stride);
  }
}

// Scores of a tile's keys for the `group` query heads of one kv head.
//   q: [group, head_dim] (scaled; a split reader's in its order, SplitQueries); s: [group,
//   s_stride]
template <Reader kK, class D>
void ScoreTile(const RowSet& keys, const RowSet& values, size_t num_keys, const float* q, int group,
               size_t head_dim, float* s, size_t s_stride) {
  if constexpr (kK == Reader::kFp8E4M3 || kK == Reader::kFp8E4M3Pairs) {
    // Scored as finite first, while the rows come from memory with the readers' prefetching,
    // then checked from cache; a tile holding a NaN code is scored again.
    constexpr Reader kFinite =
        kK == Reader::kFp8E4M3 ? Reader::kFp8E4M3Finite : Reader::kFp8E4M3PairsFinite;
    ScoreTileAs<kFinite, D>(keys, values, num_keys, q, group, head_dim, s, s_stride);
    if (!AnyE4M3Nan(keys, num_keys, head_dim)) return;
  }
  ScoreTileAs<kK, D>(keys, values, num_keys, q, group, head_dim, s, s_stride);
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
    RequestStep(values);
    hn::Vec<D> w[kNumQ];
    HWY_UNROLL(8)
    for (int j = 0; j < kNumQ; ++j) w[j] = hn::Set(d, p[j * p_stride + key]);
    const std::byte* row = values.rows[key];
    if constexpr (kV == Reader::kInt4S || IsPairsReader(kV)) {
      // kVecs is a multiple of the 2 parts of a block: a slice is whole blocks.
      HWY_UNROLL(8)
      for (size_t v = 0; v < kVecs; v += 2) {
        const auto block = LoadSplit<kV>(d, row, i0 + v * n);
        hn::Vec<D> scale = hn::Zero(d), min = hn::Zero(d);
        if constexpr (kGroups) {
          const float* h = hf + key * kMaxHeaderFloats + header_idx[v];
          scale = hn::Set(d, h[0]);
          min = hn::Set(d, h[1]);
        }
        HWY_UNROLL(2)
        for (int r = 0; r < 2; ++r) {
          auto x = SplitPartOf<kV>(d, block, r);
          if constexpr (kGroups) x = hn::MulAdd(x, scale, min);
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

// The same over all of head_dim: slices of 8 / kNumQ vectors, then the rest by ForEachSlice
// (split readers: by whole blocks).
template <int kNumQ, Reader kV, class D>
HWY_INLINE void AccumulateRows(D d, const RowSet& values, size_t num_keys,
                               const float* HWY_RESTRICT p, size_t p_stride, size_t head_dim,
                               const float* HWY_RESTRICT hf, float* HWY_RESTRICT acc,
                               size_t acc_stride) {
  constexpr size_t kMaxVecs = 8 / kNumQ;  // accumulators in registers: at most 8
  const size_t n = hn::Lanes(d);
  if constexpr (IsSplitReader(kV)) {  // whole blocks (head_dim is a multiple of them)
    size_t i0 = 0;
    for (; i0 + kMaxVecs * n <= head_dim; i0 += kMaxVecs * n) {
      AccumulateSlice<kNumQ, kMaxVecs, kV>(d, values, num_keys, p, p_stride, i0, hf, acc,
                                           acc_stride);
    }
    for (; i0 < head_dim; i0 += 2 * n) {
      AccumulateSlice<kNumQ, 2, kV>(d, values, num_keys, p, p_stride, i0, hf, acc, acc_stride);
    }
  } else {
    // (head_dim 64 with one query head: one pass over each value row, not four.)
    ForEachSlice<kMaxVecs>(head_dim / n, [&]<int kVecs>(size_t v) {
      AccumulateSlice<kNumQ, kVecs, kV>(d, values, num_keys, p, p_stride, v * n, hf, acc,
                                        acc_stride);
    });
  }
}

// Weighted sum of a tile's values into the running states of the `group` query heads.
//   p: [group, p_stride] softmax weights; state: [group, state_stride]
template <Reader kV, class D>
void AccumulateTile(const RowSet& values, size_t num_keys, const float* p, size_t p_stride,
                    int group, size_t head_dim, float* state, size_t state_stride) {
  // (The values came into cache while keys were scored.)
  if constexpr (kV == Reader::kFp8E4M3 || kV == Reader::kFp8E4M3Pairs) {
    constexpr Reader kFinite =
        kV == Reader::kFp8E4M3 ? Reader::kFp8E4M3Finite : Reader::kFp8E4M3PairsFinite;
    if (!AnyE4M3Nan(values, num_keys, head_dim)) {
      return AccumulateTile<kFinite, D>(values, num_keys, p, p_stride, group, head_dim, state,
                                        state_stride);
    }
  }
  const D d;
  // Headers once per tile, not once per slice of dimensions.
  float* hf = nullptr;
  if constexpr (kV == Reader::kInt4 || kV == Reader::kInt2 || kV == Reader::kInt4S) {
    hf = Scratch(kSlotHeaders, num_keys * kMaxHeaderFloats);
    for (size_t key = 0; key < num_keys; ++key) {
      LoadHeader<kV>(values, key, hf + key * kMaxHeaderFloats);
    }
  }
  if constexpr (IsRowScaled(kV)) {
    // Row-scaled values are read as unscaled codes: each row's scale joins its weights, once
    // per tile (per key and slice of dimensions, that multiply and its broadcast were the
    // hottest instructions of the FP8 value loop on Zen 3).
    const size_t num_keys4 = (num_keys + 3) / 4 * 4;
    float* scaled = Scratch(kSlotHeaders, (group + 1) * num_keys4);  // [group + 1, num_keys4]
    float* scales = scaled + group * num_keys4;
    LoadRowScalesOfTile<kV>(values.rows, num_keys, scales);
    for (int j = 0; j < group; ++j) {
      for (size_t key = 0; key < num_keys; ++key) {
        scaled[j * num_keys4 + key] = p[j * p_stride + key] * scales[key];
      }
    }
    p = scaled;
    p_stride = num_keys4;
  }
  ForEachHeadStep<4>(group, [&](int j, auto num_q) {
    AccumulateRows<decltype(num_q)::value, kV>(d, values, num_keys, p + j * p_stride, p_stride,
                                               head_dim, hf, state + j * state_stride,
                                               state_stride);
  });
}

// The reader a decode task takes for an arena's reader at vector width D: BF16 and E4M3 rows
// of whole pair blocks in split order (kBF16Pairs, kFp8E4M3Pairs; the task puts its value
// states back in element order at its end), every other as it is.
template <class D>
Reader SplitOrderReader(Reader r, size_t head_dim) {
  const bool pairs = hn::MaxLanes(D()) >= 4 && head_dim % (2 * hn::Lanes(D())) == 0;
  if (!pairs) return r;
  return r == Reader::kBF16      ? Reader::kBF16Pairs
         : r == Reader::kFp8E4M3 ? Reader::kFp8E4M3Pairs
                                 : r;
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
      case Reader::kBF16Pairs:
        return &ScoreTile<Reader::kBF16Pairs, D>;
      case Reader::kFp8E4M3Pairs:
        return &ScoreTile<Reader::kFp8E4M3Pairs, D>;
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
      case Reader::kBF16Pairs:
        return &AccumulateTile<Reader::kBF16Pairs, D>;
      case Reader::kFp8E4M3Pairs:
        return &AccumulateTile<Reader::kFp8E4M3Pairs, D>;
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

// ---------------------------------------------------------------------------------------------
// Decoding a tile to F32 with the readers, for prefill (whose math runs on F32 tiles).

// The rows of `set` (FillRows) as F32 in element order: dst: [num_keys][head_dim].
template <Reader kR, class D>
void DecodeRowsF32(const RowSet& set, size_t num_keys, size_t head_dim, float* HWY_RESTRICT dst) {
  const D d;
  const size_t n = hn::Lanes(d);
  // Split order is only a way of scoring; decode kInt4S rows with kInt4 (element order).
  constexpr Reader kE = kR == Reader::kInt4S ? Reader::kInt4 : kR;
  constexpr bool kGroups = kE == Reader::kInt4 || kE == Reader::kInt2;
  constexpr bool kKivi = kE == Reader::kKivi4 || kE == Reader::kKivi2;
  // KIVI: the current unit's per-channel scales and minima.
  float* channel = kKivi ? Scratch(kSlotHeaders, 4 * head_dim) : nullptr;  // [2][head_dim] + tmp
  const std::byte* channel_unit = nullptr;
  for (size_t key = 0; key < num_keys; ++key) {
    const std::byte* row = set.rows[key];
    float* out = dst + key * head_dim;
    if constexpr (IsFloatReader(kE)) {
      ConvertRow<kE>(row, head_dim, out);
    } else if constexpr (IsRowScaled(kE)) {  // raw codes times the row's f16 scale
      const auto scale = hn::Set(d, RowScale<kE>(row));
      for (size_t i = 0; i < head_dim; i += n) {
        hn::StoreU(hn::Mul(LoadRow<kE>(d, row, i), scale), d, out + i);
      }
    } else if constexpr (kGroups) {
      float hf[kMaxHeaderFloats];
      LoadHeader<kE>(set, key, hf);
      const size_t group_elems = static_cast<size_t>(set.group_elems);
      for (size_t g0 = 0, g = 0; g0 < head_dim; g0 += group_elems, ++g) {
        const auto scale = hn::Set(d, hf[2 * g]), min = hn::Set(d, hf[2 * g + 1]);
        for (size_t i = g0; i < g0 + group_elems; i += n) {
          hn::StoreU(LoadRow<kE>(d, row, i, scale, min), d, out + i);
        }
      }
    } else {
      static_assert(kKivi);
      if (set.hdrs[key] != channel_unit) {  // [head_dim x (scale, min)] of the unit
        float* pairs = channel + 2 * head_dim;
        ConvertRow<Reader::kF16>(set.hdrs[key], 2 * head_dim, pairs);
        for (size_t c = 0; c < head_dim; ++c) {
          channel[c] = pairs[2 * c];
          channel[head_dim + c] = pairs[2 * c + 1];
        }
        channel_unit = set.hdrs[key];
      }
      for (size_t i = 0; i < head_dim; i += n) {
        hn::StoreU(hn::MulAdd(LoadRow<kE>(d, row, i), hn::LoadU(d, channel + i),
                              hn::LoadU(d, channel + head_dim + i)),
                   d, out + i);
      }
    }
  }
}

using DecodeRowsFn = void (*)(const RowSet&, size_t, size_t, float*);

// The decoder of a reader at vector width D; null where it has none (the float readers are
// converted in DecodeArenaTokens already).
template <class D>
DecodeRowsFn DecodeRowsFor(Reader r) {
  if constexpr (hn::MaxLanes(D()) >= 4) {
    switch (r) {
      case Reader::kInt8:
        return &DecodeRowsF32<Reader::kInt8, D>;
      case Reader::kFp8E4M3:
        return &DecodeRowsF32<Reader::kFp8E4M3, D>;
      case Reader::kFp8E5M2:
        return &DecodeRowsF32<Reader::kFp8E5M2, D>;
      case Reader::kInt4:
      case Reader::kInt4S:
        return &DecodeRowsF32<Reader::kInt4, D>;
      case Reader::kInt2:
        return &DecodeRowsF32<Reader::kInt2, D>;
      case Reader::kKivi4:
        return &DecodeRowsF32<Reader::kKivi4, D>;
      case Reader::kKivi2:
        return &DecodeRowsF32<Reader::kKivi2, D>;
      default:
        break;
    }
  }
  return nullptr;
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
  const size_t tile_row_bytes = arena.unit_bytes / kTileTokens;
  if (is_int && group_tokens == kTileTokens && arena.unit_bytes % kTileTokens == 0 &&
      tile_row_bytes > row_code_bytes && (tile_row_bytes - row_code_bytes) % 4 == 0 &&
      row_code_bytes % 4 == 0) {
    // -t16 tiles: 16 rows of per-token groups (codec_name.h), read whole by the VNNI and AVX2
    // readers, by rows copied out of them elsewhere (UntiledSide).
    const size_t num_groups = (tile_row_bytes - row_code_bytes) / 4;
    if (head_dim % num_groups != 0 || 2 * num_groups > static_cast<size_t>(kMaxHeaderFloats)) {
      return side;
    }
    const size_t group_elems = head_dim / num_groups;
    if (group_elems % lanes != 0) return side;  // (the row readers' rule for UntiledSide)
    side.fill = FillKind::kSpanned;
    side.reader = int_reader(group_elems);
    side.code_offset = kTileTokens * 4 * num_groups;
    side.row_code_bytes = row_code_bytes;
    side.group_elems = static_cast<int>(group_elems);
    side.num_header_floats = static_cast<int>(2 * num_groups);
    side.tiled = true;
    return side;
  }
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

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#endif  // include guard (per target)
