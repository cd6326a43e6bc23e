// The flash-decoding kernel behind Attention() for one query token (src/run/attention.h),
// compiled for every Highway target and picked at run time.
//
// A view holds up to three sources of tokens: F32 sinks, the encoded arena and F32 pending
// tokens. Decode treats each non-empty source (and each chunk of the arena) as one split-K
// partial and merges them. Per tile of keys, a "fill" step finds where each key's and value's
// bytes are (or, for codecs without a fast path, decodes them into per-thread scratch with the
// codec's own Decode) and a reader (attention_readers-inl.h) scores or accumulates them,
// dequantising in registers. With AttentionScores, each tile's exp(logit - running max) is kept
// and turned into probabilities once every head's max and sum are known: by the task itself when
// it holds all of its kv head's keys (the common case), else in a pass after the merge.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "run/attention.h"
#include "run/attention_kernels.h"

// SSSE3 machines fall back to the portable EMU128 build; compiling one target fewer keeps the
// readers x kernels affordable to build.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "run/attention_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Order matters: foreach_target.h must come before highway.h.
#include "hwy/highway.h"
#include "run/attention_amx-inl.h"
#include "run/attention_bf16-inl.h"
#include "run/attention_madd-inl.h"
#include "run/attention_readers-inl.h"
#include "run/attention_rows-inl.h"
#include "run/attention_vnni-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvstack {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Where a decode task leaves what the attention scores of selection policies need: each key's
// exp(score - m), with m the running max when its tile was folded in (recorded per tile), so
// that the final probability is that times exp(m - max) / sum, one multiply per key.
struct ScoreSink {
  float* probs = nullptr;  // [group][prob_stride], indexed by logical token
  size_t prob_stride = 0;
  float* tile_max = nullptr;  // [tile of the task][group]
  // When the task holds every key of its kv head (one split-K part, the common case with few
  // threads per kv head), its own final max and sum are the head's: it then adds the scores
  // into this row itself (AddPartScores), while its probabilities are still in its cache, and
  // the separate pass after the merge is skipped. Null: the pass does it.
  float* row = nullptr;           // scores.out + kv_head * scores.stride
  float* head_max = nullptr;      // [group]: written by the task when it adds into `row`
  float* head_inv_sum = nullptr;  // [group]: 1 / softmax sum, likewise
  bool use_max = true;            // the group's aggregation: max, or mean (sum times group_weight)
  float group_weight = 1.0f;
};

// Adds one split-K part's attention scores into a kv head's score row: for each of its keys t
// in [begin, end), p(j, t) = probs[j][t] * exp(tile_max - max_j) / sum_j, aggregated over the
// group's query heads j (max, or sum times group_weight).
//   probs: [group][prob_stride] of this kv head; part_max: [tile of the part][group];
//   head_max, head_inv_sum: [group], each query head's final max and 1 / softmax sum.
void AddPartScores(const float* HWY_RESTRICT probs, size_t prob_stride,
                   const float* HWY_RESTRICT part_max, int begin, int end, const float* head_max,
                   const float* head_inv_sum, int group, bool use_max, float group_weight,
                   float* HWY_RESTRICT row) {
  const DF df;
  const size_t n = hn::Lanes(df);
  thread_local std::vector<float> factors;  // [group]
  factors.resize(group);
  float* factor = factors.data();
  for (int t0 = begin, tile = 0; t0 < end; t0 += kDecodeTile, ++tile) {
    const size_t t1 = static_cast<size_t>(std::min(end, t0 + kDecodeTile));
    for (int j = 0; j < group; ++j) {
      factor[j] =
          std::exp(part_max[tile * group + j] - head_max[j]) * head_inv_sum[j] * group_weight;
    }
    size_t t = static_cast<size_t>(t0);
    for (; t + n <= t1; t += n) {
      auto agg = hn::Zero(df);
      for (int j = 0; j < group; ++j) {
        const auto p = hn::Mul(hn::LoadU(df, probs + j * prob_stride + t), hn::Set(df, factor[j]));
        agg = use_max ? hn::Max(agg, p) : hn::Add(agg, p);
      }
      hn::StoreU(hn::Add(agg, hn::LoadU(df, row + t)), df, row + t);
    }
    for (; t < t1; ++t) {
      float agg = 0.0f;
      for (int j = 0; j < group; ++j) {
        const float p = probs[j * prob_stride + t] * factor[j];
        agg = use_max ? std::max(agg, p) : agg + p;
      }
      row[t] += agg;
    }
  }
}

