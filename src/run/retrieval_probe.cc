// RetrievalProbe: passage, filler, passage again; the loss on the second copy.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "run/long_context_eval.h"
#include "run/sequence_logits.h"

namespace kvstack {

absl::StatusOr<RetrievalProbeResult> RetrievalProbe(const LlamaModel& model,
                                                    std::span<const TokenId> tokens,
                                                    const KvConfig& config,
                                                    const RetrievalProbeOptions& options) {
  if (options.passage_tokens < 8 || options.filler_tokens < 0 || options.num_probes < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "retrieval probe: need passage >= 8, filler >= 0 and probes >= 1 tokens; got %d, %d, %d",
        options.passage_tokens, options.filler_tokens, options.num_probes));
  }
  const int passage = options.passage_tokens;
  const int filler = options.filler_tokens;
  const int length = 1 + 2 * passage + filler;
  // Probe i takes its passage and its filler from its own stretch of the text, skipping the
  // text's first token (BOS).
  const size_t stretch = static_cast<size_t>(passage + filler);
  if (tokens.size() < 1 + stretch * options.num_probes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "retrieval probe: the text has %d tokens; %d probes of %d passage + %d filler tokens "
        "need %d",
        tokens.size(), options.num_probes, passage, filler, 1 + stretch * options.num_probes));
  }
  EngineOptions engine_options;
  engine_options.kv = config;
  engine_options.context_tokens = length;
  engine_options.num_threads = options.num_threads;
  engine_options.max_batch = ResolveBatch(config, options.batch, length);
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, engine_options));

  RetrievalProbeResult result;
  result.config = engine->options().kv;
  const size_t vocab = static_cast<size_t>(model.hparams().vocab_size);
  std::vector<TokenId> sequence(length);
  std::vector<float> logits;
  double first_nll = 0, second_nll = 0;
  for (int i = 0; i < options.num_probes; ++i) {
    const auto begin = tokens.begin() + 1 + stretch * i;
    sequence[0] = model.tokenizer().bos_id();
    std::copy_n(begin, passage, sequence.begin() + 1);
    std::copy_n(begin + passage, filler, sequence.begin() + 1 + passage);
    std::copy_n(begin, passage, sequence.begin() + 1 + passage + filler);
    KVS_RETURN_IF_ERROR(SequenceLogits(*engine, sequence, engine_options.max_batch, &logits));
    // Token j of the passage (j >= 1) is predicted at position j of the copy's first token - 1.
    auto nll_of_copy = [&](int copy_start) {
      double nll = 0;
      for (int j = 1; j < passage; ++j) {
        const int pos = copy_start + j - 1;
        nll += NegativeLogLikelihood(std::span<const float>(logits).subspan(pos * vocab, vocab),
                                     sequence[pos + 1]);
      }
      return nll;
    };
    first_nll += nll_of_copy(1);
    second_nll += nll_of_copy(1 + passage + filler);
  }
  result.tokens_scored = options.num_probes * (passage - 1);
  result.first_copy_nll = first_nll / result.tokens_scored;
  result.second_copy_nll = second_nll / result.tokens_scored;
  return result;
}

}  // namespace kvstack
