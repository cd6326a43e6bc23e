// The low-rank form of attention (lowrank_attention.h). Work is organised like the kernels of
// attention.cc — split-K partials over the sinks, chunks of the arena and the pending tokens,
// each an online softmax, merged per query head at the end — but a partial over low-rank
// values accumulates in the r-dimensional coordinate space, and the merge maps the coordinate
// sums back through the value basis once per query head.
//
// Per tile of keys, the stored coordinates (r F16 values, or a 4-bit code each with the row's
// scale and minimum) are converted to F32 in L1 scratch — r floats per key, never head_dim —
// and the scores are dot products of length r with the projected queries. Rows of one task are
// (query, head of the GQA group) pairs, so decode (one query, `group` rows) and prefill (a tile
// of queries, each row with its own causal limit) run the same scan.
//
// This file is included once per target by hwy/foreach_target.h; everything between
// HWY_BEFORE_NAMESPACE and HWY_AFTER_NAMESPACE is compiled for each of them, the dispatch at
// the bottom (HWY_ONCE) only once.

#include "run/lowrank_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "kvstack/numeric.h"
#include "represent/hadamard.h"
#include "represent/lowrank_codec.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/lowrank_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "run/lane_sums-inl.h"
#include "run/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using D4 = hn::CappedTag<float, 4>;
using D1 = hn::CappedTag<float, 1>;

// Keys per tile: a tile's scores and coordinates stay in L1. A multiple of every vector width.
constexpr int kTile = 64;
// Decode: the smallest chunk of arena keys worth a task of its own, and tasks per thread.
constexpr int kMinChunk = 256;
constexpr int kTasksPerThread = 4;
// Keys ahead of the one being read whose units are requested from memory, and a cache line.
constexpr int kPrefetchTokens = 128;
constexpr size_t kCacheLine = 64;
// Prefill: about this many rows ((query, head) pairs) per task.
constexpr int kPrefillRows = 32;

// Independent per-thread scratch buffers that only grow, so the hot path does not allocate.
enum Slot { kSlotRows, kSlotStates, kSlotScores, kSlotKeys, kSlotValues, kSlotMerge, kNumSlots };
float* Scratch(Slot slot, size_t num_floats) {
  thread_local std::vector<float> buffers[kNumSlots];
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() < num_floats) buffer.resize(num_floats);
  return buffer.data();
}

// Integer scratch, same rule: the rows' causal limits.
int* ScratchInts(size_t n) {
  thread_local std::vector<int> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Calls body(d, i) for i stepping through [0, n): full vectors, then 4 lanes, then single
// lanes, so any length runs vectorised as far as it can.
template <class Body>
HWY_INLINE void ForVectors(size_t n, Body&& body) {
  size_t i = 0;
  const DF df;
  for (; i + hn::Lanes(df) <= n; i += hn::Lanes(df)) body(df, i);
  const D4 d4;
  for (; i + hn::Lanes(d4) <= n; i += hn::Lanes(d4)) body(d4, i);
  const D1 d1;
  for (; i < n; ++i) body(d1, i);
}

// out[0..4) += the lane sums of a, b, c, e.
template <class D, class V>
HWY_INLINE void AddSumOfLanes4(D d, V a, V b, V c, V e, float* HWY_RESTRICT out) {
  float sums[4];
  SumOfLanes4(d, a, b, c, e, sums);
  for (int k = 0; k < 4; ++k) out[k] += sums[k];
}

// How the keys or values of a tile are read: F32 rows (segments, decoded rows, 4-bit
// coordinates dequantised to scratch) or F16 coordinates straight from the arena, widened in
// registers.
enum class Format { kF32, kF16 };

template <Format kX, class D>
HWY_INLINE hn::Vec<D> LoadX(D d, const void* x, size_t i) {
  if constexpr (kX == Format::kF16) {
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, static_cast<const hwy::float16_t*>(x) + i));
  } else {
    return hn::LoadU(d, static_cast<const float*>(x) + i);
  }
}
template <Format kX>
HWY_INLINE float LoadXScalar(const void* x, size_t i) {
  if constexpr (kX == Format::kF16) {
    uint16_t bits;
    std::memcpy(&bits, static_cast<const std::byte*>(x) + 2 * i, sizeof(bits));
    return F16ToF32(bits);
  } else {
    return static_cast<const float*>(x)[i];
  }
}

// out[k] += a[k] . b[k] over [i, n) in vectors of d, k < 4; returns where it stopped.
template <Format kX, class D>
HWY_INLINE size_t Dot4Part(D d, const float* const* a, const void* const* b, size_t i, size_t n,
                           float* HWY_RESTRICT out) {
  const size_t lanes = hn::Lanes(d);
  if (i + lanes > n) return i;
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  for (; i + lanes <= n; i += lanes) {
    s0 = hn::MulAdd(hn::LoadU(d, a[0] + i), LoadX<kX>(d, b[0], i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a[1] + i), LoadX<kX>(d, b[1], i), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a[2] + i), LoadX<kX>(d, b[2], i), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a[3] + i), LoadX<kX>(d, b[3], i), s3);
  }
  AddSumOfLanes4(d, s0, s1, s2, s3, out);
  return i;
}

