// What the cache suites share: the small shape they run at, the record of every row appended
// to a sequence, and appending random rows (spread over 2^-6..2^6, both signs) through the
// cache's plan / commit / write path.
#pragma once

#include <cmath>
#include <random>
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
struct History {
  std::vector<float> k[kNumLayers];
  std::vector<float> v[kNumLayers];
  int num_appended() const { return static_cast<int>(k[0].size() / kTokenFloats); }
};

// Plans, commits and writes `num_new_tokens` random tokens in every layer.
inline void Append(KvCache& cache, SeqId seq_id, int num_new_tokens, std::mt19937& rng,
                   History* history) {
  auto plan = cache.PlanAppend(seq_id, num_new_tokens);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->fits) << num_new_tokens;
  ASSERT_TRUE(cache.CommitAppend(*plan).ok());
  const int logical_begin = cache.NumTokens(seq_id) - num_new_tokens;
  std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
  for (int layer_idx = 0; layer_idx < kNumLayers; ++layer_idx) {
    std::vector<float> k(num_new_tokens * kTokenFloats);
    std::vector<float> v(k.size());
    for (float& x : k) x = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    for (float& x : v) x = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    cache.Write(seq_id, layer_idx, logical_begin, k, v);
    history->k[layer_idx].insert(history->k[layer_idx].end(), k.begin(), k.end());
    history->v[layer_idx].insert(history->v[layer_idx].end(), v.begin(), v.end());
  }
}

}  // namespace kvstack::cache_test
