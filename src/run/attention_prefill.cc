// The prefill kernel behind Attention() for many query tokens (src/run/attention.h): tiled
// online softmax over keys and values decoded to F32 a small tile at a time, plus the second
// pass that computes AttentionScores. Compiled for every Highway target, picked at run time.

#include <algorithm>
#include <cmath>
#include <vector>

#include "run/attention.h"
#include "run/attention_kernels.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/attention_prefill.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "run/attention_readers-inl.h"
#include "run/attention_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Keys per tile. A multiple of kKeysPerStep.
constexpr int kPrefillKeyTile = 32;
constexpr int kKeysPerStep = 4;

// A task owns one kv head and a tile of consecutive queries; its rows are (query, head of the
// group) pairs, r = query_in_tile * group + j, padded to whole pairs of vectors. Everything is
// kept transposed — queries, scores and outputs as [head_dim or key][row] — so that one vector
// holds the same quantity for many rows: the softmax needs no horizontal reductions, and each
// key or value element is broadcast once and reused by a whole vector of rows. Keys and values
// are decoded one small tile at a time into per-thread scratch (like SRAM tiles on a GPU),
// amortised over every row of the query tile.

// How one arena's tiles are decoded: with the SIMD readers where its format has one
// (attention_readers-inl.h), else with the codec's own Decode (DecodeArenaTokens).
struct TileSource {
  SideSpec side;
  DecodeRowsFn decode = nullptr;
};

template <class D>
TileSource MakeTileSource(const KvLayerView& view, bool keys) {
  TileSource source;
  source.side = ArenaSide(view, keys ? view.k : view.v, keys, hn::Lanes(D()));
  if (source.side.tiled) source.side = UntiledSide(source.side);  // (rows copied out of tiles)
  if (source.side.fill != FillKind::kDecoded) source.decode = DecodeRowsFor<D>(source.side.reader);
  return source;
}

TileSource ArenaTileSource(const KvLayerView& view, bool keys) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  if (head_dim % hn::Lanes(DF()) == 0) return MakeTileSource<DF>(view, keys);
  if (head_dim % 4 == 0) return MakeTileSource<hn::CappedTag<float, 4>>(view, keys);
  return {};
}

// Copies tokens [t0, t1) of one kv head from any mix of the three sources into F32 rows.
// dst: [t1 - t0][head_dim].
void LoadTokensF32(const KvLayerView& view, bool keys, const TileSource& source, int kv_head,
                   int t0, int t1, float* HWY_RESTRICT dst) {
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
  if (a0 < a1 && source.decode != nullptr) {
    RowSet rows;
    FillRows(view, source.side, keys, kv_head, a0, a1, &rows);
    source.decode(rows, static_cast<size_t>(a1 - a0), head_dim,
                  dst + static_cast<size_t>(a0 - t0) * head_dim);
  } else if (a0 < a1) {
    DecodeArenaTokens(view, keys ? view.k : view.v, kv_head, a0, a1,
                      dst + static_cast<size_t>(a0 - t0) * head_dim);
  }
  copy_segment(view.pending, std::max(t0, arena_end), t1);
}

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
void LoadTile(const KvLayerView& view, bool keys, const TileSource& source, int kv_head, int t0,
              int t1, float* HWY_RESTRICT tile) {
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  LoadTokensF32(view, keys, source, kv_head, t0, t1, tile);
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
  const TileSource k_source = ArenaTileSource(view, true);
  const TileSource v_source = ArenaTileSource(view, false);
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
      LoadTile(view, true, k_source, kv_head, t0, t1, kf);
      LoadTile(view, false, v_source, kv_head, t0, t1, vf);
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
          auto poison = hn::FirstN(df, 0);  // (no lanes)
          for (size_t k = 0; k < num_keys; ++k) {
            const auto x = hn::LoadU(df, st + k * row_stride + r);
            vmax = hn::Max(vmax, x);
            poison = hn::Or(poison, PoisonsSoftmax(df, x));
          }
          // Rows with a NaN or +inf score (PoisonsSoftmax): max +inf, so that their keys get
          // exp(-inf) = 0 from here on, and below, their keys of this tile 0 and their sum NaN.
          const bool poisoned = !hn::AllFalse(df, poison);
          vmax = hn::IfThenElse(poison, hn::Set(df, kInf), vmax);
          auto vsum = hn::Zero(df);
          for (size_t k = 0; k < num_keys; ++k) {
            float* s = st + k * row_stride + r;
            auto p = ExpOfScore(df, hn::Sub(hn::LoadU(df, s), vmax));
            if (HWY_UNLIKELY(poisoned)) p = hn::IfThenZeroElse(poison, p);
            hn::StoreU(p, df, s);
            vsum = hn::Add(vsum, p);
          }
          // Exp(-inf) == 0: the first tile starts the accumulator from nothing.
          const auto va = hn::Exp(df, hn::Sub(old_max, vmax));
          hn::StoreU(va, df, alpha + r);
          const auto sum = hn::MulAdd(hn::LoadU(df, row_sum + r), va, vsum);
          hn::StoreU(hn::IfThenElse(poison, hn::NaN(df), sum), df, row_sum + r);
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
  const TileSource k_source = ArenaTileSource(view, true);
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
      (kTasksPerThread * num_threads + view.num_kv_heads - 1) / view.num_kv_heads;
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
        LoadTile(view, true, k_source, kv_head, t0, t1, kf);
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

}  // namespace

void PrefillKernel(const KvLayerView& view, const float* q, int num_queries,
                   const AttentionParams& params, float* out, ThreadPool* pool,
                   const AttentionScores* scores) {
  if (scores == nullptr) return PrefillImpl(view, q, num_queries, params, out, pool, 0, nullptr);
  thread_local std::vector<float> stats;  // [scored queries][num_heads][2]
  stats.resize(static_cast<size_t>(num_queries - scores->first_query) * params.num_heads * 2);
  PrefillImpl(view, q, num_queries, params, out, pool, scores->first_query, stats.data());
  PrefillScores(view, q, num_queries, params, *scores, stats.data(), pool);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvstack
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvstack {

HWY_EXPORT(PrefillKernel);

void PrefillAttention(const KvLayerView& view, const float* q, int num_queries,
                      const AttentionParams& params, float* out, ThreadPool* pool,
                      const AttentionScores* scores) {
  HWY_DYNAMIC_DISPATCH(PrefillKernel)(view, q, num_queries, params, out, pool, scores);
}

}  // namespace kvstack
#endif  // HWY_ONCE
