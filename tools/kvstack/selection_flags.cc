// SelectionFlags: the eviction-policy flags, applied over a TOML configuration.
#include "selection_flags.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvstack::cli {

void SelectionFlags::Add(CLI::App* app, bool with_budget) {
  options_.push_back(
      with_budget ? app->add_option("--budget", budget_,
                                    "tokens an evicting policy keeps per kv head: 256, 50% of "
                                    "the context, or bytes per sequence (64KiB)")
                  : nullptr);
  options_.push_back(app->add_option("--layer-budget", layer_budget_,
                                     "spread of the budget over layers: uniform | pyramid "
                                     "(PyramidKV; default uniform)"));
  options_.push_back(app->add_option("--head-budget", head_budget_,
                                     "split over kv heads: uniform | adaptive (Ada-KV; default "
                                     "uniform)"));
  options_.push_back(app->add_option("--policy-sinks", policy_sinks_,
                                     "first tokens every policy keeps (default 4)"));
  options_.push_back(app->add_option("--policy-recent", policy_recent_,
                                     "recent tokens h2o and snapkv keep; -1 = half the budget "
                                     "(default -1)"));
  options_.push_back(app->add_option("--observation-window", observation_window_,
                                     "snapkv: queries whose attention is observed (default 32)"));
  options_.push_back(
      app->add_option("--pool-kernel", pool_kernel_,
                      "snapkv: max-pool width over neighbouring tokens (default 7)"));
  options_.push_back(app->add_option("--score-aggregation", score_aggregation_,
                                     "GQA: max | mean over the query heads of a kv head "
                                     "(default max)"));
  options_.push_back(app->add_option("--positions", positions_,
                                     "RoPE positions of kept tokens: original | reassign "
                                     "(StreamingLLM; default original)"));
  options_.push_back(app->add_option("--head-profile", head_profile_,
                                     "policy duo: head profile from `kvstack calibrate --heads`"));
  options_.push_back(app->add_option("--retrieval-fraction", retrieval_fraction_,
                                     "policy duo: fraction of kv heads that keep everything "
                                     "(default 0.25)"));
  options_.push_back(app->add_option("--evict-step", evict_step_,
                                     "decode steps one eviction serves: a head over budget is "
                                     "cut to budget + 1 - step; 1 = every step, 0 = budget/16 "
                                     "in 1..128 (default 0)"));
  app->add_option("--layer-policy", layer_policies_,
                  "L:NAME policy of layer L, e.g. 0:full; repeatable")
      ->take_all()
      ->allow_extra_args(false);
}

absl::StatusOr<KvConfig::LayerCodecs> ParseLayerPolicy(std::string_view spec) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(spec.data(), spec.size()), ':');
  int layer_idx = -1;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &layer_idx) || layer_idx < 0 ||
      parts[1].empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--layer-policy '%s': expected L:NAME (layer index >= 0, policy name), e.g. 0:full", spec));
  }
  KvConfig::LayerCodecs entry;
  entry.layer_idx = layer_idx;
  entry.policy = std::string(parts[1]);
  return entry;
}

absl::Status SelectionFlags::Apply(KvConfig* config) const {
  auto given = [&](size_t i) { return options_[i] != nullptr && options_[i]->count() > 0; };
  if (given(0)) {
    absl::StatusOr<KvBudget> budget = ParseKvBudget(budget_);
    if (!budget.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--budget: ", budget.status().message()));
    }
    config->budget = *budget;
  }
  if (given(1)) config->layer_budget = layer_budget_;
  if (given(2)) config->head_budget = head_budget_;
  if (given(3)) config->policy_sinks = policy_sinks_;
  if (given(4)) config->policy_recent = policy_recent_;
  if (given(5)) config->observation_window = observation_window_;
  if (given(6)) config->pool_kernel = pool_kernel_;
  if (given(7)) config->score_aggregation = score_aggregation_;
  if (given(8)) config->positions = positions_;
  if (given(9)) config->head_profile = head_profile_;
  if (given(10)) config->retrieval_fraction = retrieval_fraction_;
  if (given(11)) config->evict_step = evict_step_;
  for (const std::string& spec : layer_policies_) {
    KVS_ASSIGN_OR_RETURN(KvConfig::LayerCodecs layer, ParseLayerPolicy(spec));
    // One entry per layer holds its codecs and its policy.
    auto it = std::find_if(
        config->layer_codecs.begin(), config->layer_codecs.end(),
        [&](const KvConfig::LayerCodecs& l) { return l.layer_idx == layer.layer_idx; });
    if (it != config->layer_codecs.end()) {
      it->policy = layer.policy;
    } else {
      config->layer_codecs.push_back(std::move(layer));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvstack::cli
