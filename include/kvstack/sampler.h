// Sampler: picks the next token from logits — greedy at temperature 0, otherwise
// temperature, top-k and top-p (nucleus) sampling with a seeded generator, so that a run
// with the same seed is repeatable. Not thread-safe (holds the generator).
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "kvstack/status.h"
#include "kvstack/tokenizer.h"

namespace kvstack {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties). Default: 0. >= 0.
  int top_k = 0;             // keep the k most likely; 0 = all. Default: 0. >= 0.
  float top_p = 1.0f;        // keep the smallest set with mass >= p. Default: 1. In (0, 1].
  uint64_t seed = 0;         // Default: 0.
};

class Sampler {
 public:
  // InvalidArgument naming the field for out-of-range options.
  static absl::StatusOr<Sampler> Create(const SamplerOptions& options);
  // logits: [vocab_size].
  TokenId Sample(std::span<const float> logits);

 private:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace kvstack
