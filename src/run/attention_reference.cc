// AttentionReference: the plain scalar attention every kernel path is tested against. It
// decodes every unit with the codec's own Decode (DecodeHead) (so any codec, present or future, is
// checked against exactly the bytes it wrote), reads the F32 sink and pending segments as they are,
// rotates the queries when the keys are stored rotated, and runs a two-pass softmax in double
// precision, so it differs from the kernels only in rounding and summation order. Attention
// scores (AttentionScores) come from the same probabilities, aggregated over each group in
// double and added to the caller's floats.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "represent/hadamard.h"
#include "run/attention.h"

namespace kvstack {
namespace {

// Decodes logical tokens [begin, end) of the keys or the values in the arenas into dst:
// [num_tokens][num_kv_heads][hd]. Each kv head through its own arena (KeyArena / ValueArena),
// so that views whose heads use different codecs read alike.
void DecodeArena(const KvLayerView& view, bool keys, int begin, int end, double* dst) {
  const int head_dim = view.head_dim;
  const size_t row_elems = static_cast<size_t>(view.num_kv_heads) * head_dim;
  for (int h = 0; h < view.num_kv_heads; ++h) {
    const KvArenaView arena = keys ? view.KeyArena(h) : view.ValueArena(h);
    KVS_CHECK(arena.codec_impl != nullptr && "the reference decodes with the view's codec_impl");
    KVS_CHECK(arena.codec_impl->id() == arena.codec);
    KVS_CHECK(arena.codec_impl->unit_bytes() == arena.unit_bytes);
    KVS_CHECK(arena.codec_impl->group_tokens() == arena.group_tokens);
    const int group_tokens = arena.group_tokens;
    std::vector<float> unit(static_cast<size_t>(group_tokens) * head_dim);
    view.ForEachRun(begin, end, [&](int logical, int count, int32_t block_id, int row) {
      for (int r = 0; r < count; ++r) {
        const int slot_row = row + r;
        arena.codec_impl->DecodeHead(
            view.first_kv_head + h,
            {arena.Unit(block_id, slot_row / group_tokens, 0), arena.unit_bytes}, unit);
        const float* src = unit.data() + static_cast<size_t>(slot_row % group_tokens) * head_dim;
        double* out = dst + (logical + r) * row_elems + static_cast<size_t>(h) * head_dim;
        std::copy(src, src + head_dim, out);
      }
    });
  }
}

// Copies logical tokens [begin, end) of an F32 segment into dst (same shape as above).
void CopySegment(const KvLayerView& view, const KvF32Segment& seg, bool keys, int begin, int end,
                 double* dst) {
  const size_t row_elems = static_cast<size_t>(view.num_kv_heads) * view.head_dim;
  for (int t = begin; t < end; ++t) {
    for (int h = 0; h < view.num_kv_heads; ++h) {
      const float* src = keys ? seg.KRow(t, h, view.head_dim) : seg.VRow(t, h, view.head_dim);
      std::copy(src, src + view.head_dim,
                dst + t * row_elems + static_cast<size_t>(h) * view.head_dim);
    }
  }
}

}  // namespace

void AttentionReference(const KvLayerView& view, const float* q, int num_queries,
                        const AttentionParams& params, float* out, const AttentionScores* scores) {
  KVS_CHECK(view.num_kv_heads > 0 && view.head_dim > 0);
  KVS_CHECK(params.num_heads > 0 && params.num_heads % view.num_kv_heads == 0);
  KVS_CHECK(0 <= num_queries && num_queries <= view.num_tokens);
  KVS_CHECK(!view.keys_rotated || IsPowerOfTwo(view.head_dim));
  const int head_dim = view.head_dim;
  const int group = params.num_heads / view.num_kv_heads;
  const int num_tokens = view.num_tokens;
  const int arena_begin = view.arena_begin(), arena_end = view.arena_end();
  KVS_CHECK(0 <= arena_begin && arena_begin <= arena_end && arena_end <= num_tokens);
  if (scores != nullptr) {
    KVS_CHECK(scores->out != nullptr && scores->stride >= num_tokens);
    KVS_CHECK(0 <= scores->first_query && scores->first_query < num_queries);
  }

  // Decode the whole view once: [num_tokens][num_kv_heads][head_dim]. Fine for a reference.
  const size_t row_elems = static_cast<size_t>(view.num_kv_heads) * head_dim;
  std::vector<double> keys(num_tokens * row_elems), values(num_tokens * row_elems);
  CopySegment(view, view.sinks, true, 0, arena_begin, keys.data());
  CopySegment(view, view.sinks, false, 0, arena_begin, values.data());
  DecodeArena(view, true, arena_begin, arena_end, keys.data());
  DecodeArena(view, false, arena_begin, arena_end, values.data());
  CopySegment(view, view.pending, true, arena_end, num_tokens, keys.data());
  CopySegment(view, view.pending, false, arena_end, num_tokens, values.data());

  // group_score: one query's aggregate over the heads of one group, per key.
  std::vector<double> logits(num_tokens), acc(head_dim), group_score(num_tokens);
  std::vector<float> query(head_dim);
  for (int qi = 0; qi < num_queries; ++qi) {
    const int last_key = num_tokens - num_queries + qi;  // causal: keys [0, last_key]
    const bool scored = scores != nullptr && qi >= scores->first_query;
    for (int head = 0; head < params.num_heads; ++head) {
      const int kv_head = head / group;
      const float* qrow = q + (static_cast<size_t>(qi) * params.num_heads + head) * head_dim;
      std::copy(qrow, qrow + head_dim, query.begin());
      if (view.keys_rotated) HadamardRotate(query);  // keys hold H k: score with H q
      double max_score = -std::numeric_limits<double>::infinity();
      for (int t = 0; t <= last_key; ++t) {
        const double* k = &keys[t * row_elems + static_cast<size_t>(kv_head) * head_dim];
        double dot = 0.0;
        for (int i = 0; i < head_dim; ++i) dot += static_cast<double>(query[i]) * k[i];
        logits[t] = dot * params.scale;
        max_score = std::max(max_score, logits[t]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t <= last_key; ++t) {
        const double p = std::exp(logits[t] - max_score);
        sum += p;
        const double* v = &values[t * row_elems + static_cast<size_t>(kv_head) * head_dim];
        for (int i = 0; i < head_dim; ++i) acc[i] += p * v[i];
      }
      float* orow = out + (static_cast<size_t>(qi) * params.num_heads + head) * head_dim;
      for (int i = 0; i < head_dim; ++i) orow[i] = static_cast<float>(acc[i] / sum);
      if (!scored) continue;
      const int j = head % group;
      if (j == 0) std::fill(group_score.begin(), group_score.end(), 0.0);
      for (int t = 0; t <= last_key; ++t) {
        const double p = std::exp(logits[t] - max_score) / sum;
        group_score[t] = scores->aggregation == ScoreAggregation::kMax ? std::max(group_score[t], p)
                                                                       : group_score[t] + p / group;
      }
      if (j == group - 1) {
        float* row = scores->out + static_cast<size_t>(kv_head) * scores->stride;
        for (int t = 0; t <= last_key; ++t) row[t] += static_cast<float>(group_score[t]);
      }
    }
  }
}

}  // namespace kvstack
