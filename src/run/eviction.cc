// Evictor: the glue between selection policies, their scores and the cache's RetainTokens.
#include "run/eviction.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"
#include "kvstack/head_profile.h"
#include "run/dense_ops.h"
#include "select/whole_units.h"

namespace kvstack {

// evict_step 0 (auto) frees budget / 16 tokens per eviction, at most this many: a head then
// holds 94-100 % of its budget, and the O(tokens) compaction of long contexts (row moves cost
// 6-20 % of attention at a step of 32 in eviction_bench) runs once per 128 decode steps.
constexpr int kMaxAutoEvictStep = 128;

absl::StatusOr<std::unique_ptr<Evictor>> Evictor::Create(const LlamaHparams& hp,
                                                         uint64_t model_hash,
                                                         const KvConfig& config, int context_tokens,
                                                         double bytes_per_token) {
  KVS_CHECK(config.evicts());
  std::unique_ptr<Evictor> evictor(new Evictor(hp, config));
  KVS_ASSIGN_OR_RETURN(evictor->split_, ParseHeadSplit(config.head_budget));
  KVS_ASSIGN_OR_RETURN(const LayerSchedule schedule, ParseLayerSchedule(config.layer_budget));
  evictor->aggregation_ =
      config.score_aggregation == "mean" ? ScoreAggregation::kMean : ScoreAggregation::kMax;
  evictor->reassign_positions_ = config.positions == "reassign";

  const int budget = config.budget.Resolve(context_tokens, bytes_per_token);
  if (budget > context_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget %s is %d tokens, more than the context of %d tokens; allowed: 1..%d",
        config.budget.ToString(), budget, context_tokens, context_tokens));
  }
  const PolicyParams params = PolicyParamsOf(config);
  const std::vector<int> budgets =
      LayerBudgets(hp.num_layers, budget, schedule, std::min(budget, params.sink_tokens + 1));

  std::vector<bool> retrieval_heads;
  if (config.PolicyUsed("duo")) {
    KVS_ASSIGN_OR_RETURN(const HeadProfile profile, HeadProfile::Load(config.head_profile));
    KVS_RETURN_IF_ERROR(profile.CheckMatches(model_hash, hp.num_layers, hp.num_kv_heads));
    retrieval_heads = profile.RetrievalHeads(config.retrieval_fraction);
  }
  for (int layer_idx = 0; layer_idx < hp.num_layers; ++layer_idx) {
    Layer layer;
    KVS_ASSIGN_OR_RETURN(layer.policy, CreatePolicy(config.PolicyOf(layer_idx), params));
    const bool full = layer.policy->name() == "full";
    layer.budget = full ? context_tokens : budgets[layer_idx];
    layer.step = config.evict_step > 0 ? config.evict_step
                                       : std::clamp(layer.budget / 16, 1, kMaxAutoEvictStep);
    // A cut keeps budget + 1 - step tokens: never fewer than the sinks the policy protects
    // plus one.
    layer.step = std::clamp(layer.step, 1, std::max(1, layer.budget - params.sink_tokens));
    layer.keep_all.assign(hp.num_kv_heads, full);
    if (layer.policy->name() == "duo") {
      for (int h = 0; h < hp.num_kv_heads; ++h) {
        layer.keep_all[h] = retrieval_heads[static_cast<size_t>(layer_idx) * hp.num_kv_heads + h];
      }
    }
    const bool any_keep_all =
        std::find(layer.keep_all.begin(), layer.keep_all.end(), true) != layer.keep_all.end();
    // Adaptive splits let one head take up to all of its layer's tokens.
    const int head_most = evictor->split_ == HeadSplit::kAdaptive
                              ? std::min(context_tokens, layer.budget * hp.num_kv_heads)
                              : layer.budget;
    evictor->max_head_tokens_ =
        std::max(evictor->max_head_tokens_, any_keep_all ? context_tokens : head_most);
    evictor->layers_.push_back(std::move(layer));
  }
  return evictor;
}

double Evictor::KeptFraction(int context_tokens) const {
  double sum = 0;
  for (const Layer& layer : layers_) {
    for (bool keep_all : layer.keep_all) {
      sum += keep_all ? 1.0 : std::min(1.0, static_cast<double>(layer.budget) / context_tokens);
    }
  }
  return sum / (static_cast<double>(layers_.size()) * hparams_.num_kv_heads);
}

void Evictor::AddSequence(SeqId seq_id, int capacity) {
  states_[seq_id] =
      std::make_unique<SelectionState>(hparams_.num_layers, hparams_.num_kv_heads, capacity);
}

void Evictor::RemoveSequence(SeqId seq_id) { states_.erase(seq_id); }