// out[k] = a[k] . b[k] (n floats) for k < 4: four rows against one key, or one row against
// four keys.
template <Format kX>
HWY_INLINE void Dot4(const float* const* a, const void* const* b, size_t n,
                     float* HWY_RESTRICT out) {
  for (int k = 0; k < 4; ++k) out[k] = 0.0f;
  size_t i = Dot4Part<kX>(DF(), a, b, 0, n, out);
  i = Dot4Part<kX>(D4(), a, b, i, n, out);
  for (; i < n; ++i) {
    for (int k = 0; k < 4; ++k) out[k] += a[k][i] * LoadXScalar<kX>(b[k], i);
  }
}

// out[r * out_stride] = q_r . x for num_rows rows q_r = q + r * n (n floats): the projection of
// queries onto basis rows and their bias.
void RowDots(const float* q, int num_rows, const float* x, size_t n, float* out,
             size_t out_stride) {
  const float* a[4];
  const void* b[4] = {x, x, x, x};
  float sums[4];
  for (int r = 0; r < num_rows; r += 4) {
    for (int k = 0; k < 4; ++k) a[k] = q + std::min(r + k, num_rows - 1) * n;
    Dot4<Format::kF32>(a, b, n, sums);
    for (int k = 0; k < 4 && r + k < num_rows; ++k) out[(r + k) * out_stride] = sums[k];
  }
}

// ---------------------------------------------------------------------------------------------
// What a task reads.

// One side (keys or values) of the arena: coordinates of a CoordinateCodec, or anything else,
// which is decoded in full with the codec itself.
struct Side {
  const KvArenaView* arena = nullptr;
  const CoordinateCodec* coords = nullptr;  // null: decode with arena->codec_impl
  int dim = 0;                              // floats per token as read: rank, or head_dim
};

struct Context {
  const KvLayerView* view = nullptr;
  Side k, v;
  bool shared_coords = false;  // latent: values read the keys' coordinates (same bytes)
  int head_dim = 0;
  int group = 0;
};

// The rows of one task: (query, head of the group) pairs of one kv head.
struct Rows {
  int num_rows = 0;
  const float* qd = nullptr;    // [num_rows][head_dim]: scaled (and rotated) queries
  const float* qc = nullptr;    // [num_rows][k rank]: projected into the key basis, or null
  const float* bias = nullptr;  // [num_rows]: qd . mean_k, or null
  const int* limit = nullptr;   // [num_rows]: the last logical key each row attends
  int max_limit = 0;            // the largest limit
};

// Where PrepareRows writes the rows of a task: floats [num_rows][head_dim + k_rank + 1] for
// qd, qc and bias, ints [num_rows] for the limits.
struct RowBuffers {
  float* qd = nullptr;
  float* qc = nullptr;
  float* bias = nullptr;
  int* limit = nullptr;
};
size_t RowFloats(int num_rows, int head_dim, int k_rank) {
  return static_cast<size_t>(num_rows) * (head_dim + k_rank + 1);
}
RowBuffers CarveRows(float* floats, int* ints, int num_rows, int head_dim, int k_rank) {
  RowBuffers b;
  b.qd = floats;
  b.qc = floats + static_cast<size_t>(num_rows) * head_dim;
  b.bias = b.qc + static_cast<size_t>(num_rows) * k_rank;
  b.limit = ints;
  return b;
}
Rows AsRows(const RowBuffers& b, int num_rows, int k_rank) {
  Rows rows;
  rows.num_rows = num_rows;
  rows.qd = b.qd;
  rows.qc = k_rank > 0 ? b.qc : nullptr;
  rows.bias = k_rank > 0 ? b.bias : nullptr;
  rows.limit = b.limit;
  rows.max_limit = *std::max_element(b.limit, b.limit + num_rows);
  return rows;
}

// One partial's online-softmax state per row: running max, running sum of weights and the
// weighted sum of values (dim floats: head_dim, or the value rank for coordinate partials).
struct State {
  float* max = nullptr;  // [num_rows]
  float* sum = nullptr;  // [num_rows]
  float* acc = nullptr;  // [num_rows][dim]
  int dim = 0;
  bool coords = false;  // acc is in the value coordinate space
};

enum class PartKind : uint8_t { kSinks, kArena, kPending };
struct Part {
  PartKind kind;
  int begin, end;  // logical keys
};

// Floats of one State for num_rows rows.
size_t StateFloats(int num_rows, int dim) { return static_cast<size_t>(num_rows) * (2 + dim); }
State MakeState(float* buffer, int num_rows, int dim, bool coords) {
  return State{buffer, buffer + num_rows, buffer + 2 * num_rows, dim, coords};
}
int PartDim(const Context& ctx, PartKind kind) {
  return kind == PartKind::kArena ? ctx.v.dim : ctx.head_dim;
}
bool PartCoords(const Context& ctx, PartKind kind) {
  return kind == PartKind::kArena && ctx.v.coords != nullptr;
}

