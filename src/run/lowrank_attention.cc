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
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using D4 = hn::CappedTag<float, 4>;
using D1 = hn::CappedTag<float, 1>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Keys per tile: a tile's scores and coordinates stay in L1. A multiple of every vector width.
constexpr int kTile = 64;
// Decode: the smallest chunk of arena keys worth a task of its own, and tasks per thread.
constexpr int kMinChunk = 256;
constexpr int kTasksPerThread = 4;
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

// Integer scratch, same rule: the rows' causal limits and the tiles' live flags.
enum IntSlot { kIntLimits, kIntLive, kNumIntSlots };
int* ScratchInts(IntSlot slot, size_t n) {
  thread_local std::vector<int> buffers[kNumIntSlots];
  std::vector<int>& buffer = buffers[slot];
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

// sums[k] += q_k . x over [i, n) in vectors of d, for kRows rows q_k = q + k * q_stride;
// returns where it stopped (the rest does not fill a vector of d).
template <int kRows, class D>
HWY_INLINE size_t DotPart(D d, const float* HWY_RESTRICT q, size_t q_stride,
                          const float* HWY_RESTRICT x, size_t i, size_t n, float* sums) {
  const size_t lanes = hn::Lanes(d);
  if (i + lanes > n) return i;
  hn::Vec<D> acc[kRows];
  for (int k = 0; k < kRows; ++k) acc[k] = hn::Zero(d);
  for (; i + lanes <= n; i += lanes) {
    const auto xv = hn::LoadU(d, x + i);
    for (int k = 0; k < kRows; ++k)
      acc[k] = hn::MulAdd(hn::LoadU(d, q + k * q_stride + i), xv, acc[k]);
  }
  for (int k = 0; k < kRows; ++k) sums[k] += hn::GetLane(hn::SumOfLanes(d, acc[k]));
  return i;
}

// sums[k] = q_k . x (length n) for kRows rows sharing one x.
template <int kRows>
HWY_INLINE void Dots(const float* q, size_t q_stride, const float* x, size_t n, float* sums) {
  for (int k = 0; k < kRows; ++k) sums[k] = 0.0f;
  size_t i = DotPart<kRows>(DF(), q, q_stride, x, 0, n, sums);
  i = DotPart<kRows>(D4(), q, q_stride, x, i, n, sums);
  DotPart<kRows>(D1(), q, q_stride, x, i, n, sums);
}

// out[r] = q_r . x + (bias ? bias[r] : 0) for num_rows rows q_r = q + r * q_stride.
void RowDots(const float* q, size_t q_stride, const float* bias, int num_rows, const float* x,
             size_t n, float* out, size_t out_stride) {
  float sums[4];
  int r = 0;
  for (; r + 4 <= num_rows; r += 4) {
    Dots<4>(q + r * q_stride, q_stride, x, n, sums);
    for (int k = 0; k < 4; ++k) out[(r + k) * out_stride] = sums[k] + (bias ? bias[r + k] : 0.0f);
  }
  for (; r < num_rows; ++r) {
    Dots<1>(q + r * q_stride, q_stride, x, n, sums);
    out[r * out_stride] = sums[0] + (bias ? bias[r] : 0.0f);
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

// Converts the coordinates of num_tokens consecutive units to F32: out [num_tokens][rank].
void LoadCoordinates(const CoordinateCodec& codec, const std::byte* units, size_t unit_bytes,
                     int num_tokens, float* HWY_RESTRICT out) {
  const size_t rank = static_cast<size_t>(codec.rank());
  for (int t = 0; t < num_tokens; ++t) {
    const std::byte* unit = units + t * unit_bytes;
    float* dst = out + t * rank;
    if (!codec.int4_coordinates()) {
      const auto* src = reinterpret_cast<const hwy::float16_t*>(unit);
      ForVectors(rank, [&](auto d, size_t i) {
        const hn::Rebind<hwy::float16_t, decltype(d)> d16;
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(d16, src + i)), d, dst + i);
      });
      continue;
    }
    // [f16 scale][f16 min][codes, low nibble first]: the codec's own byte format.
    uint16_t bits[2];
    std::memcpy(bits, unit, sizeof(bits));
    const float scale = F16ToF32(bits[0]);
    const float min = F16ToF32(bits[1]);
    const auto* codes = reinterpret_cast<const uint8_t*>(unit + 4);
    for (size_t j = 0; j + 1 < rank; j += 2) {
      const unsigned byte = codes[j / 2];
      dst[j] = static_cast<float>(byte & 15u) * scale + min;
      dst[j + 1] = static_cast<float>(byte >> 4) * scale + min;
    }
    if (rank % 2 != 0) dst[rank - 1] = static_cast<float>(codes[rank / 2] & 15u) * scale + min;
  }
}

// Online softmax over one tile of num_tokens keys starting at logical first_key, for every
// row: masks the keys past the row's limit, rescales the row's state to the new running max
// and turns the scores s [num_rows][kTile] into weights in place. live[r]: whether the row
// attends any key of the tile (the rest of its scores are then meaningless).
void SoftmaxTile(const Rows& rows, int first_key, int num_tokens, float* HWY_RESTRICT s,
                 const State& state, int* live) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (int r = 0; r < rows.num_rows; ++r) {
    float* sr = s + static_cast<size_t>(r) * kTile;
    const int n = std::min(num_tokens, rows.limit[r] - first_key + 1);
    live[r] = n > 0;
    if (n <= 0) continue;
    const size_t padded = (static_cast<size_t>(n) + lanes - 1) / lanes * lanes;
    for (size_t t = n; t < padded; ++t) sr[t] = kNegInf;
    auto vmax = hn::Set(df, kNegInf);
    for (size_t t = 0; t < padded; t += lanes) vmax = hn::Max(vmax, hn::LoadU(df, sr + t));
    const float tile_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
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
      const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, sr + t), vm));
      hn::StoreU(p, df, sr + t);
      vsum = hn::Add(vsum, p);
    }
    state.sum[r] += hn::GetLane(hn::SumOfLanes(df, vsum));
    for (int t = n; t < num_tokens; ++t) sr[t] = 0.0f;
  }
}

