#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvstack/check.h"
#include "kvstack/kv_cache.h"

namespace kvstack {

// What a benchmark's one-layer paged cache looks like.
struct BenchCacheShape {
  int num_kv_heads = 8;
  int head_dim = 128;
  int block_size = 16;  // tokens per block
};

// Shape B of the representation layer's speed targets: 8 kv heads x head_dim 128 read by 32
// query heads (GQA 4), blocks of 16 tokens.
inline constexpr BenchCacheShape kShapeB{8, 128, 16};
inline constexpr int kShapeBQueryHeads = 32;

// A one-layer paged KvCache holding `num_sequences` sequences of num_tokens random tokens each
// (uniform in [-1, 1], seed 1), written through KvCache's own append path (so the benchmarks
// read the layout the cache really has), `chunk` tokens per sequence in turn: chunk = num_tokens
// grows the sequences one after another, chunk = block_size in lockstep, as a batch grows.
// The new sequences' ids go to *ids. Aborts where the cache cannot be made (benchmarks only).
//   profile, model_hash: the calibration profile file that low-rank and latent codecs need, and
//   the model hash it was saved under (none by default)
inline std::unique_ptr<KvCache> GrowBenchCache(const BenchCacheShape& shape,
                                               const std::string& codec, int num_tokens, int chunk,
                                               int num_sequences, std::vector<SeqId>* ids,
                                               const std::string& profile = "",
                                               uint64_t model_hash = 0) {
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = shape.num_kv_heads;
  options.head_dim = shape.head_dim;
  options.config.layout = LayoutKind::kPaged;
  options.config.capacity = num_tokens;
  options.config.block_size = shape.block_size;
  options.config.max_sequences = num_sequences;
  options.config.k_codec = options.config.v_codec = codec;
  options.config.profile = profile;
  options.model_hash = model_hash;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(options);
  KVS_CHECK(cache.ok());
  for (int s = 0; s < num_sequences; ++s) ids->push_back(*(*cache)->AddSequence());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> k, v;
  for (int begin = 0; begin < num_tokens; begin += chunk) {
    const int n = std::min(chunk, num_tokens - begin);
    k.resize(static_cast<size_t>(n) * shape.num_kv_heads * shape.head_dim);
    v.resize(k.size());
    for (const SeqId id : *ids) {
      const absl::StatusOr<AppendPlan> plan = (*cache)->PlanAppend(id, n);
      KVS_CHECK(plan.ok() && plan->fits && (*cache)->CommitAppend(*plan).ok());
      for (float& x : k) x = uniform(rng);
      for (float& x : v) x = uniform(rng);
      (*cache)->Write(id, 0, begin, k, v);
    }
  }
  return std::move(*cache);
}

}  // namespace kvstack