// ---------------------------------------------------------------------------------------------
// Reading one tile.

// Dequantises the 4-bit coordinates of num_tokens consecutive units to F32:
// out [num_tokens][rank]. The unit is the codec's own: [f16 scale][f16 min][codes, low nibble
// first].
void DequantizeCoordinates(int rank, const std::byte* units, size_t unit_bytes, int num_tokens,
                           float* HWY_RESTRICT out) {
  for (int t = 0; t < num_tokens; ++t) {
    const std::byte* unit = units + t * unit_bytes;
    float* dst = out + static_cast<size_t>(t) * rank;
    uint16_t bits[2];
    std::memcpy(bits, unit, sizeof(bits));
    const float scale = F16ToF32(bits[0]);
    const float min = F16ToF32(bits[1]);
    const auto* codes = reinterpret_cast<const uint8_t*>(unit + 4);
    int j = 0;
#if HWY_TARGET != HWY_SCALAR
    // 2 * lanes codes from lanes bytes: low and high nibbles interleaved back into code order.
    const DF df;
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<int32_t, DF> di;
    const int lanes = static_cast<int>(hn::Lanes(df));
    const auto vscale = hn::Set(df, scale), vmin = hn::Set(df, min);
    for (; j + 2 * lanes <= rank; j += 2 * lanes) {
      const auto bytes = hn::LoadU(d8, codes + j / 2);
      const auto lo = hn::And(bytes, hn::Set(d8, 15)), hi = hn::ShiftRight<4>(bytes);
      const auto first = hn::InterleaveLower(d8, lo, hi), second = hn::InterleaveUpper(d8, lo, hi);
      hn::StoreU(hn::MulAdd(hn::ConvertTo(df, hn::PromoteTo(di, first)), vscale, vmin), df,
                 dst + j);
      hn::StoreU(hn::MulAdd(hn::ConvertTo(df, hn::PromoteTo(di, second)), vscale, vmin), df,
                 dst + j + lanes);
    }
#endif
    for (; j + 1 < rank; j += 2) {
      const unsigned byte = codes[j / 2];
      dst[j] = static_cast<float>(byte & 15u) * scale + min;
      dst[j + 1] = static_cast<float>(byte >> 4) * scale + min;
    }
    if (rank % 2 != 0) dst[rank - 1] = static_cast<float>(codes[rank / 2] & 15u) * scale + min;
  }
}

// Online softmax over one tile of num_tokens keys starting at logical first_key, for every
// row: masks the keys past the row's limit, rescales the row's state to the new running max
// and turns the scores s [num_rows][kTile] into weights in place (0 for masked keys).
void SoftmaxTile(const Rows& rows, int first_key, int num_tokens, float* HWY_RESTRICT s,
                 const State& state) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (int r = 0; r < rows.num_rows; ++r) {
    float* sr = s + static_cast<size_t>(r) * kTile;
    const int n = std::max(0, std::min(num_tokens, rows.limit[r] - first_key + 1));
    if (n == 0) {  // the row attends no key of this tile
      std::fill(sr, sr + num_tokens, 0.0f);
      continue;
    }
    const size_t padded = (static_cast<size_t>(n) + lanes - 1) / lanes * lanes;
    for (size_t t = n; t < padded; ++t) sr[t] = kNegInf;
    float tile_max;
    if (HWY_UNLIKELY(MaxOfScores(df, sr, padded, &tile_max))) {  // the row's output is NaN
      std::fill(sr, sr + num_tokens, 0.0f);
      state.max[r] = kInf;
      state.sum[r] = std::numeric_limits<float>::quiet_NaN();
      float* acc = state.acc + static_cast<size_t>(r) * state.dim;
      std::fill(acc, acc + state.dim, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float old_max = state.max[r];
    const float new_max = std::max(old_max, tile_max);
    if (old_max != kNegInf && new_max > old_max) {
      const float alpha = std::exp(old_max - new_max);
      state.sum[r] *= alpha;
      float* acc = state.acc + static_cast<size_t>(r) * state.dim;
      for (int i = 0; i < state.dim; ++i) acc[i] *= alpha;
    }
    state.max[r] = new_max;
    const auto vm = hn::Set(df, new_max);
    auto vsum = hn::Zero(df);
    for (size_t t = 0; t < padded; t += lanes) {
      // Exp(-inf) == 0: masked and padding keys get no weight.
      const auto p = ExpOfScore(df, hn::Sub(hn::LoadU(df, sr + t), vm));
      hn::StoreU(p, df, sr + t);
      vsum = hn::Add(vsum, p);
    }
    state.sum[r] += hn::GetLane(hn::SumOfLanes(df, vsum));
    for (int t = n; t < num_tokens; ++t) sr[t] = 0.0f;
  }
}

// acc_k[i, i + kVecs * lanes) += sum_t p_k[t] * x_t[...] for kRows rows k, the accumulators
// held in registers over the tile's tokens and each x_t vector loaded once for all rows.
template <int kRows, int kVecs, Format kX, class D>
HWY_INLINE void AccumulateBlock(D d, const float* const* p, const void* const* x, int num_tokens,
                                size_t i, float* const* acc) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> a[kRows][kVecs];
  for (int k = 0; k < kRows; ++k) {
    for (int v = 0; v < kVecs; ++v) a[k][v] = hn::LoadU(d, acc[k] + i + v * lanes);
  }
  for (int t = 0; t < num_tokens; ++t) {
    hn::Vec<D> xv[kVecs];
    for (int v = 0; v < kVecs; ++v) xv[v] = LoadX<kX>(d, x[t], i + v * lanes);
    for (int k = 0; k < kRows; ++k) {
      const auto pk = hn::Set(d, p[k][t]);
      for (int v = 0; v < kVecs; ++v) a[k][v] = hn::MulAdd(pk, xv[v], a[k][v]);
    }
  }
  for (int k = 0; k < kRows; ++k) {
    for (int v = 0; v < kVecs; ++v) hn::StoreU(a[k][v], d, acc[k] + i + v * lanes);
  }
}

