// Evictor: applies a KvConfig's selection policies (layer 1) to an engine's cache (layer 3).
// Per sequence it keeps a SelectionState (original positions and attention scores of the
// tokens each (layer, kv head) holds) in step with the cache. In each forward step, per layer:
// the engine asks it which positions the new tokens get (original, or their places in the
// cache when positions are re-assigned) and which scores the attention kernels should add up
// (none when the layer's policy reads none); after the layer's attention it selects what each
// kv head keeps and has the cache retain exactly that, re-rotating moved keys when positions
// are re-assigned. Budgets are tokens per kv head; between forward calls no head holds more
// than its budget (during a call, up to the call's tokens more). In layers whose codecs group
// several tokens per unit, the policy's choice is rounded to whole encoded units where the
// budget allows (KeepWholeUnits), so that kept units move exactly.
#pragma once

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "base/thread_pool.h"
#include "kvstack/kv_cache.h"
#include "kvstack/kv_config.h"
#include "kvstack/model.h"
#include "kvstack/policy.h"
#include "kvstack/selection_state.h"
#include "kvstack/status.h"
#include "run/attention.h"

namespace kvstack {

class Evictor {
 public:
  // Builds the per-layer policies and budgets of `config` (which must evict: config.evicts())
  // for a model of this shape and content hash (a head profile must match it).
  // context_tokens resolves fractional budgets, bytes_per_token byte budgets.
  // Errors: policy parameters, a budget larger than the context, a head profile that is
  // missing, unreadable or of another model — one line each.
  static absl::StatusOr<std::unique_ptr<Evictor>> Create(const LlamaHparams& hparams,
                                                         uint64_t model_hash,
                                                         const KvConfig& config, int context_tokens,
                                                         double bytes_per_token);

  // The most tokens a kv head keeps between forward calls, over all layers (the context for
  // heads that keep everything). The cache needs this plus one forward call's tokens.
  int MaxHeadTokens() const { return max_head_tokens_; }
  // The tokens per kv head layer `layer_idx` keeps (the policy budget; see LayerBudgets).
  int LayerBudget(int layer_idx) const { return layers_[layer_idx].budget; }
  // Decode steps one eviction serves (config.evict_step resolved): a head over its budget is
  // cut to budget + 1 - step, so the O(tokens) compaction runs once per `step` decode steps.
  int LayerStep(int layer_idx) const { return layers_[layer_idx].step; }

  // The mean over layers and kv heads of the share of a `context_tokens` context each keeps.
  double KeptFraction(int context_tokens) const;

  // A sequence's selection state; capacity = the cache's tokens per sequence.
  void AddSequence(SeqId seq_id, int capacity);
  void RemoveSequence(SeqId seq_id);

  // The RoPE position the next token of layer `layer_idx` gets: `absolute` with original
  // positions, the layer's token count with re-assigned ones.
  int NextPosition(SeqId seq_id, int layer_idx, int absolute) const;
  // Records `count` new tokens of one layer at positions first_position.. and returns the
  // scores request for this step's attention over that layer (null when its policy reads no
  // scores). The request stays valid until the next call.
  const AttentionScores* BeginLayerStep(SeqId seq_id, int layer_idx, int first_position, int count,
                                        int num_queries);
  // After the layer's attention: selects and retains, in the cache, what each kv head keeps.
  absl::Status EndLayerStep(SeqId seq_id, int layer_idx, KvCache& cache);

 private:
  struct Layer {
    std::unique_ptr<SelectionPolicy> policy;
    int budget = 0;
    int step = 0;
    // Heads that keep every token (duo's retrieval heads); [num_kv_heads].
    std::vector<bool> keep_all;
  };
  Evictor(const LlamaHparams& hparams, const KvConfig& config)
      : hparams_(hparams), config_(config) {}
  // Whether layer `layer_idx` must evict now.
  bool OverBudget(const SelectionState& state, int layer_idx) const;

  LlamaHparams hparams_;
  KvConfig config_;
  HeadSplit split_ = HeadSplit::kUniform;
  ScoreAggregation aggregation_ = ScoreAggregation::kMax;
  bool reassign_positions_ = false;
  int max_head_tokens_ = 0;
  std::vector<Layer> layers_;
  absl::flat_hash_map<SeqId, std::unique_ptr<SelectionState>> states_;
  AttentionScores request_;
};

}  // namespace kvstack
