// Text generation on the engine: one prefill forward pass over the prompt, then one decode
// pass per new token, timed separately because they stress different things (prefill is
// compute-bound, decode streams the cache and the weights).
#include <chrono>

#include "absl/strings/str_format.h"
#include "kvstack/engine.h"

namespace kvstack {

double GenerateStats::prefill_tokens_per_s() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
}

double GenerateStats::decode_tokens_per_s() const {
  return decode_seconds > 0 ? decode_steps / decode_seconds : 0.0;
}

absl::StatusOr<GenerateStats> Generate(Engine& engine, std::span<const TokenId> prompt,
                                       const GenerateOptions& options,
                                       const std::function<void(TokenId)>& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("generate: the prompt has no tokens");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("generate: -n must be >= 0, got %d", options.max_new_tokens));
  }
  KVS_ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(options.sampler));
  KVS_ASSIGN_OR_RETURN(SeqId seq_id, engine.NewSequence());
  const TokenId eos = engine.model().tokenizer().eos_id();

  GenerateStats stats;
  stats.prompt_tokens = static_cast<int>(prompt.size());
  std::vector<float> logits;
  auto run = [&]() -> absl::Status {
    if (options.max_new_tokens == 0) return absl::OkStatus();
    auto start = std::chrono::steady_clock::now();
    KVS_RETURN_IF_ERROR(engine.Forward(seq_id, prompt, /*all_logits=*/false, &logits));
    stats.prefill_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    while (true) {
      const TokenId next = sampler.Sample(logits);
      if (options.stop_at_eos && next == eos) break;
      ++stats.generated_tokens;
      on_token(next);
      if (stats.generated_tokens == options.max_new_tokens) break;
      start = std::chrono::steady_clock::now();
      KVS_RETURN_IF_ERROR(
          engine.Forward(seq_id, std::span<const TokenId>(&next, 1), false, &logits));
      stats.decode_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++stats.decode_steps;
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  stats.kv_bytes_in_use = engine.cache().bytes_in_use();
  stats.kv_f32_row_bytes = engine.cache().f32_row_bytes_in_use();
  KVS_RETURN_IF_ERROR(engine.FreeSequence(seq_id));
  KVS_RETURN_IF_ERROR(status);
  return stats;
}

}  // namespace kvstack
