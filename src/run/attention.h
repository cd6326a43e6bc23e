// Attention over the KV cache, reading keys and values in their stored format through a
// KvLayerView (any layout) and dequantising in registers — never materialising an F32 copy of
// the cache. Specialised at compile time per (key codec, value codec). Grouped-query: the
// query heads that share a kv head are handled in one pass over its keys and values.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"

namespace kvstack {

struct AttentionParams {
  int num_heads = 0;   // query heads; a multiple of view.num_kv_heads
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
};

// How the attention probabilities of the query heads that share one kv head are combined into
// that kv head's score of a token (GQA/MQA): the largest, or the mean over the group.
enum class ScoreAggregation : uint8_t { kMax = 0, kMean = 1 };

// Optional output for selection policies (layer 1): the softmax probabilities the kernel
// computed anyway, per kv head and logical key, for the queries [first_query, num_queries):
//   out[kv_head * stride + t] += sum over those queries of Aggregate over the group's heads
//                                of p(query, head, t)
// Keys a query does not attend (causal mask) contribute 0. The caller zeroes `out` for a
// per-step score (TOVA, SnapKV) or keeps adding into it (H2O's accumulated mass).
struct AttentionScores {
  float* out = nullptr;  // [view.num_kv_heads][stride]; nullptr: no scores (no cost)
  int stride = 0;        // >= view.num_tokens
  int first_query = 0;   // in [0, num_queries)
  ScoreAggregation aggregation = ScoreAggregation::kMax;
};

// The queries are the last num_queries logical tokens of the view (their own keys and values
// already written). Query j sits at logical index view.num_tokens - num_queries + j and attends
// causally to logical keys [0, that index].
//   q:   [num_queries, num_heads, head_dim]
//   out: [num_queries, num_heads, head_dim]
// num_queries == 1 is decode (split over the keys across threads, flash-decoding style);
// more is prefill (tiled over queries and keys). pool may be null (single-threaded).
// Precision: float accumulation, except where decode reads integer codecs with integer dot
// products (CPUs with AVX-512 VNNI): the query is then rounded to int8 per 32 elements (two
// bytes for int8 keys) and the value weights to int16 per tile (attention_vnni-inl.h says how
// far that moves the output).
// Non-finite scores: a query head whose scores hold a NaN or +inf (a key that holds a NaN or an
// infinity, in a format that stores them) gets a NaN output, as in AttentionReference's softmax
// (exp(inf - inf)); a -inf score gets no weight. Never a token dropped silently.
// scores: may be null (the common case, which must cost nothing extra).
void Attention(const KvLayerView& view, const float* q, int num_queries,
               const AttentionParams& params, float* out, ThreadPool* pool,
               const AttentionScores* scores = nullptr);

// Plain scalar reference: decodes each row with the scalar codec functions, two-pass softmax
// in double precision.
void AttentionReference(const KvLayerView& view, const float* q, int num_queries,
                        const AttentionParams& params, float* out,
                        const AttentionScores* scores = nullptr);

}  // namespace kvstack
