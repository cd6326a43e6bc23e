// Evaluation of one cache configuration against the full-precision run of the same text: the
// measurements `kvstack sweep` tabulates to choose a KV representation. Accuracy is
// perplexity (llama.cpp's method, see engine.h), KL divergence of the next-token distribution
// from the F32-cache run and top-1 agreement with it; size is bits per element and bytes per
// token per layer as the cache stores them; speed is decode-attention time per token.
// Single-threaded by contract (the engines it creates use their own kernel threads).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvstack/engine.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "kvstack/status.h"

namespace kvstack {

struct EvaluateOptions {
  // Perplexity window in tokens (>= 4); also the context of the decode timing run.
  // Default: 512.
  int ctx = 512;
  // Kernel threads, the caller included; 0 = all hardware threads. Default: 0.
  int num_threads = 0;
  // Tokens per forward call; 0 = ctx. Default: 0.
  int batch = 0;
  // Windows from the start of the text; 0 = every whole window. Default: 0.
  int max_windows = 0;
  // Single-token decode steps timed after a prefill of ctx - decode_steps tokens; clamped to
  // ctx / 2. 0 skips the timing run. Default: 64.
  int decode_steps = 64;
};

// The full-precision run that every configuration is compared with.
struct ReferenceRun {
  KvConfig config;  // the F32 configuration that produced it (see ReferenceConfig)
  PerplexityResult perplexity;
  int ctx = 0;
  int vocab = 0;
  int num_windows = 0;
  // Log-softmax over the vocabulary at every scored position, window after window (positions
  // [ctx/2, ctx-1) of each): [num_windows * (ctx - 1 - ctx/2), vocab].
  std::vector<float> log_probs;
  // Arg-max of the same rows: [num_windows * (ctx - 1 - ctx/2)].
  std::vector<int32_t> top1;
};

struct ConfigEvaluation {
  KvConfig config;  // with capacity resolved
  double ppl = 0;
  double ppl_stderr = 0;
  // 100 * (ppl / reference ppl - 1); negative when the configuration scores better.
  double delta_ppl_pct = 0;
  // Mean over scored positions of KL(p_reference || p_config) in nats; >= 0 up to rounding.
  double mean_kl = 0;
  // Fraction of scored positions whose most likely next token equals the reference's.
  double top1_agreement = 0;
  int64_t tokens_scored = 0;
  int num_windows = 0;
  // Storage bits per element, K and V averaged over every layer (KvCache::bits_per_element).
  double bits_per_element = 0;
  // K + V bytes one token occupies in one layer (all kv heads), averaged over layers.
  double bytes_per_token_per_layer = 0;
  // F16 K and V bytes per token per layer divided by bytes_per_token_per_layer.
  double compression_vs_f16 = 0;
  // The mean share of the ctx window an evicting policy keeps per layer and kv head (1 for
  // the full cache), and the cache's bits per element of context: bits_per_element times it.
  double kept_fraction = 1;
  double memory_bits = 0;
  // What the cache really held for one window of ctx tokens: its peak bytes in use (blocks in
  // use, partly filled ones whole, plus the F32 sink, recent and pending rows, which
  // bits_per_element and memory_bits leave out), and those bits per element of the window
  // (BitsPerElementOfContext).
  size_t peak_cache_bytes = 0;
  double bits_at_ctx = 0;
  // Seconds in attention kernels over the timed decode steps, per step, in microseconds;
  // 0 when decode_steps is 0.
  double decode_attention_us_per_token = 0;
};

// 8 * cache_bytes over the K and V elements of ctx tokens in every layer and kv head: the bits
// per element a cache of cache_bytes spends on a context of ctx tokens.
double BitsPerElementOfContext(const LlamaHparams& hparams, size_t cache_bytes, int ctx);

// The reference configuration for `config`: the same layout, block size and sequences, with
// every codec F32, no per-layer overrides, no sinks, no key rotation, and the full cache
// (policy "full", no budget, capacity resolved by the run).
KvConfig ReferenceConfig(const KvConfig& config);

// Runs the reference over `tokens` (the whole text, BOS first). progress(done, total) after
// each window. Errors: those of Engine::Create and Perplexity (e.g. a text shorter than ctx).
absl::StatusOr<ReferenceRun> RunReference(const LlamaModel& model, std::span<const TokenId> tokens,
                                          const KvConfig& base_config,
                                          const EvaluateOptions& options,
                                          const std::function<void(int, int)>& progress);

// Checks, without running anything, what EvaluateConfig would reject about `config` for this
// model and options: the configuration's fields, its codecs, and whether a cache of ctx tokens
// can be built with it (e.g. a block size that is not a multiple of a codec's token group).
// Errors: ctx < 4; the one-line message of ValidateKvConfig, CreateCodec or KvCache::Create.
absl::Status CheckConfig(const LlamaModel& model, const KvConfig& config,
                         const EvaluateOptions& options);

// Evaluates `config` on the same tokens and windows as `reference` (options.ctx and
// options.max_windows must be those of the reference run: InvalidArgument otherwise).
// progress(done, total) after each perplexity window. Errors: an invalid configuration (the
// codec's or the config's one-line message), those of Engine::Create and Perplexity.
absl::StatusOr<ConfigEvaluation> EvaluateConfig(const LlamaModel& model,
                                                std::span<const TokenId> tokens,
                                                const KvConfig& config,
                                                const EvaluateOptions& options,
                                                const ReferenceRun& reference,
                                                const std::function<void(int, int)>& progress);

// Indices of the Pareto-optimal points (fewest bits for a given loss): a point is kept when
// no other point has fewer-or-equal bits and a lower-or-equal loss with one of them strictly
// lower. Sorted by bits ascending (loss descending). Equal points keep the first index.
// bits, loss: [num_points].
std::vector<int> ParetoFrontier(std::span<const double> bits, std::span<const double> loss);

}  // namespace kvstack
