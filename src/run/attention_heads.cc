// AttentionAnyHeads: attention over runs of kv heads that read alike (same token counts and
// codecs), one kernel call per run.
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
  std::vector<float> q_run, out_run;
  for (int first = 0; first < view.num_kv_heads;) {
    int count = 1;
    while (first + count < view.num_kv_heads && view.SameHeads(first, first + count)) ++count;
    // The run's query heads, next to each other: [num_queries][count * group][head_dim].
    const size_t run_floats = static_cast<size_t>(count) * group_floats;
    q_run.resize(num_queries * run_floats);
    out_run.resize(q_run.size());
    for (int j = 0; j < num_queries; ++j) {
      std::memcpy(&q_run[j * run_floats], q + j * row_floats + first * group_floats,
                  run_floats * sizeof(float));
    }
    AttentionParams run_params = params;
    run_params.num_heads = count * group;
    AttentionScores run_scores;
    if (scores != nullptr) {
      run_scores = *scores;
      run_scores.out = scores->out + static_cast<size_t>(first) * scores->stride;
    }
    Attention(view.HeadsView(first, count), q_run.data(), num_queries, run_params, out_run.data(),
              pool, scores != nullptr ? &run_scores : nullptr);
    for (int j = 0; j < num_queries; ++j) {
      std::memcpy(out + j * row_floats + first * group_floats, &out_run[j * run_floats],
                  run_floats * sizeof(float));
    }
    first += count;
  }
}

}  // namespace kvstack
