// Running a whole token sequence through an engine and scoring it: the loop that perplexity,
// the streaming evaluation and the retrieval probe share.
#pragma once

#include <span>
#include <vector>

#include "kvstack/engine.h"
#include "kvstack/status.h"

namespace kvstack {

// Forward calls of an evicting cache: policies act between calls, so a call of a whole window
// would attend with the full cache and evict only afterwards. 16 tokens per call is close to
// decode (one token per call) at a fraction of its cost.
inline constexpr int kEvictingBatch = 16;

// Tokens per forward call when the caller asked for `batch` (0 = default): the whole
// `sequence_tokens` (at most kMaxEngineBatch), or kEvictingBatch when the cache `config`
// describes evicts.
int ResolveBatch(const KvConfig& config, int batch, int sequence_tokens);

// Runs `tokens` through a new sequence of `engine`, `batch` (>= 1) tokens per forward call, and
// returns the logits of every position: [tokens.size(), vocab]. The sequence is freed, also on
// error.
absl::Status SequenceLogits(Engine& engine, std::span<const TokenId> tokens, int batch,
                            std::vector<float>* logits);

// -log softmax(logits)[target], summed in double.
double NegativeLogLikelihood(std::span<const float> logits, TokenId target);

}  // namespace kvstack