// The rows [r, r + kRows) of AccumulateTile, over all dim floats.
template <int kRows, Format kX>
HWY_INLINE void AccumulateRows(const float* const* p, const void* const* x, int num_tokens,
                               size_t dim, float* const* acc) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + 2 * lanes <= dim; i += 2 * lanes)
    AccumulateBlock<kRows, 2, kX>(df, p, x, num_tokens, i, acc);
  for (; i + lanes <= dim; i += lanes) AccumulateBlock<kRows, 1, kX>(df, p, x, num_tokens, i, acc);
  const D4 d4;
  for (; i + hn::Lanes(d4) <= dim; i += hn::Lanes(d4)) {
    AccumulateBlock<kRows, 1, kX>(d4, p, x, num_tokens, i, acc);
  }
  for (; i < dim; ++i) AccumulateBlock<kRows, 1, kX>(D1(), p, x, num_tokens, i, acc);
}

// acc[r] += sum_t p[r][t] * x_t for every row (dim floats): four rows at a time.
template <Format kX>
void AccumulateTileAs(const Rows& rows, const float* HWY_RESTRICT p, const void* const* x,
                      int num_tokens, const State& state) {
  const float* pr[4];
  float* acc[4];
  for (int r = 0; r < rows.num_rows; r += 4) {
    const int num = std::min(4, rows.num_rows - r);
    for (int k = 0; k < num; ++k) {
      pr[k] = p + static_cast<size_t>(r + k) * kTile;
      acc[k] = state.acc + static_cast<size_t>(r + k) * state.dim;
    }
    if (num == 4) {
      AccumulateRows<4, kX>(pr, x, num_tokens, state.dim, acc);
    } else if (num == 3) {
      AccumulateRows<3, kX>(pr, x, num_tokens, state.dim, acc);
    } else if (num == 2) {
      AccumulateRows<2, kX>(pr, x, num_tokens, state.dim, acc);
    } else {
      AccumulateRows<1, kX>(pr, x, num_tokens, state.dim, acc);
    }
  }
}
void AccumulateTile(const Rows& rows, const float* HWY_RESTRICT p, const void* const* x,
                    Format format, int num_tokens, const State& state) {
  if (format == Format::kF16) return AccumulateTileAs<Format::kF16>(rows, p, x, num_tokens, state);
  AccumulateTileAs<Format::kF32>(rows, p, x, num_tokens, state);
}

// Scores s [num_rows][kTile] of one tile's keys, x_t pointing at each key as read: coordinates
// against the projected queries plus the mean's bias, or full keys against qd. Four rows
// against one key, and leftover rows against four keys at a time.
template <Format kX>
void ScoreTileAs(const Rows& rows, bool coords, int dim, const void* const* x, int num_tokens,
                 int head_dim, float* HWY_RESTRICT s) {
  const float* q = coords ? rows.qc : rows.qd;
  const size_t n = coords ? dim : head_dim;
  const float* bias = coords ? rows.bias : nullptr;
  const float* a[4];
  const void* b[4];
  float out[4];
  int r = 0;
  for (; r + 4 <= rows.num_rows; r += 4) {
    for (int k = 0; k < 4; ++k) a[k] = q + (r + k) * n;
    for (int t = 0; t < num_tokens; ++t) {
      b[0] = b[1] = b[2] = b[3] = x[t];
      Dot4<kX>(a, b, n, out);
      for (int k = 0; k < 4; ++k) s[(r + k) * kTile + t] = out[k] + (bias ? bias[r + k] : 0.0f);
    }
  }
  for (; r < rows.num_rows; ++r) {
    a[0] = a[1] = a[2] = a[3] = q + r * n;
    for (int t = 0; t < num_tokens; t += 4) {
      for (int k = 0; k < 4; ++k) b[k] = x[std::min(t + k, num_tokens - 1)];
      Dot4<kX>(a, b, n, out);
      for (int k = 0; k < 4 && t + k < num_tokens; ++k) {
        s[r * kTile + t + k] = out[k] + (bias ? bias[r] : 0.0f);
      }
    }
  }
}
void ScoreTile(const Rows& rows, bool coords, int dim, const void* const* x, Format format,
               int num_tokens, int head_dim, float* HWY_RESTRICT s) {
  if (format == Format::kF16) {
    return ScoreTileAs<Format::kF16>(rows, coords, dim, x, num_tokens, head_dim, s);
  }
  ScoreTileAs<Format::kF32>(rows, coords, dim, x, num_tokens, head_dim, s);
}

