// Engine: a LlamaModel plus a KvCache — the CPU inference loop that runs every token through
// the cache design a KvConfig names. Forward() runs a batch of tokens of one sequence
// (prefill or a single decode token); Generate() and Perplexity() are built on it.
// Not thread-safe: one caller at a time (the engine owns a thread pool for its kernels).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kvstack/kv_cache.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "kvstack/sampler.h"
#include "kvstack/status.h"

namespace kvstack {

class ThreadPool;
class Evictor;

struct EngineOptions {
  // The cache design. A capacity of 0 is resolved to `context_tokens`, or for an evicting
  // policy to what it keeps per kv head plus one forward call's tokens.
  KvConfig kv;
  // Tokens per sequence the run needs (prompt + generated, or the perplexity window); used
  // to resolve kv.capacity == 0. Must be >= 1.
  int context_tokens = 0;
  // Kernel threads, the caller included; 0 = all hardware threads. Default: 0.
  int num_threads = 0;
  // Most tokens one forward pass processes; longer inputs run in micro-batches. Default: 512.
  // 1..kMaxEngineBatch.
  int max_batch = 512;
};

// The largest EngineOptions::max_batch (its activation buffers are sized for it).
inline constexpr int kMaxEngineBatch = 65536;

// Time spent per phase of the forward pass, accumulated over calls (seconds).
struct EngineProfile {
  double attention_seconds = 0;  // attention kernels only (scores for policies included)
  double eviction_seconds = 0;   // selecting and retaining tokens (evicting policies)
  double total_seconds = 0;      // whole Forward calls
  int64_t attention_calls = 0;
  // Bytes of cache (K and V, stored format) the attention kernels read, summed over calls.
  double cache_bytes_read = 0;
};

// The cache options for a model's shape and content hash with the given cache design.
KvCacheOptions CacheOptionsFor(const LlamaModel& model, const KvConfig& kv);

class Engine {
 public:
  // The model must outlive the engine. Errors: invalid options or KvConfig (one line naming
  // the field), a cache that cannot be created.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const LlamaModel& model,
                                                        const EngineOptions& options);
  ~Engine();

  const LlamaModel& model() const { return model_; }
  const KvCache& cache() const { return *cache_; }
  // Starts the cache's peak_bytes_in_use again from what it holds now.
  void ResetCachePeak() { cache_->ResetPeakBytesInUse(); }
  // The options with kv.capacity resolved.
  const EngineOptions& options() const { return options_; }
  // The mean share of the context (options().context_tokens) the cache keeps per layer and kv
  // head between forward calls: 1 unless the configuration evicts.
  double kept_fraction() const;

  absl::StatusOr<SeqId> NewSequence();
  absl::Status FreeSequence(SeqId seq_id);
  // Position the next token of the sequence will get.
  int NextPosition(SeqId seq_id) const;

  // Runs `tokens` through the model at the sequence's next positions, appending their keys
  // and values to its cache. logits: [tokens.size(), vocab] when all_logits, otherwise
  // [vocab] for the last token. ResourceExhausted when the cache cannot take the tokens (the
  // sequence is then unchanged for the tokens that did not fit); InvalidArgument for token
  // ids outside the vocabulary.
  absl::Status Forward(SeqId seq_id, std::span<const TokenId> tokens, bool all_logits,
                       std::vector<float>* logits);

  // Observes attention, for calibration: after each layer's attention in every forward call,
  // `observer` gets the probabilities the call's last query gave each logical token of that
  // layer, per kv head (the mean over the kv head's query heads): scores[h * stride + t] for t
  // < the head's token count. Costs a score pass per layer while set; clear with an empty
  // function. FailedPrecondition for an evicting cache (its policies own the scores).
  using AttentionObserver =
      std::function<void(int layer_idx, std::span<const float> scores, int stride)>;
  absl::Status SetAttentionObserver(AttentionObserver observer);

  const EngineProfile& profile() const { return profile_; }
  void ResetProfile() { profile_ = EngineProfile{}; }

