// Two evaluations of what a selection policy keeps and loses over long contexts (issue 4's
// evidence), beside the perplexity sweep in evaluate.h:
//   - streaming: one long stream of text through the cache with no window restarts, perplexity
//     per segment; past the model's trained length only policies whose attention stays in
//     distribution (StreamingLLM's sinks + window with re-assigned positions) should stay flat;
//   - retrieval probe: a passage, unrelated text, the same passage again; the loss on the
//     second copy is low only if the cache still holds the first copy (induction), so it tells
//     which policies keep old but important tokens.
// Each runs an engine of the given configuration; single-threaded by contract.
#pragma once

#include <span>
#include <vector>

#include "kvstack/engine.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "kvstack/status.h"

namespace kvstack {

struct StreamingOptions {
  int total_tokens = 4096;   // tokens streamed (BOS first); >= segment_tokens
  int segment_tokens = 512;  // perplexity reported per segment of this many tokens; >= 2
  int batch = 0;             // tokens per forward call; 0 = ResolveBatch's default
  int num_threads = 0;
};

struct StreamingResult {
  KvConfig config;                  // with capacity resolved
  std::vector<double> segment_ppl;  // [total_tokens / segment_tokens]
  double ppl = 0;                   // over every scored token
  // The most bytes the cache held at once over the stream (KvCache::peak_bytes_in_use): what
  // an evicting policy keeps flat while the full cache grows with the stream.
  size_t peak_cache_bytes = 0;
};

// Streams tokens[0, total_tokens) (tokens[0] replaced by BOS) through one sequence. Position j
// predicts token j + 1; segment s covers predictions of tokens [s * segment, (s + 1) * segment).
// Errors: a text shorter than total_tokens, bad options, those of Engine::Create / Forward.
absl::StatusOr<StreamingResult> StreamingPerplexity(const LlamaModel& model,
                                                    std::span<const TokenId> tokens,
                                                    const KvConfig& config,
                                                    const StreamingOptions& options);

struct RetrievalProbeOptions {
  int passage_tokens = 100;  // >= 8
  int filler_tokens = 100;   // >= 0
  int num_probes = 32;       // passages tried, each from a different part of the text; >= 1
  int batch = 0;             // tokens per forward call; 0 = ResolveBatch's default
  int num_threads = 0;
};

struct RetrievalProbeResult {
  KvConfig config;
  // Mean negative log-likelihood per token of the second copy of the passage (its first
  // token excluded: nothing predicts where the copy starts).
  double second_copy_nll = 0;
  // The same tokens the first time they appear (no copy to look back at): what a cache that
  // lost the first copy should score at best.
  double first_copy_nll = 0;
  int tokens_scored = 0;
};

// Builds num_probes sequences [BOS, passage, filler, passage] from the text (passages and
// fillers from disjoint places) and scores them. Errors: a text too short for the probes, bad
// options, those of Engine::Create / Forward.
absl::StatusOr<RetrievalProbeResult> RetrievalProbe(const LlamaModel& model,
                                                    std::span<const TokenId> tokens,
                                                    const KvConfig& config,
                                                    const RetrievalProbeOptions& options);

}  // namespace kvstack