// Scans the keys [begin, end) of one part for the rows into `state` (initialised here).
void ScanPart(const Context& ctx, int kv_head, const Rows& rows, const Part& part,
              const State& state) {
  const KvLayerView& view = *ctx.view;
  const int head_dim = ctx.head_dim;
  std::fill(state.max, state.max + rows.num_rows, kNegInf);
  std::fill(state.sum, state.sum + rows.num_rows, 0.0f);
  std::fill(state.acc, state.acc + static_cast<size_t>(rows.num_rows) * state.dim, 0.0f);
  const int end = std::min(part.end, rows.max_limit + 1);  // keys no row attends: skipped
  if (part.begin >= end) return;

  float* s = Scratch(kSlotScores, static_cast<size_t>(rows.num_rows) * kTile);
  float* keys = Scratch(kSlotKeys, static_cast<size_t>(kTile) * std::max(head_dim, ctx.k.dim));
  float* values = Scratch(kSlotValues, static_cast<size_t>(kTile) * std::max(head_dim, ctx.v.dim));
  const void* k_rows[kTile];
  const void* v_rows[kTile];

  if (part.kind != PartKind::kArena) {
    const KvF32Segment& seg = part.kind == PartKind::kSinks ? view.sinks : view.pending;
    for (int t0 = part.begin; t0 < end; t0 += kTile) {
      const int n = std::min(kTile, end - t0);
      for (int t = 0; t < n; ++t) {
        k_rows[t] = seg.KRow(t0 + t, kv_head, head_dim);
        v_rows[t] = seg.VRow(t0 + t, kv_head, head_dim);
      }
      ScoreTile(rows, false, head_dim, k_rows, Format::kF32, n, head_dim, s);
      SoftmaxTile(rows, t0, n, s, state);
      AccumulateTile(rows, s, v_rows, Format::kF32, n, state);
    }
    return;
  }

  const int codec_head = view.first_kv_head + kv_head;
  // Pieces: runs of consecutive rows of one block, cut where a tile of kTile keys (counted from
  // part.begin) ends. A tile gathers the pieces of its kTile keys, across blocks, so that its
  // softmax step is shared by as many keys as fit; and listing them first lets the units
  // kPrefetchTokens ahead be requested: blocks of a paged cache are KiBs apart, which stops the
  // hardware prefetchers at every block.
  struct Piece {
    int logical, count;
    int32_t block_id;
    int row;
  };
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  view.ForEachRun(part.begin, end, [&](int logical, int count, int32_t block_id, int row) {
    for (int t = 0; t < count;) {
      const int tile_end = part.begin + ((logical + t - part.begin) / kTile + 1) * kTile;
      const int n = std::min(count - t, tile_end - (logical + t));
      pieces.push_back({logical + t, n, block_id, row + t});
      t += n;
    }
  });
  auto prefetch = [&](const Piece& piece) {
    for (const KvArenaView* arena : {&view.k, &view.v}) {
      if (arena == &view.v && ctx.shared_coords) break;
      const std::byte* units = arena->Unit(piece.block_id, piece.row, kv_head);
      const size_t bytes = piece.count * arena->unit_bytes;
      for (size_t offset = 0; offset < bytes; offset += kCacheLine) hwy::Prefetch(units + offset);
    }
  };
  // Points ptrs at one side of a tile's pieces [first, last) and says how to read them: F16
  // coordinates in place, 4-bit coordinates dequantised and other codecs decoded into buffer.
  auto read_side = [&](const Side& side, const KvArenaView& arena, size_t first, size_t last,
                       float* buffer, const void** ptrs) {
    const bool in_place = side.coords != nullptr && !side.coords->int4_coordinates();
    int t = 0;
    for (size_t i = first; i < last; ++i) {
      const Piece& piece = pieces[i];
      const std::byte* units = arena.Unit(piece.block_id, piece.row, kv_head);
      float* dst = buffer + static_cast<size_t>(t) * side.dim;
      for (int k = 0; k < piece.count; ++k) {
        ptrs[t + k] = in_place ? static_cast<const void*>(units + k * arena.unit_bytes)
                               : static_cast<const void*>(dst + static_cast<size_t>(k) * side.dim);
      }
      if (side.coords != nullptr && !in_place) {
        DequantizeCoordinates(side.dim, units, arena.unit_bytes, piece.count, dst);
      } else if (side.coords == nullptr) {
        arena.codec_impl->DecodeHead(codec_head, {units, piece.count * arena.unit_bytes},
                                     {dst, static_cast<size_t>(piece.count) * head_dim});
      }
      t += piece.count;
    }
    return in_place ? Format::kF16 : Format::kF32;
  };
  size_t next = 0;  // the first piece not yet requested
  for (size_t first = 0; first < pieces.size();) {
    const int tile_begin = pieces[first].logical;
    size_t last = first;
    int n = 0;
    while (last < pieces.size() && pieces[last].logical < tile_begin + kTile)
      n += pieces[last++].count;
    for (; next < pieces.size() && pieces[next].logical < tile_begin + n + kPrefetchTokens;
         ++next) {
      prefetch(pieces[next]);
    }
    const Format k_format = read_side(ctx.k, view.k, first, last, keys, k_rows);
    ScoreTile(rows, ctx.k.coords != nullptr, ctx.k.dim, k_rows, k_format, n, head_dim, s);
    SoftmaxTile(rows, tile_begin, n, s, state);
    if (ctx.shared_coords) {
      AccumulateTile(rows, s, k_rows, k_format, n, state);
    } else {
      const Format v_format = read_side(ctx.v, view.v, first, last, values, v_rows);
      AccumulateTile(rows, s, v_rows, v_format, n, state);
    }
    first = last;
  }
}

