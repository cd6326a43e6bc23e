// Attention over a view whose kv heads may hold different numbers of tokens, as they do after
// an eviction with per-head budgets (Ada-KV, head classes), or use different codecs (KvConfig::
// head_codecs). The kernels read views whose heads all hold num_tokens tokens in one format;
// here each run of adjacent kv heads that read alike (KvLayerView::SameHeads) is one such view
// (HeadsView), with its query heads gathered next to each other.
#pragma once

#include "base/thread_pool.h"
#include "kvstack/kv_view.h"
#include "run/attention.h"

namespace kvstack {

// Same contract as Attention (q, out: [num_queries, num_heads, head_dim]; scores laid out
// [num_kv_heads][stride]); query j of a kv head holding n tokens attends its keys
// [0, n - num_queries + j]. Uniform views take the plain Attention call.
void AttentionAnyHeads(const KvLayerView& view, const float* q, int num_queries,
                       const AttentionParams& params, float* out, ThreadPool* pool,
                       const AttentionScores* scores);

}  // namespace kvstack