// One decode task: keys [begin, end) of one source of kv head `kv_head` against the `group`
// query heads that share it. Leaves the unnormalised partial result in `state` and, with a
// sink (not null), the keys' unnormalised probabilities for the attention scores:
//   q:      [group, head_dim] (already scaled and rotated)
//   state:  [group, head_dim + 2]: acc[head_dim], running max, running sum
template <class D>
void DecodeChunk(const KvLayerView& view, const SideSpec& k_side, const SideSpec& v_side,
                 int kv_head, int begin, int end, const float* HWY_RESTRICT q, int group,
                 float* HWY_RESTRICT state, const ScoreSink* sink) {
  const DF df;
  const size_t nf = hn::Lanes(df);
  const size_t nd = hn::Lanes(D());
  const size_t head_dim = static_cast<size_t>(view.head_dim);
  const size_t state_stride = head_dim + 2;
  // Scores padded to whole vectors with -inf, so that max/exp/sum need no scalar tail. A task
  // that adds its own scores (sink->row) owns its kv head's probability rows, padding included,
  // so its tiles are scored and turned into probabilities right there, with nothing to copy;
  // otherwise in per-thread scratch, since the padding would cross into another task's keys.
  const bool in_place = sink != nullptr && sink->row != nullptr;
  const size_t s_stride = in_place ? sink->prob_stride : (kDecodeTile + nf - 1) / nf * nf;
  float* const scratch =
      in_place ? nullptr : Scratch(kSlotScores, static_cast<size_t>(group) * s_stride);
  // Each head's largest probability in the tile, then their sums: the integer value readers'
  // TileWeightStats, taken as the softmax writes the probabilities.
  float* const p_stats = Scratch(kSlotWeightStats, 2 * static_cast<size_t>(group));
  const TileWeightStats stats{p_stats, p_stats + group};
  const Reader k_reader = SplitOrderReader<D>(k_side.reader, head_dim);
  const Reader v_reader = SplitOrderReader<D>(v_side.reader, head_dim);
  const ScoreFn score = ScoreFor<D>(k_reader);
  const AccumulateFn accumulate = AccumulateFor<D>(v_reader);
  // Integer keys on CPUs with VNNI: the query quantised once per task (attention_vnni-inl.h).
  const VnniPlan vnni = PlanVnni(k_side, head_dim, nd);
  const VnniPlan vnni_values = PlanVnni(v_side, head_dim, nd);
  // int8, 4- and 2-bit and KIVI keys and int8, 4- and 2-bit values on CPUs with AVX2 but not
  // AVX-512: the same plans (int8 keys: an int16 query), multiplied by vpmaddubsw and vpmaddwd
  // (attention_madd-inl.h).
  const VnniPlan madd = vnni.ok ? VnniPlan{} : PlanMaddKeys(k_side, head_dim, nd);
  const VnniPlan madd_values = vnni_values.ok ? VnniPlan{} : PlanMaddValues(v_side, head_dim, nd);
  // int8 keys and values on CPUs with AMX, where it pays: by tile multiplies
  // (attention_amx-inl.h).
  const bool amx_keys = AmxKeysApply(vnni, group);
  const bool amx_values = AmxValuesApply(vnni_values, group);
  // BF16 and FP8 keys and values on CPUs with AVX512_BF16, FP8 in FP16 where AVX512-FP16
  // (attention_bf16-inl.h, attention_half-inl.h).
  const Bf16Plan bf16 = PlanBf16(k_side, v_side, head_dim, nd, group);
  thread_local std::vector<VnniQuery> vnni_queries;
  thread_local KiviQueries kivi_queries;
  thread_local AmxQueries amx_queries;
  // The queries as 16-bit floats for the BF16 readers' keys: FP16 bits with half_keys (scaled,
  // half_unscale), else BF16 bits unless widened (F32, widened_queries).
  thread_local std::vector<uint16_t> q16;
  thread_local std::vector<float> widened_queries, half_unscale;
  if (bf16.half_keys) {
    q16.resize(static_cast<size_t>(group) * head_dim);
    half_unscale.resize(group);
    HalfPrepareQueries(bf16.key_reader, q, group, head_dim, q16.data(), half_unscale.data());
  } else if (bf16.keys && bf16.widen) {
    widened_queries.resize(static_cast<size_t>(group) * head_dim);
    Bf16WidenQueries(q, group, head_dim, widened_queries.data());
  } else if (bf16.keys) {
    q16.resize(static_cast<size_t>(group) * head_dim);
    Bf16PrepareQueries(q, group, head_dim, q16.data());
  }
  // The float readers' query, in the order a split reader reads its keys.
  const bool float_keys = !amx_keys && !vnni.ok && !madd.ok && !bf16.keys;
  const float* float_q = q;
  if (float_keys && IsSplitReader(k_reader)) {
    const size_t num = static_cast<size_t>(group) * head_dim;
    float* split_q = Scratch(kSlotSplitQuery, num);
    SplitQueries(D(), k_reader, q, num, split_q);
    float_q = split_q;
  }
  if (amx_keys) {
    AmxPrepareQueries(vnni, q, group, &amx_queries);
  } else if (vnni.ok && vnni.kivi) {  // (quantised per unit: its scales fold into the query)
    KiviPrepareQueries(vnni, q, group, &kivi_queries);
  } else if (vnni.ok) {
    vnni_queries.resize(group);
    VnniPrepareQueries(vnni, q, group, vnni_queries.data());
  } else if (madd.ok && madd.kivi) {
    MaddKiviPrepareQueries(madd, q, group, &kivi_queries);
  } else if (madd.ok) {
    vnni_queries.resize(group);
    MaddPrepareQueries(madd, q, group, vnni_queries.data());
  }
  // The keys of this tile and the next (filled before this tile's value pass, which requests
  // them: RowRequests), and this tile's values.
  RowSet key_sets[2], values;
  RowSet* keys_now = &key_sets[0];
  RowSet* keys_next = &key_sets[1];
  if (begin < end) {
    FillRows(view, k_side, true, kv_head, begin, std::min(end, begin + kDecodeTile), keys_now);
  }
  RowRequests next_keys;
  size_t value_steps = 0;  // RequestStep calls of the last value pass
  for (int j = 0; j < group; ++j) {
    float* st = state + j * state_stride;
    std::fill(st, st + head_dim, 0.0f);
    st[head_dim] = kNegInf;   // running max
    st[head_dim + 1] = 0.0f;  // running sum
  }

  for (int t0 = begin; t0 < end; t0 += kDecodeTile) {
    const int t1 = std::min(end, t0 + kDecodeTile);
    const size_t num_keys = static_cast<size_t>(t1 - t0);
    float* const s = in_place ? sink->probs + t0 : scratch;  // [group, s_stride]
    const RowSet& keys = *keys_now;
    FillRows(view, v_side, false, kv_head, t0, t1, &values);
    // (With kValuePassRequests, the value pass before requested a later tile's keys.)
    if (t0 == begin || !kValuePassRequests) PrefetchTileStart(keys, num_keys);
    PrefetchTileStart(values, num_keys);
    if (amx_keys) {
      AmxScoreTile(vnni, keys, values, num_keys, amx_queries, group, s, s_stride);
    } else if (vnni.ok) {
      VnniScoreTile(vnni, keys, values, num_keys, vnni_queries.data(), kivi_queries, group, s,
                    s_stride);
    } else if (madd.ok) {
      MaddScoreTile(madd, keys, values, num_keys, vnni_queries.data(), kivi_queries, group, s,
                    s_stride);
    } else if (bf16.keys) {
      Bf16ScoreTile(bf16, keys, values, num_keys, q16.data(), half_unscale.data(),
                    widened_queries.data(), group, head_dim, s, s_stride);
    } else {
      score(keys, values, num_keys, float_q, group, head_dim, s, s_stride);
    }
    // Softmax of the tile, folded into the running state.
    const size_t padded = (num_keys + nf - 1) / nf * nf;
    for (int j = 0; j < group; ++j) {
      float* sj = s + j * s_stride;
      float* st = state + j * state_stride;
      for (size_t i = num_keys; i < padded; ++i) sj[i] = kNegInf;
      float tile_max;
      if (HWY_UNLIKELY(MaxOfScores(df, sj, padded, &tile_max))) {  // the head's output is NaN
        std::fill(sj, sj + padded, 0.0f);
        p_stats[j] = p_stats[group + j] = 0.0f;
        std::fill(st, st + head_dim, std::numeric_limits<float>::quiet_NaN());
        st[head_dim] = kInf;
        st[head_dim + 1] = std::numeric_limits<float>::quiet_NaN();
        if (sink != nullptr) {
          if (!in_place) std::fill_n(sink->probs + j * sink->prob_stride + t0, num_keys, 0.0f);
          sink->tile_max[(t0 - begin) / kDecodeTile * group + j] = kInf;
        }
        continue;
      }
      const float new_max = std::max(st[head_dim], tile_max);
      const auto vnew_max = hn::Set(df, new_max);
      auto vsum = hn::Zero(df), vmax = hn::Zero(df);
      for (size_t i = 0; i < padded; i += nf) {
        const auto p = ExpOfScore(df, hn::Sub(hn::LoadU(df, sj + i), vnew_max));
        hn::StoreU(p, df, sj + i);
        vsum = hn::Add(vsum, p);
        vmax = hn::Max(vmax, p);
      }
      p_stats[j] = hn::GetLane(hn::MaxOfLanes(df, vmax));
      p_stats[group + j] = hn::GetLane(hn::SumOfLanes(df, vsum));
      // exp(-inf) == 0 on the first tile, where the accumulator is still empty.
      const float alpha = std::exp(st[head_dim] - new_max);
      if (alpha != 1.0f) {
        for (size_t i = 0; i < head_dim; ++i) st[i] *= alpha;
      }
      st[head_dim + 1] = st[head_dim + 1] * alpha + p_stats[group + j];
      st[head_dim] = new_max;
      if (sink != nullptr) {  // once per tile: the no-scores path pays one branch per tile
        if (!in_place) {
          std::memcpy(sink->probs + j * sink->prob_stride + t0, sj, num_keys * sizeof(float));
        }
        sink->tile_max[(t0 - begin) / kDecodeTile * group + j] = new_max;
      }
    }
    const int t2 = std::min(end, t1 + kDecodeTile);  // the next tile's end
    if (t1 < end) FillRows(view, k_side, true, kv_head, t1, t2, keys_next);
    next_keys.Start(kValuePassRequests && t1 < end ? keys_next : nullptr,
                    static_cast<size_t>(t2 - t1), value_steps > 0 ? value_steps : num_keys);
    values.requests = &next_keys;
    if (amx_values) {
      AmxAccumulateTile(vnni_values, values, num_keys, s, s_stride, group, state, state_stride);
    } else if (vnni_values.ok) {
      VnniAccumulateTile(vnni_values, values, num_keys, s, s_stride, stats, group, state,
                         state_stride);
    } else if (madd_values.ok) {
      MaddAccumulateTile(madd_values, values, num_keys, s, s_stride, stats, group, state,
                         state_stride);
    } else if (bf16.values) {
      Bf16AccumulateTile(bf16, values, num_keys, s, s_stride, group, head_dim, state, state_stride);
    } else {
      accumulate(values, num_keys, s, s_stride, group, head_dim, state, state_stride);
    }
    value_steps = next_keys.steps();
    next_keys.Finish();
    std::swap(keys_now, keys_next);
  }
  if (IsSplitReader(v_reader) && !vnni_values.ok && !madd_values.ok && !bf16.values) {
    // split order: back to element order
    float* row = Scratch(kSlotSplitState, head_dim);
    const size_t parts = SplitParts(v_reader);
    const float factor = SplitOrderFactor(v_reader);
    for (int j = 0; j < group; ++j) {
      float* st = state + j * state_stride;
      std::copy(st, st + head_dim, row);
      for (size_t pos = 0; pos < head_dim; ++pos) {
        st[SplitElement(pos, nd, parts)] = row[pos] * factor;
      }
    }
  }
  if (vnni_values.ok && vnni_values.value_spans > 0) {  // span order: back to element order
    VnniSpanOrderToElements(vnni_values, group, state, state_stride);
  }
  if (madd_values.ok) MaddValueOrderToElements(madd_values, group, state, state_stride);
  Bf16OrderToElements(bf16, group, head_dim, state, state_stride);
  if (sink != nullptr && sink->row != nullptr) {
    // What the merge of a single part computes: its max, and 1 / its sum (its weight there is
    // exp(0) = 1), the same bits.
    for (int j = 0; j < group; ++j) {
      sink->head_max[j] = state[j * state_stride + head_dim];
      sink->head_inv_sum[j] = 1.0f / state[j * state_stride + head_dim + 1];
    }
    AddPartScores(sink->probs, sink->prob_stride, sink->tile_max, begin, end, sink->head_max,
                  sink->head_inv_sum, group, sink->use_max, sink->group_weight, sink->row);
  }
}

