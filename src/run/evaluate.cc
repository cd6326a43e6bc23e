// Evaluation of a cache configuration against the F32-cache run. The reference's
// log-probabilities are kept for every scored position (stories260K at ctx 512 over the whole
// validation head: ~64k positions x 512 vocabulary x 4 bytes = 130 MB), so that a sweep runs
// the reference once and compares every configuration with it window by window through
// Perplexity's logits hook, without holding any configuration's logits.
#include "run/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/kv_cache.h"
#include "run/sequence_logits.h"

namespace kvstack {
namespace {

// Positions of one window that Perplexity scores: [ctx/2, ctx-1).
int ScoredPerWindow(int ctx) { return ctx - 1 - ctx / 2; }

int NumWindows(size_t num_tokens, const EvaluateOptions& options) {
  const int all = static_cast<int>(num_tokens / options.ctx);
  return options.max_windows > 0 ? std::min(all, options.max_windows) : all;
}

// log softmax(logits) summed in double, stored as float. Reference and configuration rows go
// through this same function, so identical logits give bit-identical rows and a KL of exactly
// zero rather than a rounding residue. logits, out: [vocab].
void LogSoftmax(std::span<const float> logits, std::span<float> out) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_sum = std::log(sum);
  for (size_t v = 0; v < logits.size(); ++v) {
    out[v] = static_cast<float>(static_cast<double>(logits[v]) - max_logit - log_sum);
  }
}

int32_t ArgMax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const LlamaModel& model,
                                                     const KvConfig& config,
                                                     const EvaluateOptions& options) {
  EngineOptions engine_options;
  engine_options.kv = config;
  engine_options.context_tokens = options.ctx;
  engine_options.num_threads = options.num_threads;
  engine_options.max_batch = ResolveBatch(config, options.batch, options.ctx);
  return Engine::Create(model, engine_options);
}

PerplexityOptions MakePerplexityOptions(const EvaluateOptions& options) {
  PerplexityOptions perplexity;
  perplexity.ctx = options.ctx;
  perplexity.batch = options.batch;
  perplexity.max_windows = options.max_windows;
  return perplexity;
}

// Prefills ctx - steps tokens of the text, then times `steps` single-token decode passes
// (teacher-forced with the text's next tokens, so every configuration decodes the same
// sequence). Returns attention microseconds per step.
absl::StatusOr<double> TimeDecodeAttention(Engine& engine, std::span<const TokenId> tokens, int ctx,
                                           int steps) {
  KVS_ASSIGN_OR_RETURN(SeqId seq_id, engine.NewSequence());
  std::vector<float> logits;
  auto run = [&]() -> absl::Status {
    KVS_RETURN_IF_ERROR(engine.Forward(seq_id, tokens.first(ctx - steps), false, &logits));
    engine.ResetProfile();
    for (int i = 0; i < steps; ++i) {
      KVS_RETURN_IF_ERROR(
          engine.Forward(seq_id, tokens.subspan(ctx - steps + i, 1), false, &logits));
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  KVS_RETURN_IF_ERROR(engine.FreeSequence(seq_id));
  KVS_RETURN_IF_ERROR(status);
  return engine.profile().attention_seconds / steps * 1e6;
}

}  // namespace

double BitsPerElementOfContext(const LlamaHparams& hparams, size_t cache_bytes, int ctx) {
  const double elements = 2.0 * ctx * hparams.num_layers * hparams.num_kv_heads * hparams.head_dim;
  return 8.0 * static_cast<double>(cache_bytes) / elements;
}

KvConfig ReferenceConfig(const KvConfig& config) {
  KvConfig reference = config;
  reference.k_codec = "f32";
  reference.v_codec = "f32";
  reference.layer_codecs.clear();
  reference.head_codecs.clear();
  reference.sink_tokens = 0;
  reference.hadamard_keys = false;
  reference.recent_tokens = 0;
  reference.profile.clear();
  // The full cache: every token kept, whatever `config` evicts.
  reference.policy = "full";
  reference.budget = KvBudget{};
  reference.capacity = 0;
  return reference;
}

absl::Status CheckConfig(const LlamaModel& model, const KvConfig& config,
                         const EvaluateOptions& options) {
  if (options.ctx < 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("evaluate: ctx must be >= 4 (the perplexity window), got %d", options.ctx));
  }
  // An engine of one window is small (ctx tokens); building it runs every check KvCache::Create
  // and the evictor make, with the engine's resolution of capacity 0 to the tokens the run
  // needs.
  EvaluateOptions one_thread = options;
  one_thread.num_threads = 1;
  return CreateEngine(model, config, one_thread).status();
}