 private:
  struct Scratch;
  Engine(const LlamaModel& model, const EngineOptions& options, std::unique_ptr<KvCache> cache,
         std::unique_ptr<Evictor> evictor);
  static absl::StatusOr<std::unique_ptr<Evictor>> CreateEvictor(const LlamaModel& model,
                                                                EngineOptions& resolved);
  absl::Status ForwardBatch(SeqId seq_id, std::span<const TokenId> tokens, bool all_logits,
                            float* logits);

  const LlamaModel& model_;
  EngineOptions options_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Evictor> evictor_;  // null unless the configuration evicts
  AttentionObserver observer_;
  std::vector<float> observed_scores_;  // [num_kv_heads][capacity] while observer_ is set
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scratch> scratch_;
  std::vector<int> next_pos_;  // by seq_id
  EngineProfile profile_;
};

struct GenerateOptions {
  int max_new_tokens = 64;  // >= 0
  SamplerOptions sampler;
  bool stop_at_eos = true;  // Default: true.
};

struct GenerateStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0;  // the prompt's forward pass (its logits give token 1)
  double decode_seconds = 0;   // every later single-token forward pass
  int decode_steps = 0;
  // Cache bytes the sequence held at the end of generation (blocks in use, stored format, and
  // F32 rows not yet encoded), and of those the F32 rows (KvCache::f32_row_bytes_in_use).
  size_t kv_bytes_in_use = 0;
  size_t kv_f32_row_bytes = 0;
  double prefill_tokens_per_s() const;
  double decode_tokens_per_s() const;
};

// Generates up to max_new_tokens after `prompt` (which should start with BOS) in a new
// sequence, calling on_token for each as it is chosen; frees the sequence at the end.
absl::StatusOr<GenerateStats> Generate(Engine& engine, std::span<const TokenId> prompt,
                                       const GenerateOptions& options,
                                       const std::function<void(TokenId)>& on_token);

struct PerplexityOptions {
  int ctx = 512;  // window length in tokens, BOS first; >= 4
  // Tokens per forward call within a window; 0 = ctx, or 16 when the cache evicts (policies
  // act between calls; see run/sequence_logits.h).
  int batch = 0;
  // Windows to run from the start of the text; 0 = every whole window. Default: 0.
  int max_windows = 0;
  // Called after each window with the logits of all its positions (position j predicts
  // token j + 1 of the window); the span is valid only during the call. Default: none.
  std::function<void(int window_idx, std::span<const float> logits /*[ctx, vocab]*/)>
      on_window_logits;
};

struct PerplexityResult {
  double ppl = 0;
  double ppl_stderr = 0;
  double mean_nll = 0;
  int64_t tokens_scored = 0;
  int num_windows = 0;
  // The most bytes the cache held at once while the windows ran (KvCache::peak_bytes_in_use:
  // the blocks in use plus the F32 sink, recent and pending rows, an evicting policy's
  // not-yet-trimmed tokens included).
  size_t peak_cache_bytes = 0;
};

// llama.cpp's llama-perplexity method, so the figures compare: `tokens` is the whole text
// encoded with BOS first; it is cut into windows of ctx tokens, the first token of each
// replaced by BOS, and the second half of each window is scored (logits at positions
// [ctx/2, ctx-1) predicting the next token). progress(done, total) after each window. The
// cache's peak is reset at the start (Engine::ResetCachePeak), so peak_cache_bytes is this
// run's.
absl::StatusOr<PerplexityResult> Perplexity(Engine& engine, std::span<const TokenId> tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(int, int)>& progress);

// The checks Perplexity makes of its options against a text of num_tokens tokens (ctx, batch,
// max_windows, at least one whole window), for callers to make before they build an engine of
// ctx tokens: a one-line InvalidArgument error, or OK.
absl::Status CheckPerplexityOptions(size_t num_tokens, const PerplexityOptions& options);

}  // namespace kvstack