// acc[r] += sum_t p[r][t] * x_t for the live rows; x_t = x + t * x_stride, dim floats.
void AccumulateTile(const Rows& rows, const float* HWY_RESTRICT p, const int* live,
                    const float* const* x, int num_tokens, const State& state) {
  for (int r = 0; r < rows.num_rows; ++r) {
    if (!live[r]) continue;
    const float* pr = p + static_cast<size_t>(r) * kTile;
    float* acc = state.acc + static_cast<size_t>(r) * state.dim;
    ForVectors(state.dim, [&](auto d, size_t i) {
      auto a = hn::LoadU(d, acc + i);
      for (int t = 0; t < num_tokens; ++t)
        a = hn::MulAdd(hn::Set(d, pr[t]), hn::LoadU(d, x[t] + i), a);
      hn::StoreU(a, d, acc + i);
    });
  }
}

// Scores s [num_rows][kTile] of one tile's keys, x_t pointing at each key as read (dim floats):
// coordinates against the projected queries plus the mean's bias, or full keys against qd.
void ScoreTile(const Rows& rows, bool coords, int dim, const float* const* x, int num_tokens,
               int head_dim, float* HWY_RESTRICT s) {
  for (int t = 0; t < num_tokens; ++t) {
    if (coords) {
      RowDots(rows.qc, dim, rows.bias, rows.num_rows, x[t], dim, s + t, kTile);
    } else {
      RowDots(rows.qd, head_dim, nullptr, rows.num_rows, x[t], head_dim, s + t, kTile);
    }
  }
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
  const float* k_rows[kTile];
  const float* v_rows[kTile];
  int* live = ScratchInts(kIntLive, rows.num_rows);

  if (part.kind != PartKind::kArena) {
    const KvF32Segment& seg = part.kind == PartKind::kSinks ? view.sinks : view.pending;
    for (int t0 = part.begin; t0 < end; t0 += kTile) {
      const int n = std::min(kTile, end - t0);
      for (int t = 0; t < n; ++t) {
        k_rows[t] = seg.KRow(t0 + t, kv_head, head_dim);
        v_rows[t] = seg.VRow(t0 + t, kv_head, head_dim);
      }
      ScoreTile(rows, false, head_dim, k_rows, n, head_dim, s);
      SoftmaxTile(rows, t0, n, s, state, live);
      AccumulateTile(rows, s, live, v_rows, n, state);
    }
    return;
  }

  const int codec_head = view.first_kv_head + kv_head;
  // Reads the units of one side for tokens at consecutive rows: coordinates or decoded rows.
  auto read_side = [&](const Side& side, const std::byte* units, int n, float* buffer,
                       const float** ptrs) {
    const size_t unit_bytes = side.arena->unit_bytes;
    if (side.coords != nullptr) {
      LoadCoordinates(*side.coords, units, unit_bytes, n, buffer);
    } else {
      side.arena->codec_impl->DecodeHead(codec_head, {units, n * unit_bytes},
                                         {buffer, static_cast<size_t>(n) * head_dim});
    }
    for (int t = 0; t < n; ++t) ptrs[t] = buffer + static_cast<size_t>(t) * side.dim;
  };
  view.ForEachRun(part.begin, end, [&](int logical, int count, int32_t block_id, int row) {
    for (int t0 = 0; t0 < count; t0 += kTile) {
      const int n = std::min(kTile, count - t0);
      read_side(ctx.k, view.k.Unit(block_id, row + t0, kv_head), n, keys, k_rows);
      ScoreTile(rows, ctx.k.coords != nullptr, ctx.k.dim, k_rows, n, head_dim, s);
      SoftmaxTile(rows, logical + t0, n, s, state, live);
      if (ctx.shared_coords) {
        AccumulateTile(rows, s, live, k_rows, n, state);
      } else {
        read_side(ctx.v, view.v.Unit(block_id, row + t0, kv_head), n, values, v_rows);
        AccumulateTile(rows, s, live, v_rows, n, state);
      }
    }
  });
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
  RowDots(out.qd, head_dim, nullptr, num_rows, mean.data(), head_dim, out.bias, 1);
  for (int r = 0; r < num_rows; ++r) {
    // qc[r][j] = b_j . qd[r]: the basis rows against one query.
    RowDots(basis.data(), head_dim, nullptr, rank, out.qd + r * head_dim, head_dim,
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

// Runs fn(i, thread) for i in [0, n) on the pool (or the calling thread).
template <class Fn>
void RunTasks(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  } else {
    pool->Run(n, fn);
  }
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

  // Per kv head: its rows, then one state per part. Pointers into the calling thread's
  // scratch are taken here: the tasks run on other threads, with other thread_locals.
  const int k_rank = ctx.k.coords != nullptr ? ctx.k.dim : 0;
  const size_t rows_floats = RowFloats(group, ctx.head_dim, k_rank);
  size_t states_floats = 0;
  std::vector<size_t> state_offset(num_parts);
  for (int p = 0; p < num_parts; ++p) {
    state_offset[p] = states_floats;
    states_floats += StateFloats(group, PartDim(ctx, parts[p].kind));
  }
  thread_local std::vector<float> call_floats;
  thread_local std::vector<int> call_ints;
  call_floats.resize(num_kv_heads * (rows_floats + states_floats));
  call_ints.resize(static_cast<size_t>(num_kv_heads) * group);
  float* const floats = call_floats.data();
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
                  ScratchInts(kIntLimits, num_rows), num_rows, ctx.head_dim, k_rank);
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
