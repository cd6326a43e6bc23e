// AttentionAnyHeads: per-kv-head attention calls for views with per-head token counts.
#include "run/attention_heads.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvstack {

void AttentionAnyHeads(const KvLayerView& view, const float* q, int num_queries,
                       const AttentionParams& params, float* out, ThreadPool* pool,
                       const AttentionScores* scores) {
  if (view.uniform_heads()) {
    Attention(view, q, num_queries, params, out, pool, scores);
    return;
  }
  const int group = params.num_heads / view.num_kv_heads;
  const size_t group_floats = static_cast<size_t>(group) * view.head_dim;
  const size_t row_floats = static_cast<size_t>(params.num_heads) * view.head_dim;
  std::vector<float> q_group(num_queries * group_floats), out_group(num_queries * group_floats);
  AttentionParams head_params = params;
  head_params.num_heads = group;
  for (int h = 0; h < view.num_kv_heads; ++h) {
    for (int j = 0; j < num_queries; ++j) {
      std::memcpy(&q_group[j * group_floats], q + j * row_floats + h * group_floats,
                  group_floats * sizeof(float));
    }
    AttentionScores head_scores;
    if (scores != nullptr) {
      head_scores = *scores;
      head_scores.out = scores->out + static_cast<size_t>(h) * scores->stride;
    }
    Attention(view.HeadView(h), q_group.data(), num_queries, head_params, out_group.data(), pool,
              scores != nullptr ? &head_scores : nullptr);
    for (int j = 0; j < num_queries; ++j) {
      std::memcpy(out + j * row_floats + h * group_floats, &out_group[j * group_floats],
                  group_floats * sizeof(float));
    }
  }
}

}  // namespace kvstack