int Evictor::NextPosition(SeqId seq_id, int layer_idx, int absolute) const {
  if (!reassign_positions_) return absolute;
  // Re-assigned positions are the tokens' places, the same in every head (validated).
  return states_.at(seq_id)->HeadTokens(layer_idx, 0);
}

const AttentionScores* Evictor::BeginLayerStep(SeqId seq_id, int layer_idx, int first_position,
                                               int count, int num_queries) {
  SelectionState& state = *states_.at(seq_id);
  state.Append(layer_idx, first_position, count);
  const SelectionPolicy& policy = *layers_[layer_idx].policy;
  switch (policy.score_kind()) {
    case ScoreKind::kNone:
      return nullptr;
    case ScoreKind::kAccumulated:
      request_.first_query = 0;
      break;
    case ScoreKind::kRecent:
      // Per-step scores are read only by the eviction this step triggers: a step that stays
      // within the budget asks for none (with evict_step s, one step in s pays for them).
      if (!OverBudget(state, layer_idx)) return nullptr;
      state.ClearScores(layer_idx);
      request_.first_query = std::max(0, num_queries - policy.observation_window());
      break;
  }
  request_.out = state.ScoreRows(layer_idx);
  request_.stride = state.stride();
  request_.aggregation = aggregation_;
  return &request_;
}

bool Evictor::OverBudget(const SelectionState& state, int layer_idx) const {
  const Layer& layer = layers_[layer_idx];
  int total = 0, heads = 0;
  for (int h = 0; h < hparams_.num_kv_heads; ++h) {
    if (layer.keep_all[h]) continue;
    const int n = state.HeadTokens(layer_idx, h);
    if (split_ == HeadSplit::kUniform && n > layer.budget) return true;
    total += n;
    ++heads;
  }
  return split_ == HeadSplit::kAdaptive && total > heads * layer.budget;
}

absl::Status Evictor::EndLayerStep(SeqId seq_id, int layer_idx, KvCache& cache) {
  SelectionState& state = *states_.at(seq_id);
  if (!OverBudget(state, layer_idx)) return absl::OkStatus();
  const Layer& layer = layers_[layer_idx];
  const int num_heads = hparams_.num_kv_heads;

  // The heads that evict, and what each keeps.
  std::vector<int> heads;
  std::vector<SelectionInput> inputs;
  for (int h = 0; h < num_heads; ++h) {
    if (layer.keep_all[h]) continue;
    heads.push_back(h);
    inputs.push_back(SelectionInput{.positions = state.Positions(layer_idx, h),
                                    .scores = layer.policy->needs_scores()
                                                  ? state.Scores(layer_idx, h)
                                                  : std::span<const float>(),
                                    .budget = layer.budget + 1 - layer.step});
  }
  std::vector<std::vector<int>> keep;
  SelectLayer(*layer.policy, split_, inputs, layer.budget + 1 - layer.step, &keep);
  // Codecs whose units group tokens: whole units go or stay where the budget allows, so the
  // cache moves kept units as bytes instead of re-rounding units that lost some tokens.
  const int period = cache.unit_period(layer_idx);
  if (period > 1) {
    for (size_t i = 0; i < heads.size(); ++i) {
      const int held = state.HeadTokens(layer_idx, heads[i]);
      keep[i] = KeepWholeUnits(keep[i], EncodedTokens(held, period, cache.config().recent_tokens),
                               period, std::min(cache.config().sink_tokens, held));
    }
  }

  for (size_t i = 0; i < heads.size(); ++i) {
    const int h = heads[i];
    if (static_cast<int>(keep[i].size()) == state.HeadTokens(layer_idx, h)) continue;
    KvCache::KeyRewrite rewrite;
    if (reassign_positions_) {
      // StreamingLLM's positions: a kept key moves to its new place in the cache, and its
      // rotation follows, from the position it was computed at to that place.
      const std::span<const int> positions = state.Positions(layer_idx, h);
      rewrite = [&, positions](int old_index, int new_index, std::span<float> key) {
        const int delta = new_index - positions[old_index];
        if (delta != 0) {
          ops::Rope(key.data(), 1, hparams_.head_dim, hparams_.rope_dim, delta,
                    hparams_.rope_freq_base, hparams_.rope_style);
        }
      };
    }
    KVS_RETURN_IF_ERROR(cache.RetainTokens(seq_id, layer_idx, h, keep[i], rewrite));
    state.Retain(layer_idx, h, keep[i]);
    if (reassign_positions_) {
      std::vector<int> places(keep[i].size());
      std::iota(places.begin(), places.end(), 0);
      state.SetPositions(layer_idx, h, places);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvstack
