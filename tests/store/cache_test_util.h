// What the cache suites share: the small shape they run at, the record of every row appended
// to a sequence, and appending random rows (spread over 2^-6..2^6, both signs) through the
// cache's plan / commit / write path.
#pragma once

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kvstack/kv_cache.h"

namespace kvstack::cache_test {

constexpr int kNumLayers = 2;
constexpr int kNumKvHeads = 2;
constexpr int kHeadDim = 4;
constexpr int kTokenFloats = kNumKvHeads * kHeadDim;

// Everything ever appended to one sequence, per layer, as written (keys unrotated):
// [num_appended, num_kv_heads, head_dim]. The sequence holds the last NumTokens() of them.
// Caches of another head_dim or kv head count (kNumLayers layers) record their own
// token_floats (Append sets it).
struct History {
  std::vector<float> k[kNumLayers];
  std::vector<float> v[kNumLayers];
  int token_floats = kTokenFloats;  // num_kv_heads * head_dim of the cache
  int num_appended() const { return static_cast<int>(k[0].size() / token_floats); }
  // One appended row of one head: [head_dim] floats.
  std::span<const float> KRow(int layer_idx, int appended, int kv_head, int head_dim) const {
    return std::span(k[layer_idx]).subspan(Offset(appended, kv_head, head_dim), head_dim);
  }
  std::span<const float> VRow(int layer_idx, int appended, int kv_head, int head_dim) const {
    return std::span(v[layer_idx]).subspan(Offset(appended, kv_head, head_dim), head_dim);
  }
  size_t Offset(int appended, int kv_head, int head_dim) const {
    return static_cast<size_t>(appended) * token_floats + static_cast<size_t>(kv_head) * head_dim;
  }
};

// Plans, commits and writes `num_new_tokens` random tokens in every layer.
inline void Append(KvCache& cache, SeqId seq_id, int num_new_tokens, std::mt19937& rng,
                   History* history) {
  auto plan = cache.PlanAppend(seq_id, num_new_tokens);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->fits) << num_new_tokens;
  ASSERT_TRUE(cache.CommitAppend(*plan).ok());
  const int logical_begin = cache.NumTokens(seq_id) - num_new_tokens;
  const KvLayerView shape = cache.View(seq_id, 0);
  history->token_floats = shape.num_kv_heads * shape.head_dim;
  std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    std::vector<float> k(static_cast<size_t>(num_new_tokens) * history->token_floats);
    std::vector<float> v(k.size());
    for (float& x : k) x = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    for (float& x : v) x = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    cache.Write(seq_id, layer_idx, logical_begin, k, v);
    history->k[layer_idx].insert(history->k[layer_idx].end(), k.begin(), k.end());
    history->v[layer_idx].insert(history->v[layer_idx].end(), v.begin(), v.end());
  }
}

}  // namespace kvstack::cache_test