// The decode step's attention scores from what the tasks left (ScoreSink), for kv heads split
// into several parts: each part's scores (AddPartScores) with the head's final max and
// 1 / softmax sum from the merge. One task per kv head (they write disjoint rows).
//   probs: [num_heads][prob_stride]; tile_max: [task][max_tiles][group], task = kv_head *
//   num_parts + part; parts: each part's [begin, end); head_max, head_inv_sum: [num_heads]
void AddDecodeScores(const float* probs, size_t prob_stride, const float* tile_max,
                     size_t max_tiles, std::span<const std::pair<int, int>> parts,
                     const float* head_max, const float* head_inv_sum, int num_kv_heads, int group,
                     const ScoreSink& how, const AttentionScores& scores, ThreadPool* pool) {
  const int num_parts = static_cast<int>(parts.size());
  RunTasks(pool, num_kv_heads, [&](int64_t kv_head, int /*thread_idx*/) {
    const size_t first_head = static_cast<size_t>(kv_head) * group;
    for (int c = 0; c < num_parts; ++c) {
      AddPartScores(probs + first_head * prob_stride, prob_stride,
                    tile_max + (static_cast<size_t>(kv_head) * num_parts + c) * max_tiles * group,
                    parts[c].first, parts[c].second, head_max + first_head,
                    head_inv_sum + first_head, group, how.use_max, how.group_weight,
                    scores.out + kv_head * static_cast<int64_t>(scores.stride));
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
  SideSpec k_arena = ArenaSide(view, view.k, true, lanes);
  SideSpec v_arena = ArenaSide(view, view.v, false, lanes);
  // -t16 tiles are read whole by the VNNI readers and the AVX2 ones (values: the VNNI span
  // readers, by quads); the others read their rows copied out.
  const auto reads_tiles = [&](const SideSpec& side, bool keys) {
    if (!keys) return PlanVnni(side, head_dim, lanes).value_spans > 0;
    return PlanVnni(side, head_dim, lanes).ok || PlanMaddKeys(side, head_dim, lanes).ok;
  };
  if (k_arena.tiled && !reads_tiles(k_arena, true)) k_arena = UntiledSide(k_arena);
  if (v_arena.tiled && !reads_tiles(v_arena, false)) v_arena = UntiledSide(v_arena);
  SideSpec sinks, pending;
  sinks.fill = FillKind::kSinks;
  pending.fill = FillKind::kPending;

  // Split-K partials: the sinks, chunks of the arena, the pending tokens. Arena chunks start
  // on unit boundaries of both arenas, so no unit is read by two tasks.
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  const int num_arena = arena_end - arena_begin;
  const int align = std::lcm(std::max(1, view.k.group_tokens), std::max(1, view.v.group_tokens));
  const int wanted_chunks = (kTasksPerThread * num_threads + num_kv_heads - 1) / num_kv_heads;
  const int max_chunks = (num_arena + kMinDecodeChunk - 1) / kMinDecodeChunk;
  const int num_chunks = std::max(1, std::min(wanted_chunks, max_chunks));
  const int chunk_len = ((num_arena + num_chunks - 1) / num_chunks + align - 1) / align * align;
  std::vector<std::pair<FillKind, std::pair<int, int>>> ranges;
  if (view.sinks.end > 0) ranges.push_back({FillKind::kSinks, {0, view.sinks.end}});
  // An arena that starts mid-unit (after sinks) reads the rest of that unit as its own part,
  // so that every chunk, and every 16 keys of its tiles, starts on a unit boundary (what -t16
  // tiles read whole).
  const int first_whole = std::min(arena_end, (arena_begin + align - 1) / align * align);
  if (arena_begin < first_whole && first_whole < arena_end) {
    ranges.push_back({FillKind::kDirect, {arena_begin, first_whole}});
  }
  for (int c = 0; c < num_chunks; ++c) {
    // Boundaries on absolute multiples of the unit length (but an arena within one unit).
    const int b = c == 0 ? (first_whole < arena_end ? first_whole : arena_begin)
                         : std::min(arena_end, (arena_begin + c * chunk_len) / align * align);
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
  // With scores: every head's probabilities (whole vectors apart), each task's tile maxima, and
  // each head's final max and 1 / sum.
  size_t max_tiles = 0;
  for (const auto& range : ranges) {
    max_tiles = std::max<size_t>(
        max_tiles, (range.second.second - range.second.first + kDecodeTile - 1) / kDecodeTile);
  }
  // (One vector more than the tokens: a tile scored in place pads its end to whole vectors.)
  const size_t prob_stride =
      scores == nullptr ? 0 : (static_cast<size_t>(view.num_tokens) + 15) / 16 * 16 + 16;
  const size_t score_floats = scores == nullptr
                                  ? 0
                                  : prob_stride * params.num_heads + num_tasks * max_tiles * group +
                                        2 * static_cast<size_t>(params.num_heads);
  // Grown, never shrunk: resizing to each step's size would zero-fill what an eviction freed
  // and the next steps take back.
  thread_local std::vector<float> call_scratch;
  const size_t call_floats =
      q_floats + static_cast<size_t>(num_tasks) * group * state_stride + score_floats;
  if (call_scratch.size() < call_floats) call_scratch.resize(call_floats);
  float* q_scaled = call_scratch.data();
  float* states = q_scaled + q_floats;
  float* probs = states + num_tasks * group * state_stride;    // [num_heads][prob_stride]
  float* tile_max = probs + prob_stride * params.num_heads;    // [task][max_tiles][group]
  float* head_max = tile_max + num_tasks * max_tiles * group;  // [num_heads]
  float* head_inv_sum = head_max + params.num_heads;           // [num_heads]
  PrepareQueries(view, q, params.num_heads, params.scale, q_scaled);

  // How scores aggregate over a group; with one part per kv head, each task adds its own.
  ScoreSink how;
  how.prob_stride = prob_stride;
  if (scores != nullptr) {
    how.use_max = scores->aggregation == ScoreAggregation::kMax;
    how.group_weight = how.use_max ? 1.0f : 1.0f / static_cast<float>(group);
  }
  const bool fused = scores != nullptr && num_parts == 1;

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
    ScoreSink sink = how;
    sink.probs = probs + kv_head * group * prob_stride;
    sink.tile_max = tile_max + task_idx * max_tiles * group;
    if (fused) {
      sink.row = scores->out + kv_head * static_cast<int64_t>(scores->stride);
      sink.head_max = head_max + kv_head * group;
      sink.head_inv_sum = head_inv_sum + kv_head * group;
    }
    DecodeChunk<D>(view, k_side, v_side, kv_head, range.first, range.second,
                   q_scaled + static_cast<size_t>(kv_head) * group * head_dim, group, state,
                   scores == nullptr ? nullptr : &sink);
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
      if (scores != nullptr && !fused) {  // (fused: the task wrote the same values)
        head_max[kv_head * group + j] = global_max;
        head_inv_sum[kv_head * group + j] = inv;
      }
    }
  }
  if (scores != nullptr && !fused) {
    std::vector<std::pair<int, int>> parts;
    for (const auto& range : ranges) parts.push_back(range.second);
    AddDecodeScores(probs, prob_stride, tile_max, max_tiles, parts, head_max, head_inv_sum,
                    num_kv_heads, group, how, *scores, pool);
  }
}

}  // namespace

// The one runtime switch over the vector width; codecs are chosen per tile.
void DecodeKernel(const KvLayerView& view, const float* q, const AttentionParams& params,
                  float* out, ThreadPool* pool, const AttentionScores* scores) {
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

HWY_EXPORT(DecodeKernel);

void DecodeAttention(const KvLayerView& view, const float* q, const AttentionParams& params,
                     float* out, ThreadPool* pool, const AttentionScores* scores) {
  HWY_DYNAMIC_DISPATCH(DecodeKernel)(view, q, params, out, pool, scores);
}

}  // namespace kvstack
#endif  // HWY_ONCE