absl::StatusOr<ReferenceRun> RunReference(const LlamaModel& model, std::span<const TokenId> tokens,
                                          const KvConfig& base_config,
                                          const EvaluateOptions& options,
                                          const std::function<void(int, int)>& progress) {
  ReferenceRun reference;
  reference.config = ReferenceConfig(base_config);
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                       CreateEngine(model, reference.config, options));
  reference.ctx = options.ctx;
  reference.vocab = model.hparams().vocab_size;
  const int first = options.ctx / 2;
  const int per_window = ScoredPerWindow(options.ctx);
  const size_t vocab = static_cast<size_t>(reference.vocab);
  reference.log_probs.reserve(static_cast<size_t>(NumWindows(tokens.size(), options)) * per_window *
                              vocab);

  PerplexityOptions perplexity = MakePerplexityOptions(options);
  perplexity.on_window_logits = [&](int window_idx, std::span<const float> logits) {
    const size_t base = reference.log_probs.size();
    reference.log_probs.resize(base + per_window * vocab);
    for (int j = 0; j < per_window; ++j) {
      std::span<float> row(reference.log_probs.data() + base + j * vocab, vocab);
      LogSoftmax(logits.subspan((first + j) * vocab, vocab), row);
      reference.top1.push_back(ArgMax(row));
    }
  };
  KVS_ASSIGN_OR_RETURN(reference.perplexity, Perplexity(*engine, tokens, perplexity, progress));
  reference.num_windows = reference.perplexity.num_windows;
  KVS_CHECK(reference.top1.size() == static_cast<size_t>(reference.perplexity.tokens_scored));
  return reference;
}

absl::StatusOr<ConfigEvaluation> EvaluateConfig(const LlamaModel& model,
                                                std::span<const TokenId> tokens,
                                                const KvConfig& config,
                                                const EvaluateOptions& options,
                                                const ReferenceRun& reference,
                                                const std::function<void(int, int)>& progress) {
  if (options.ctx != reference.ctx || NumWindows(tokens.size(), options) != reference.num_windows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "evaluate: the reference ran %d windows of ctx %d; this run asks for %d windows of ctx "
        "%d (use the same text, ctx and max_windows)",
        reference.num_windows, reference.ctx, NumWindows(tokens.size(), options), options.ctx));
  }
  const LlamaHparams& hparams = model.hparams();
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateEngine(model, config, options));

  ConfigEvaluation result;
  result.config = engine->options().kv;
  result.bits_per_element = engine->cache().bits_per_element();
  result.bytes_per_token_per_layer =
      static_cast<double>(engine->cache().bytes_per_token()) / hparams.num_layers;
  const double f16_bytes = 2.0 * 2.0 * hparams.num_kv_heads * hparams.head_dim;
  result.compression_vs_f16 = f16_bytes / result.bytes_per_token_per_layer;
  result.kept_fraction = engine->kept_fraction();
  result.memory_bits = result.bits_per_element * result.kept_fraction;

  const int first = options.ctx / 2;
  const int per_window = ScoredPerWindow(options.ctx);
  const size_t vocab = static_cast<size_t>(reference.vocab);
  std::vector<float> row(vocab);
  double kl_sum = 0;
  int64_t num_agree = 0;
  PerplexityOptions perplexity = MakePerplexityOptions(options);
  perplexity.on_window_logits = [&](int window_idx, std::span<const float> logits) {
    for (int j = 0; j < per_window; ++j) {
      const size_t pos_idx = static_cast<size_t>(window_idx) * per_window + j;
      LogSoftmax(logits.subspan((first + j) * vocab, vocab), row);
      const float* ref = reference.log_probs.data() + pos_idx * vocab;
      double kl = 0;
      for (size_t v = 0; v < vocab; ++v) {
        kl += std::exp(static_cast<double>(ref[v])) * (static_cast<double>(ref[v]) - row[v]);
      }
      kl_sum += kl;
      num_agree += ArgMax(row) == reference.top1[pos_idx];
    }
  };
  KVS_ASSIGN_OR_RETURN(PerplexityResult ppl, Perplexity(*engine, tokens, perplexity, progress));
  KVS_CHECK(ppl.tokens_scored == reference.perplexity.tokens_scored);
  result.ppl = ppl.ppl;
  result.ppl_stderr = ppl.ppl_stderr;
  result.peak_cache_bytes = ppl.peak_cache_bytes;
  result.bits_at_ctx = BitsPerElementOfContext(hparams, ppl.peak_cache_bytes, options.ctx);
  result.delta_ppl_pct = 100.0 * (ppl.ppl / reference.perplexity.ppl - 1.0);
  result.tokens_scored = ppl.tokens_scored;
  result.num_windows = ppl.num_windows;
  result.mean_kl = kl_sum / static_cast<double>(ppl.tokens_scored);
  result.top1_agreement = static_cast<double>(num_agree) / static_cast<double>(ppl.tokens_scored);

  const int steps = std::min(options.decode_steps, options.ctx / 2);
  if (steps > 0) {
    KVS_ASSIGN_OR_RETURN(result.decode_attention_us_per_token,
                         TimeDecodeAttention(*engine, tokens, options.ctx, steps));
  }
  return result;
}

std::vector<int> ParetoFrontier(std::span<const double> bits, std::span<const double> loss) {
  KVS_CHECK(bits.size() == loss.size());
  std::vector<int> order(bits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return bits[a] != bits[b] ? bits[a] < bits[b] : loss[a] < loss[b];
  });
  // Walking from fewest bits up, a point is on the frontier exactly when it beats the lowest
  // loss of every point with fewer (or equal, earlier-sorted) bits.
  std::vector<int> frontier;
  double best_loss = INFINITY;
  for (int idx : order) {
    if (std::isnan(loss[idx]) || !(loss[idx] < best_loss)) continue;
    best_loss = loss[idx];
    frontier.push_back(idx);
  }
  return frontier;
}

}  // namespace kvstack
