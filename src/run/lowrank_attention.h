// Attention in the low-rank form, for views whose keys or values are stored as coordinates in
// a per-head basis (the low-rank and latent codecs, src/represent/lowrank_codec.h). Scores use
// each query projected into the key basis once per query head,
//   q.k_t ~= q.mean_k + (B_k q).c_t                       (r multiply-adds per key),
// and values are summed in the coordinate space and mapped back once per query head,
//   sum_t p_t v_t ~= mean_v sum_t p_t + B_v^T (sum_t p_t c_t).
// The stored coordinates (F16 or 4-bit) are read directly; no key or value of head_dim
// elements is rebuilt. A latent layer's keys and values share their coordinates, read once.
// F32 sink and pending tokens, and an arena side whose codec is not low-rank, are read in full
// and merged with the same online softmax (split-K partials, as in the kernels of
// attention.h). Decode splits the keys over the pool's threads; prefill tiles the queries.
//
// When it is used (LowRankFormApplies): the key or the value arena (or both) holds low-rank
// or latent coordinates, both arenas have one-token units, every kv head holds all tokens, and
// no attention scores are asked for. The rank does not enter the rule: per key and query head
// the low-rank form costs r multiply-adds, while the only other way to read these bytes —
// decoding them (attention.cc's generic path) — costs r * head_dim to rebuild each vector and
// then head_dim for the dot product; the projection of the queries (r * head_dim per query
// head) is paid back after `group` keys. rank < head_dim is what makes the codec smaller than
// F16 (and rank 0.25 * head_dim about 4x less to read), not what makes this path the cheaper.
#pragma once

#include "run/attention.h"

namespace kvstack {

bool LowRankFormApplies(const KvLayerView& view, const AttentionScores* scores);

// Same contract as Attention (attention.h) for views where LowRankFormApplies (checked).
void LowRankAttention(const KvLayerView& view, const float* q, int num_queries,
                      const AttentionParams& params, float* out, ThreadPool* pool);

}  // namespace kvstack
