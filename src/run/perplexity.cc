// Perplexity exactly as llama.cpp's llama-perplexity computes it, so kvstack's figures and
// llama.cpp's compare one to one: windows of ctx tokens, BOS first, the second half scored,
// and the standard error of the mean negative log-likelihood carried through exp().
#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "kvstack/engine.h"
#include "run/sequence_logits.h"

namespace kvstack {

absl::Status CheckPerplexityOptions(size_t num_tokens, const PerplexityOptions& options) {
  if (options.ctx < 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("perplexity: --ctx must be >= 4, got %d", options.ctx));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("perplexity: --batch must be >= 1, got %d", options.batch));
  }
  if (options.max_windows < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "perplexity: --max-windows must be >= 0 (0 = all), got %d", options.max_windows));
  }
  if (num_tokens < static_cast<size_t>(options.ctx)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("perplexity: the text has %d tokens, fewer than one window of --ctx %d",
                        num_tokens, options.ctx));
  }
  return absl::OkStatus();
}

absl::StatusOr<PerplexityResult> Perplexity(Engine& engine, std::span<const TokenId> tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(int, int)>& progress) {
  KVS_RETURN_IF_ERROR(CheckPerplexityOptions(tokens.size(), options));
  int num_windows = static_cast<int>(tokens.size() / options.ctx);
  if (options.max_windows > 0) num_windows = std::min(num_windows, options.max_windows);
  const int ctx = options.ctx;
  const int batch = ResolveBatch(engine.options().kv, options.batch, ctx);
  const int first = ctx / 2;
  const int vocab = engine.model().hparams().vocab_size;
  const TokenId bos = engine.model().tokenizer().bos_id();

  double nll_sum = 0;
  double nll2_sum = 0;
  int64_t count = 0;
  std::vector<TokenId> window(ctx);
  std::vector<float> logits;
  engine.ResetCachePeak();
  for (int w = 0; w < num_windows; ++w) {
    std::copy_n(tokens.begin() + static_cast<size_t>(w) * ctx, ctx, window.begin());
    window[0] = bos;
    KVS_RETURN_IF_ERROR(SequenceLogits(engine, window, batch, &logits));
    if (options.on_window_logits) options.on_window_logits(w, logits);
    for (int j = first; j < ctx - 1; ++j) {
      const double nll = NegativeLogLikelihood(
          std::span<const float>(logits).subspan(static_cast<size_t>(j) * vocab, vocab),
          window[j + 1]);
      nll_sum += nll;
      nll2_sum += nll * nll;
      ++count;
    }
    if (progress) progress(w + 1, num_windows);
  }
  PerplexityResult result;
  result.num_windows = num_windows;
  result.tokens_scored = count;
  result.peak_cache_bytes = engine.cache().peak_bytes_in_use();
  result.mean_nll = nll_sum / count;
  result.ppl = std::exp(result.mean_nll);
  const double variance = nll2_sum / count - result.mean_nll * result.mean_nll;
  result.ppl_stderr =
      variance > 0 && count > 1 ? std::sqrt(variance / (count - 1)) * result.ppl : 0.0;
  return result;
}

}  // namespace kvstack
