// KvConfigToml: a KvConfig written as the TOML that ParseKvConfigToml reads. Values are
// formatted by toml++ itself (string escapes, doubles to 17 digits), so the writer and the
// parser agree on the syntax by construction; this file only decides what is written where.
#include <toml++/toml.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kvstack/kv_config.h"

namespace kvstack {
namespace {

// One `key = value` line, the value as toml++ prints it.
template <typename T>
void AppendKey(std::ostringstream& out, std::string_view key, const T& value) {
  out << key << " = " << toml::value<T>(value) << "\n";
}

void AppendString(std::ostringstream& out, std::string_view key, const std::string& value) {
  AppendKey(out, key, value);
}

void AppendInt(std::ostringstream& out, std::string_view key, int64_t value) {
  AppendKey(out, key, value);
}

// The budget as a string ParseKvBudget reads back to the same kind and value: whole tokens
// and bytes exactly; a fraction below 1 as the bare number (17 digits), since "N%" would pass
// through a division by 100; the whole context as "100%" (a bare 1 would be one token).
std::string BudgetText(const KvBudget& budget) {
  if (budget.kind == KvBudget::Kind::kFraction && budget.value < 1.0) {
    return absl::StrFormat("%.17g", budget.value);
  }
  return budget.ToString();
}

}  // namespace

std::string KvConfigToml(const KvConfig& config) {
  std::ostringstream out;
  out << "[kv]\n";
  AppendString(out, "layout", std::string(LayoutName(config.layout)));
  AppendInt(out, "block_size", config.block_size);
  AppendString(out, "k_codec", config.k_codec);
  AppendString(out, "v_codec", config.v_codec);
  AppendInt(out, "capacity", config.capacity);
  AppendInt(out, "max_sequences", config.max_sequences);
  AppendString(out, "policy", config.policy);
  if (config.budget.is_set()) AppendString(out, "budget", BudgetText(config.budget));
  AppendString(out, "layer_budget", config.layer_budget);
  AppendString(out, "head_budget", config.head_budget);
  AppendInt(out, "evict_step", config.evict_step);
  AppendInt(out, "policy_sinks", config.policy_sinks);
  AppendInt(out, "policy_recent", config.policy_recent);
  AppendInt(out, "observation_window", config.observation_window);
  AppendInt(out, "pool_kernel", config.pool_kernel);
  AppendString(out, "score_aggregation", config.score_aggregation);
  AppendString(out, "positions", config.positions);
  AppendString(out, "head_profile", config.head_profile);
  AppendKey(out, "retrieval_fraction", config.retrieval_fraction);
  AppendInt(out, "sink_tokens", config.sink_tokens);
  AppendInt(out, "recent_tokens", config.recent_tokens);
  AppendKey(out, "hadamard_keys", config.hadamard_keys);
  AppendString(out, "profile", config.profile);

  // Each layer's table, then its heads' tables under it, layers and heads in index order (a
  // table header may appear only once in a TOML document).
  std::map<int, std::vector<const KvConfig::HeadCodecs*>> heads_of_layer;
  for (const KvConfig::HeadCodecs& head : config.head_codecs) {
    heads_of_layer[head.layer_idx].push_back(&head);
  }
  std::map<int, const KvConfig::LayerCodecs*> layer_entries;
  for (const KvConfig::LayerCodecs& layer : config.layer_codecs) {
    layer_entries[layer.layer_idx] = &layer;
    heads_of_layer.try_emplace(layer.layer_idx);
  }
  for (auto& [layer_idx, heads] : heads_of_layer) {
    if (const auto layer = layer_entries.find(layer_idx); layer != layer_entries.end()) {
      out << "\n[kv.layer." << layer_idx << "]\n";
      if (!layer->second->k_codec.empty()) AppendString(out, "k_codec", layer->second->k_codec);
      if (!layer->second->v_codec.empty()) AppendString(out, "v_codec", layer->second->v_codec);
      if (!layer->second->policy.empty()) AppendString(out, "policy", layer->second->policy);
    }
    std::sort(heads.begin(), heads.end(),
              [](const auto* a, const auto* b) { return a->kv_head < b->kv_head; });
    for (const KvConfig::HeadCodecs* head : heads) {
      out << "\n[kv.layer." << layer_idx << ".head." << head->kv_head << "]\n";
      if (!head->k_codec.empty()) AppendString(out, "k_codec", head->k_codec);
      if (!head->v_codec.empty()) AppendString(out, "v_codec", head->v_codec);
    }
  }
  return out.str();
}

}  // namespace kvstack
