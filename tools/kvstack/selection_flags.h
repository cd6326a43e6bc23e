// The selection (layer 1) flags of every command that builds a cache: budget, how it is spread
// over layers and heads, the policies' parameters, positions, head classes and per-layer
// policies. Part of CacheFlags; each flag given overrides its TOML key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "kvstack/kv_config.h"

namespace kvstack::cli {

class SelectionFlags {
 public:
  // with_budget = false leaves --budget to the command (sweep takes a list).
  void Add(CLI::App* app, bool with_budget);
  // Applies the flags given to `config` (not validated here).
  absl::Status Apply(KvConfig* config) const;

 private:
  std::string budget_, layer_budget_, head_budget_, score_aggregation_, positions_, head_profile_;
  int evict_step_ = 0, policy_sinks_ = 0, policy_recent_ = 0, observation_window_ = 0,
      pool_kernel_ = 0;
  double retrieval_fraction_ = 0;
  std::vector<std::string> layer_policies_;
  std::vector<CLI::Option*> options_;  // in the order Apply reads them
};

// Parses one --layer-policy value "L:NAME" (the name is checked with the whole configuration).
absl::StatusOr<KvConfig::LayerCodecs> ParseLayerPolicy(std::string_view spec);

}  // namespace kvstack::cli