// ---------------------------------------------------------------------------------------------
// Queries and the merge.

// Fills the rows of kv head `kv_head` for queries [q0, q1): row r = (query - q0) * group + j.
void PrepareRows(const Context& ctx, int kv_head, const float* q, int num_queries, int q0, int q1,
                 const AttentionParams& params, const RowBuffers& out) {
  const KvLayerView& view = *ctx.view;
  const size_t head_dim = static_cast<size_t>(ctx.head_dim);
  const int num_rows = (q1 - q0) * ctx.group;
  for (int r = 0; r < num_rows; ++r) {
    const int query = q0 + r / ctx.group;
    const int head = kv_head * ctx.group + r % ctx.group;
    const float* src = q + (static_cast<size_t>(query) * params.num_heads + head) * head_dim;
    float* dst = out.qd + r * head_dim;
    for (size_t i = 0; i < head_dim; ++i) dst[i] = src[i] * params.scale;
    // Keys are stored rotated (k' = H k): score with H q (q.k = Hq.Hk).
    if (view.keys_rotated) HadamardRotate({dst, head_dim});
    out.limit[r] = view.num_tokens - num_queries + query;
  }
  if (ctx.k.coords == nullptr) return;
  const int codec_head = view.first_kv_head + kv_head;
  const std::span<const float> mean = ctx.k.coords->mean(codec_head);
  const std::span<const float> basis = ctx.k.coords->basis(codec_head);
  const int rank = ctx.k.dim;
  RowDots(out.qd, num_rows, mean.data(), head_dim, out.bias, 1);
  for (int r = 0; r < num_rows; ++r) {
    // qc[r][j] = b_j . qd[r]: the basis rows against one query.
    RowDots(basis.data(), rank, out.qd + r * head_dim, head_dim,
            out.qc + static_cast<size_t>(r) * rank, 1);
  }
}

// Merges the partials of row r into out [head_dim]: each is rescaled to the common max;
// coordinate partials are summed in the value coordinate space and mapped back once.
void MergeRow(const Context& ctx, int kv_head, int r, const State* states, int num_states,
              float* HWY_RESTRICT out) {
  const int head_dim = ctx.head_dim;
  float global_max = kNegInf;
  for (int p = 0; p < num_states; ++p) global_max = std::max(global_max, states[p].max[r]);
  std::fill(out, out + head_dim, 0.0f);
  const int rank = ctx.v.coords != nullptr ? ctx.v.dim : 0;
  float* coord_acc = Scratch(kSlotMerge, static_cast<size_t>(rank) + 1);
  std::fill(coord_acc, coord_acc + rank, 0.0f);
  float denom = 0.0f, coord_sum = 0.0f;
  for (int p = 0; p < num_states; ++p) {
    const State& st = states[p];
    if (st.max[r] == kNegInf) continue;  // the row attends no key of this part
    const float w = std::exp(st.max[r] - global_max);
    denom += w * st.sum[r];
    const float* acc = st.acc + static_cast<size_t>(r) * st.dim;
    float* dst = st.coords ? coord_acc : out;
    for (int i = 0; i < st.dim; ++i) dst[i] += w * acc[i];
    if (st.coords) coord_sum += w * st.sum[r];
  }
  if (rank > 0 && coord_sum > 0.0f) {
    // mean_v * sum p + B_v^T (sum p c): head_dim * rank multiply-adds, once per query head.
    const int codec_head = ctx.view->first_kv_head + kv_head;
    const float* mean = ctx.v.coords->mean(codec_head).data();
    const float* basis = ctx.v.coords->basis(codec_head).data();
    ForVectors(head_dim, [&](auto d, size_t i) {
      auto a = hn::MulAdd(hn::Set(d, coord_sum), hn::LoadU(d, mean + i), hn::LoadU(d, out + i));
      for (int j = 0; j < rank; ++j) {
        a = hn::MulAdd(hn::Set(d, coord_acc[j]), hn::LoadU(d, basis + j * head_dim + i), a);
      }
      hn::StoreU(a, d, out + i);
    });
  }
  const float inv = 1.0f / denom;
  for (int i = 0; i < head_dim; ++i) out[i] *= inv;
}

