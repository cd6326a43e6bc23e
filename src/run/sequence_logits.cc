// SequenceLogits and NegativeLogLikelihood.
#include "run/sequence_logits.h"

#include <algorithm>
#include <cmath>

namespace kvstack {

int ResolveBatch(const KvConfig& config, int batch, int sequence_tokens) {
  if (batch > 0) return batch;
  return config.evicts() ? kEvictingBatch : std::min(sequence_tokens, kMaxEngineBatch);
}

absl::Status SequenceLogits(Engine& engine, std::span<const TokenId> tokens, int batch,
                            std::vector<float>* logits) {
  KVS_CHECK(batch >= 1);
  const size_t vocab = static_cast<size_t>(engine.model().hparams().vocab_size);
  KVS_ASSIGN_OR_RETURN(SeqId seq_id, engine.NewSequence());
  logits->resize(tokens.size() * vocab);
  std::vector<float> batch_logits;
  for (size_t b = 0; b < tokens.size(); b += batch) {
    const size_t n = std::min<size_t>(batch, tokens.size() - b);
    const absl::Status status = engine.Forward(seq_id, tokens.subspan(b, n), true, &batch_logits);
    if (!status.ok()) {
      engine.FreeSequence(seq_id).IgnoreError();
      return status;
    }
    std::copy(batch_logits.begin(), batch_logits.end(), logits->begin() + b * vocab);
  }
  return engine.FreeSequence(seq_id);
}

double NegativeLogLikelihood(std::span<const float> logits, TokenId target) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return std::log(sum) - (static_cast<double>(logits[target]) - max_logit);
}

}  // namespace kvstack
