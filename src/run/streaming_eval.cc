// StreamingPerplexity: one long stream, perplexity per segment.
#include <cmath>

#include "absl/strings/str_format.h"
#include "run/long_context_eval.h"
#include "run/sequence_logits.h"

namespace kvstack {

absl::StatusOr<StreamingResult> StreamingPerplexity(const LlamaModel& model,
                                                    std::span<const TokenId> tokens,
                                                    const KvConfig& config,
                                                    const StreamingOptions& options) {
  if (options.segment_tokens < 2 || options.total_tokens < options.segment_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "streaming: need segment >= 2 and total >= segment tokens; got segment %d, total %d",
        options.segment_tokens, options.total_tokens));
  }
  if (tokens.size() < static_cast<size_t>(options.total_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("streaming: the text has %d tokens, fewer than the %d to stream",
                        tokens.size(), options.total_tokens));
  }
  EngineOptions engine_options;
  engine_options.kv = config;
  engine_options.context_tokens = options.total_tokens;
  engine_options.num_threads = options.num_threads;
  engine_options.max_batch = ResolveBatch(config, options.batch, options.segment_tokens);
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, engine_options));

  std::vector<TokenId> stream(tokens.begin(), tokens.begin() + options.total_tokens);
  stream[0] = model.tokenizer().bos_id();
  std::vector<float> logits;
  KVS_RETURN_IF_ERROR(SequenceLogits(*engine, stream, engine_options.max_batch, &logits));

  StreamingResult result;
  result.config = engine->options().kv;
  result.peak_cache_bytes = engine->cache().peak_bytes_in_use();  // a new engine: this stream's
  const size_t vocab = static_cast<size_t>(model.hparams().vocab_size);
  const int num_segments = options.total_tokens / options.segment_tokens;
  double total_nll = 0;
  int total_count = 0;
  for (int s = 0; s < num_segments; ++s) {
    double nll = 0;
    int count = 0;
    for (int j = s * options.segment_tokens; j < (s + 1) * options.segment_tokens; ++j) {
      if (j + 1 >= options.total_tokens) break;
      nll += NegativeLogLikelihood(std::span<const float>(logits).subspan(j * vocab, vocab),
                                   stream[j + 1]);
      ++count;
    }
    result.segment_ppl.push_back(std::exp(nll / count));
    total_nll += nll;
    total_count += count;
  }
  result.ppl = std::exp(total_nll / total_count);
  return result;
}

}  // namespace kvstack