Side MakeSide(const KvArenaView& arena, int head_dim) {
  Side side;
  side.arena = &arena;
  if (arena.codec == CodecId::kLowRank || arena.codec == CodecId::kLatent) {
    side.coords = static_cast<const CoordinateCodec*>(arena.codec_impl);
    side.dim = side.coords->rank();
  } else {
    side.dim = head_dim;
  }
  return side;
}

// One query: the sinks, chunks of the arena and the pending tokens are split-K partials,
// one task per (kv head, part); the queries are projected first, one task per kv head.
void Decode(const Context& ctx, const float* q, const AttentionParams& params, float* out,
            ThreadPool* pool) {
  const KvLayerView& view = *ctx.view;
  const int num_kv_heads = view.num_kv_heads, group = ctx.group;
  const size_t head_dim = static_cast<size_t>(ctx.head_dim);
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  const int num_arena = arena_end - arena_begin;
  const int wanted = (kTasksPerThread * num_threads + num_kv_heads - 1) / num_kv_heads;
  const int num_chunks = std::max(1, std::min(wanted, (num_arena + kMinChunk - 1) / kMinChunk));
  std::vector<Part> parts;
  if (view.sinks.end > 0) parts.push_back({PartKind::kSinks, 0, view.sinks.end});
  for (int c = 0; c < num_chunks; ++c) {
    const int b = arena_begin + static_cast<int>(static_cast<int64_t>(num_arena) * c / num_chunks);
    const int e =
        arena_begin + static_cast<int>(static_cast<int64_t>(num_arena) * (c + 1) / num_chunks);
    if (b < e) parts.push_back({PartKind::kArena, b, e});
  }
  if (arena_end < view.num_tokens)
    parts.push_back({PartKind::kPending, arena_end, view.num_tokens});
  const int num_parts = static_cast<int>(parts.size());

  // Per kv head: its rows, then one state per part, each on its own cache lines (tasks on
  // different threads write them: the rows once, the states every tile). Pointers into the
  // calling thread's scratch are taken here: the tasks run on other threads, with other
  // thread_locals.
  constexpr size_t kLineFloats = kCacheLine / sizeof(float);
  auto round_up = [&](size_t n) { return (n + kLineFloats - 1) / kLineFloats * kLineFloats; };
  const int k_rank = ctx.k.coords != nullptr ? ctx.k.dim : 0;
  const size_t rows_floats = round_up(RowFloats(group, ctx.head_dim, k_rank));
  size_t states_floats = 0;
  std::vector<size_t> state_offset(num_parts);
  for (int p = 0; p < num_parts; ++p) {
    state_offset[p] = states_floats;
    states_floats += round_up(StateFloats(group, PartDim(ctx, parts[p].kind)));
  }
  thread_local std::vector<float> call_floats;
  thread_local std::vector<int> call_ints;
  call_floats.resize(num_kv_heads * (rows_floats + states_floats) + kLineFloats);
  call_ints.resize(static_cast<size_t>(num_kv_heads) * group);
  float* const floats = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(call_floats.data()) + kCacheLine - 1) / kCacheLine * kCacheLine);
  int* const ints = call_ints.data();
  auto buffers_of = [&](int kv_head) {
    return CarveRows(floats + kv_head * rows_floats, ints + kv_head * group, group, ctx.head_dim,
                     k_rank);
  };
  auto state_of = [&](int kv_head, int p) {
    float* base = floats + num_kv_heads * rows_floats + kv_head * states_floats + state_offset[p];
    return MakeState(base, group, PartDim(ctx, parts[p].kind), PartCoords(ctx, parts[p].kind));
  };

  RunTasks(pool, num_kv_heads, [&](int64_t kv_head, int) {
    PrepareRows(ctx, static_cast<int>(kv_head), q, 1, 0, 1, params,
                buffers_of(static_cast<int>(kv_head)));
  });
  RunTasks(pool, static_cast<int64_t>(num_kv_heads) * num_parts, [&](int64_t task, int) {
    const int kv_head = static_cast<int>(task / num_parts);
    const int p = static_cast<int>(task % num_parts);
    ScanPart(ctx, kv_head, AsRows(buffers_of(kv_head), group, k_rank), parts[p],
             state_of(kv_head, p));
  });
  RunTasks(pool, num_kv_heads, [&](int64_t kv_head, int) {
    std::vector<State> states(num_parts);
    for (int p = 0; p < num_parts; ++p) states[p] = state_of(static_cast<int>(kv_head), p);
    for (int j = 0; j < group; ++j) {
      MergeRow(ctx, static_cast<int>(kv_head), j, states.data(), num_parts,
               out + (kv_head * group + j) * head_dim);
    }
  });
}

