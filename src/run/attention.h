// Attention over the KV cache, reading keys and values in their stored format through a
// KvLayerView (any layout) and dequantising in registers — never materialising an F32 copy of
// the cache. Specialised at compile time per (key codec, value codec). Grouped-query: the
// query heads that share a kv head are handled in one pass over its keys and values.
#pragma once

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"

namespace kvstack {

struct AttentionParams {
  int num_heads = 0;   // query heads; a multiple of view.num_kv_heads
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
};

// The queries are the last num_queries logical tokens of the view (their own keys and values
// already written). Query j sits at logical index view.num_tokens - num_queries + j and attends
// causally to logical keys [0, that index].
//   q:   [num_queries, num_heads, head_dim]
//   out: [num_queries, num_heads, head_dim]
// num_queries == 1 is decode (split over the keys across threads, flash-decoding style);
// more is prefill (tiled over queries and keys). pool may be null (single-threaded).
void Attention(const KvLayerView& view, const float* q, int num_queries,
               const AttentionParams& params, float* out, ThreadPool* pool);

// Plain scalar reference: decodes each row with the scalar codec functions, two-pass softmax
// in double precision.
void AttentionReference(const KvLayerView& view, const float* q, int num_queries,
                        const AttentionParams& params, float* out);

}  // namespace kvstack