// Many queries (causal): one task per (kv head, tile of queries) runs the sinks, the arena and
// the pending tokens as three partials in its own scratch and merges them into its rows.
void Prefill(const Context& ctx, const float* q, int num_queries, const AttentionParams& params,
             float* out, ThreadPool* pool) {
  const KvLayerView& view = *ctx.view;
  const int group = ctx.group;
  const size_t head_dim = static_cast<size_t>(ctx.head_dim);
  const int queries_per_tile = std::max(1, kPrefillRows / group);
  const int num_tiles = (num_queries + queries_per_tile - 1) / queries_per_tile;
  const int k_rank = ctx.k.coords != nullptr ? ctx.k.dim : 0;
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  const Part parts[3] = {{PartKind::kSinks, 0, view.sinks.end},
                         {PartKind::kArena, arena_begin, arena_end},
                         {PartKind::kPending, arena_end, view.num_tokens}};

  RunTasks(pool, static_cast<int64_t>(view.num_kv_heads) * num_tiles, [&](int64_t task, int) {
    // Latest query tiles attend to the most keys: hand them out first.
    const int tile = num_tiles - 1 - static_cast<int>(task % num_tiles);
    const int kv_head = static_cast<int>(task / num_tiles);
    const int q0 = tile * queries_per_tile;
    const int q1 = std::min(num_queries, q0 + queries_per_tile);
    const int num_rows = (q1 - q0) * group;
    const RowBuffers buffers =
        CarveRows(Scratch(kSlotRows, RowFloats(num_rows, ctx.head_dim, k_rank)),
                  ScratchInts(num_rows), num_rows, ctx.head_dim, k_rank);
    PrepareRows(ctx, kv_head, q, num_queries, q0, q1, params, buffers);
    const Rows rows = AsRows(buffers, num_rows, k_rank);
    size_t floats = 0;
    for (const Part& part : parts) floats += StateFloats(num_rows, PartDim(ctx, part.kind));
    float* buffer = Scratch(kSlotStates, floats);
    State states[3];
    for (int p = 0; p < 3; ++p) {
      states[p] =
          MakeState(buffer, num_rows, PartDim(ctx, parts[p].kind), PartCoords(ctx, parts[p].kind));
      buffer += StateFloats(num_rows, states[p].dim);
      ScanPart(ctx, kv_head, rows, parts[p], states[p]);
    }
    for (int r = 0; r < num_rows; ++r) {
      const int query = q0 + r / group;
      const int head = kv_head * group + r % group;
      MergeRow(ctx, kv_head, r, states, 3,
               out + (static_cast<size_t>(query) * params.num_heads + head) * head_dim);
    }
  });
}

}  // namespace

void LowRankAttentionKernel(const KvLayerView& view, const float* q, int num_queries,
                            const AttentionParams& params, float* out, ThreadPool* pool) {
  Context ctx;
  ctx.view = &view;
  ctx.head_dim = view.head_dim;
  ctx.group = params.num_heads / view.num_kv_heads;
  ctx.k = MakeSide(view.k, view.head_dim);
  ctx.v = MakeSide(view.v, view.head_dim);
  ctx.shared_coords =
      ctx.k.coords != nullptr && ctx.v.coords != nullptr && view.k.base == view.v.base &&
      view.k.head_stride == view.v.head_stride && view.k.block_stride == view.v.block_stride &&
      view.k.unit_bytes == view.v.unit_bytes && ctx.k.coords->rank() == ctx.v.coords->rank() &&
      ctx.k.coords->int4_coordinates() == ctx.v.coords->int4_coordinates();
  if (num_queries == 1) return Decode(ctx, q, params, out, pool);
  Prefill(ctx, q, num_queries, params, out, pool);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(LowRankAttentionKernel);

namespace {
bool IsCoordinateArena(const KvArenaView& arena) {
  return (arena.codec == CodecId::kLowRank || arena.codec == CodecId::kLatent) &&
         arena.codec_impl != nullptr;
}
}  // namespace

bool LowRankFormApplies(const KvLayerView& view, const AttentionScores* scores) {
  return scores == nullptr && (IsCoordinateArena(view.k) || IsCoordinateArena(view.v)) &&
         view.k.codec_impl != nullptr && view.v.codec_impl != nullptr && view.k.group_tokens == 1 &&
         view.v.group_tokens == 1 && view.uniform_heads();
}

void LowRankAttention(const KvLayerView& view, const float* q, int num_queries,
                      const AttentionParams& params, float* out, ThreadPool* pool) {
  KVS_CHECK(LowRankFormApplies(view, nullptr));
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  KVS_CHECK(!view.keys_rotated || IsPowerOfTwo(view.head_dim));
  if (num_queries == 0) return;
  HWY_DYNAMIC_DISPATCH(LowRankAttentionKernel)(view, q, num_queries, params, out, pool);
}

}  // namespace kvstack
#endif  // HWY_ONCE
