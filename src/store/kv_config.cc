// KvConfig: printing, validation and TOML parsing of the cache configuration. toml++ reports
// syntax errors by throwing toml::parse_error; that exception is caught right at the
// toml::parse call and turned into a Status, so nothing else in kvstack ever sees one.
#include "kvstack/kv_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvstack/codec.h"
#include "kvstack/policy.h"
#include "represent/latent_codec.h"

namespace kvstack {
namespace {

constexpr int kMaxSequences = 4096;
constexpr int kMaxSinkTokens = 65536;

constexpr std::array<std::string_view, 3> kLayoutNames = {"contiguous", "paged", "ring"};

// Every key a config file may set, in the order ToString prints the fields. "layer" is the
// table of per-layer codec overrides: [kv.layer.N] k_codec = ..., v_codec = ...
constexpr std::array<std::string_view, 24> kConfigKeys = {"layout",
                                                          "block_size",
                                                          "k_codec",
                                                          "v_codec",
                                                          "capacity",
                                                          "max_sequences",
                                                          "policy",
                                                          "sink_tokens",
                                                          "hadamard_keys",
                                                          "layer",
                                                          "profile",
                                                          "recent_tokens",
                                                          "budget",
                                                          "layer_budget",
                                                          "head_budget",
                                                          "policy_sinks",
                                                          "policy_recent",
                                                          "observation_window",
                                                          "pool_kernel",
                                                          "score_aggregation",
                                                          "positions",
                                                          "head_profile",
                                                          "retrieval_fraction",
                                                          "evict_step"};
constexpr std::array<std::string_view, 4> kLayerKeys = {"k_codec", "v_codec", "policy", "head"};
constexpr std::array<std::string_view, 2> kHeadKeys = {"k_codec", "v_codec"};
constexpr std::array<std::string_view, 2> kAggregations = {"max", "mean"};
constexpr std::array<std::string_view, 2> kPositionModes = {"original", "reassign"};

// absl::StrCat/StrJoin take absl::string_view, which in Debian's absl build is not
// std::string_view; names are copied into std::string at that boundary.
std::string JoinNames(std::span<const std::string_view> names) {
  return absl::StrJoin(names, ", ",
                       [](std::string* out, std::string_view name) { out->append(name); });
}

bool Contains(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

absl::Status CheckName(std::string_view field, std::string_view value,
                       const std::vector<std::string>& allowed) {
  if (Contains(allowed, value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("kv config: ", std::string(field), " '", std::string(value),
                   "' is unknown; allowed: ", absl::StrJoin(allowed, ", ")));
}

// A codec name, checked by the codec layer's grammar (options included); the error names the
// field as well.
absl::Status CheckCodecField(std::string_view field, std::string_view name) {
  const absl::Status status = CheckCodecName(name);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat("kv config: ", std::string(field), " '",
                                                 std::string(name),
                                                 "' is invalid: ", status.message()));
}

// The fields of the selection (layer 1) part of a config.
absl::Status ValidateSelection(const KvConfig& config) {
  KVS_RETURN_IF_ERROR(CheckName("policy", config.policy, PolicyNames()));
  if (!config.evicts()) {
    if (config.budget.is_set()) {
      return absl::InvalidArgumentError(
          "kv config: budget is set but policy 'full' keeps every token; allowed: a budget "
          "with an evicting policy (" +
          absl::StrJoin(PolicyNames(), ", ") + ")");
    }
    return absl::OkStatus();
  }
  if (!config.budget.is_set()) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: policy '", config.policy,
                                                   "' evicts and needs a budget (--budget)"));
  }
  KVS_RETURN_IF_ERROR(ParseLayerSchedule(config.layer_budget).status());
  if (config.evict_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: evict_step ", config.evict_step,
                                                   " is negative; allowed: 0 (auto) or tokens"));
  }
  KVS_ASSIGN_OR_RETURN(const HeadSplit split, ParseHeadSplit(config.head_budget));
  if (std::find(kAggregations.begin(), kAggregations.end(), config.score_aggregation) ==
      kAggregations.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: score_aggregation '", config.score_aggregation,
                     "' is unknown; allowed: ", JoinNames(kAggregations)));
  }
  if (std::find(kPositionModes.begin(), kPositionModes.end(), config.positions) ==
      kPositionModes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: positions '", config.positions,
                     "' is unknown; allowed: ", JoinNames(kPositionModes)));
  }
  const PolicyParams params = PolicyParamsOf(config);
  const bool duo = config.PolicyUsed("duo");
  for (const std::string& name : PolicyNames()) {
    if (!config.PolicyUsed(name)) continue;
    absl::StatusOr<std::unique_ptr<SelectionPolicy>> policy = CreatePolicy(name, params);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("kv config: ", policy.status().message()));
    }
    if (split == HeadSplit::kAdaptive && !(*policy)->needs_scores() && name != "full") {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv config: head_budget 'adaptive' splits by attention scores, which policy '", name,
          "' does not use; allowed: adaptive with h2o, tova or snapkv"));
    }
  }
  if (config.positions == "reassign" && (split == HeadSplit::kAdaptive || duo)) {
    return absl::InvalidArgumentError(
        "kv config: positions 'reassign' needs every kv head to hold the same number of tokens; "
        "allowed with head_budget 'uniform' and policies other than duo");
  }
  if (duo && config.head_profile.empty()) {
    return absl::InvalidArgumentError(
        "kv config: policy 'duo' needs a head profile (--head-profile, from `kvstack calibrate "
        "--heads`)");
  }
  if (!(config.retrieval_fraction >= 0.0 && config.retrieval_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: retrieval_fraction ",
                                                   config.retrieval_fraction,
                                                   " is out of range; allowed: 0..1"));
  }
  return absl::OkStatus();
}

absl::Status TypeError(std::string_view key, std::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("kv config: key '", std::string(key), "' must be ", std::string(expected)));
}

absl::StatusOr<std::string> GetString(std::string_view key, const toml::node& node) {
  if (!node.is_string()) return TypeError(key, "a string");
  return node.as_string()->get();
}

absl::StatusOr<bool> GetBool(std::string_view key, const toml::node& node) {
  if (!node.is_boolean()) return TypeError(key, "a boolean");
  return *node.value<bool>();
}

absl::StatusOr<int64_t> GetInt(std::string_view key, const toml::node& node) {
  if (!node.is_integer()) return TypeError(key, "an integer");
  return *node.value<int64_t>();
}

// int fields: reject values that would not survive the narrowing, before validation sees a
// wrapped-around number.
absl::StatusOr<int> GetInt32(std::string_view key, const toml::node& node) {
  KVS_ASSIGN_OR_RETURN(const int64_t value, GetInt(key, node));
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: key '", std::string(key),
                                                   "' = ", value, " does not fit in a 32-bit int"));
  }
  return static_cast<int>(value);
}

// The index N of a [<parent>.N] table (a layer or a kv head).
absl::StatusOr<int> TableIndex(std::string_view parent, std::string_view index_text,
                               std::string_view what) {
  int index = 0;
  const char* const text_end = index_text.data() + index_text.size();
  const auto [parsed_end, error] = std::from_chars(index_text.data(), text_end, index);
  if (index_text.empty() || error != std::errc() || parsed_end != text_end || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: [", std::string(parent), ".", std::string(index_text),
                     "] is not a ", std::string(what), " index; allowed: [", std::string(parent),
                     ".N] with N an integer >= 0"));
  }
  return index;
}

// Reads `value` into *k_codec or *v_codec when `key` names one of them; false for any other
// key (left to the caller).
absl::StatusOr<bool> ApplyCodecKey(std::string_view key, const toml::node& value,
                                   const std::string& full_key, std::string* k_codec,
                                   std::string* v_codec) {
  if (key != "k_codec" && key != "v_codec") return false;
  KVS_ASSIGN_OR_RETURN(*(key == "k_codec" ? k_codec : v_codec), GetString(full_key, value));
  return true;
}

// Parses a layer's [head] table: one sub-table per kv head index, each with k_codec and/or
// v_codec.
absl::Status ApplyHeadTable(const std::string& layer_table, int layer_idx, const toml::node& node,
                            KvConfig* config) {
  const std::string parent = absl::StrCat(layer_table, ".head");
  const toml::table* heads = node.as_table();
  if (heads == nullptr)
    return TypeError(parent, absl::StrCat("a table of [", parent, ".H] tables"));
  for (const auto& [index_key, head_node] : *heads) {
    KVS_ASSIGN_OR_RETURN(const int kv_head, TableIndex(parent, index_key.str(), "kv head"));
    const std::string table_name = absl::StrCat(parent, ".", kv_head);
    const toml::table* entry_table = head_node.as_table();
    if (entry_table == nullptr) return TypeError(table_name, "a table");
    KvConfig::HeadCodecs entry{
        .layer_idx = layer_idx, .kv_head = kv_head, .k_codec = "", .v_codec = ""};
    for (const auto& [key, value] : *entry_table) {
      const std::string full_key = absl::StrCat(table_name, ".", std::string(key.str()));
      KVS_ASSIGN_OR_RETURN(const bool codec_key, ApplyCodecKey(key.str(), value, full_key,
                                                               &entry.k_codec, &entry.v_codec));
      if (!codec_key) {
        return absl::InvalidArgumentError(absl::StrCat("kv config: unknown key '", full_key,
                                                       "'; allowed: ", JoinNames(kHeadKeys)));
      }
    }
    config->head_codecs.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

// Parses the [layer] table: one sub-table per layer index, each with k_codec, v_codec and/or
// policy, and [layer.N.head.H] tables for its kv heads.
absl::Status ApplyLayerTable(const toml::node& node, KvConfig* config) {
  const toml::table* layers = node.as_table();
  if (layers == nullptr) return TypeError("layer", "a table of [layer.N] tables");
  for (const auto& [index_key, layer_node] : *layers) {
    KVS_ASSIGN_OR_RETURN(const int layer_idx, TableIndex("layer", index_key.str(), "layer"));
    const std::string table_name = absl::StrCat("layer.", layer_idx);
    const toml::table* entry_table = layer_node.as_table();
    if (entry_table == nullptr) return TypeError(table_name, "a table");
    KvConfig::LayerCodecs entry;
    entry.layer_idx = layer_idx;
    for (const auto& [key, value] : *entry_table) {
      const std::string full_key = absl::StrCat(table_name, ".", std::string(key.str()));
      KVS_ASSIGN_OR_RETURN(const bool codec_key, ApplyCodecKey(key.str(), value, full_key,
                                                               &entry.k_codec, &entry.v_codec));
      if (codec_key) {
        continue;
      } else if (key.str() == "policy") {
        KVS_ASSIGN_OR_RETURN(entry.policy, GetString(full_key, value));
      } else if (key.str() == "head") {
        KVS_RETURN_IF_ERROR(ApplyHeadTable(table_name, layer_idx, value, config));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("kv config: unknown key '", full_key,
                                                       "'; allowed: ", JoinNames(kLayerKeys)));
      }
    }
    // A table that only holds [layer.N.head.H] tables overrides nothing of the layer itself.
    if (!entry.k_codec.empty() || !entry.v_codec.empty() || !entry.policy.empty()) {
      config->layer_codecs.push_back(std::move(entry));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyKey(std::string_view key, const toml::node& node, KvConfig* config) {
  if (key == "layout") {
    KVS_ASSIGN_OR_RETURN(const std::string name, GetString(key, node));
    KVS_ASSIGN_OR_RETURN(config->layout, ParseLayout(name));
  } else if (key == "block_size") {
    KVS_ASSIGN_OR_RETURN(config->block_size, GetInt32(key, node));
  } else if (key == "k_codec") {
    KVS_ASSIGN_OR_RETURN(config->k_codec, GetString(key, node));
  } else if (key == "v_codec") {
    KVS_ASSIGN_OR_RETURN(config->v_codec, GetString(key, node));
  } else if (key == "capacity") {
    KVS_ASSIGN_OR_RETURN(config->capacity, GetInt(key, node));
  } else if (key == "max_sequences") {
    KVS_ASSIGN_OR_RETURN(config->max_sequences, GetInt32(key, node));
  } else if (key == "policy") {
    KVS_ASSIGN_OR_RETURN(config->policy, GetString(key, node));
  } else if (key == "sink_tokens") {
    KVS_ASSIGN_OR_RETURN(config->sink_tokens, GetInt32(key, node));
  } else if (key == "hadamard_keys") {
    KVS_ASSIGN_OR_RETURN(config->hadamard_keys, GetBool(key, node));
  } else if (key == "layer") {
    KVS_RETURN_IF_ERROR(ApplyLayerTable(node, config));
  } else if (key == "recent_tokens") {
    KVS_ASSIGN_OR_RETURN(config->recent_tokens, GetInt32(key, node));
  } else if (key == "profile") {
    KVS_ASSIGN_OR_RETURN(config->profile, GetString(key, node));
  } else if (key == "budget") {
    // An integer is a token count; a string takes every form ParseKvBudget does.
    std::string text;
    if (node.is_integer()) {
      KVS_ASSIGN_OR_RETURN(const int64_t tokens, GetInt(key, node));
      text = absl::StrCat(tokens);
    } else {
      KVS_ASSIGN_OR_RETURN(text, GetString(key, node));
    }
    absl::StatusOr<KvBudget> budget = ParseKvBudget(text);
    if (!budget.ok())
      return absl::InvalidArgumentError(absl::StrCat("kv config: ", budget.status().message()));
    config->budget = *budget;
  } else if (key == "layer_budget") {
    KVS_ASSIGN_OR_RETURN(config->layer_budget, GetString(key, node));
  } else if (key == "evict_step") {
    KVS_ASSIGN_OR_RETURN(config->evict_step, GetInt32(key, node));
  } else if (key == "head_budget") {
    KVS_ASSIGN_OR_RETURN(config->head_budget, GetString(key, node));
  } else if (key == "policy_sinks") {
    KVS_ASSIGN_OR_RETURN(config->policy_sinks, GetInt32(key, node));
  } else if (key == "policy_recent") {
    KVS_ASSIGN_OR_RETURN(config->policy_recent, GetInt32(key, node));
  } else if (key == "observation_window") {
    KVS_ASSIGN_OR_RETURN(config->observation_window, GetInt32(key, node));
  } else if (key == "pool_kernel") {
    KVS_ASSIGN_OR_RETURN(config->pool_kernel, GetInt32(key, node));
  } else if (key == "score_aggregation") {
    KVS_ASSIGN_OR_RETURN(config->score_aggregation, GetString(key, node));
  } else if (key == "positions") {
    KVS_ASSIGN_OR_RETURN(config->positions, GetString(key, node));
  } else if (key == "head_profile") {
    KVS_ASSIGN_OR_RETURN(config->head_profile, GetString(key, node));
  } else if (key == "retrieval_fraction") {
    if (!node.is_floating_point() && !node.is_integer()) return TypeError(key, "a number");
    config->retrieval_fraction = *node.value<double>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("kv config: unknown key '", std::string(key),
                                                   "'; allowed: ", JoinNames(kConfigKeys),
                                                   " (at top level or under [kv])"));
  }
  return absl::OkStatus();
}

// Parses `text`; `source` names it in error messages (a path, or "<string>").
absl::StatusOr<KvConfig> ParseToml(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ":", static_cast<uint64_t>(error.source().begin.line),
                     ":", static_cast<uint64_t>(error.source().begin.column),
                     ": TOML syntax error: ", std::string(error.description())));
  }

  KvConfig config;
  // Each key may be set once, either at top level or under [kv]: two places disagreeing
  // silently would be the same trap as a typo.
  std::vector<std::string> seen;
  auto apply = [&](std::string_view key, const toml::node& node) -> absl::Status {
    if (Contains(seen, key)) {
      return absl::InvalidArgumentError(absl::StrCat("kv config: key '", std::string(key),
                                                     "' is set both at top level and under [kv]"));
    }
    seen.emplace_back(key);
    return ApplyKey(key, node, &config);
  };
  for (const auto& [key, node] : root) {
    if (key.str() == "kv") {
      const toml::table* kv = node.as_table();
      if (kv == nullptr) return TypeError("kv", "a table");
      for (const auto& [kv_key, kv_node] : *kv) KVS_RETURN_IF_ERROR(apply(kv_key.str(), kv_node));
    } else {
      KVS_RETURN_IF_ERROR(apply(key.str(), node));
    }
  }
  KVS_RETURN_IF_ERROR(ValidateKvConfig(config));
  return config;
}

}  // namespace

std::string_view LayoutName(LayoutKind layout) {
  const auto idx = static_cast<size_t>(layout);
  return idx < kLayoutNames.size() ? kLayoutNames[idx] : "invalid";
}

absl::StatusOr<LayoutKind> ParseLayout(std::string_view name) {
  for (size_t idx = 0; idx < kLayoutNames.size(); ++idx) {
    if (kLayoutNames[idx] == name) return static_cast<LayoutKind>(idx);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown layout '", std::string(name), "'; allowed: ", JoinNames(kLayoutNames)));
}

// An override that leaves a codec empty keeps the default; this is where that is decided.
const std::string& KvConfig::KCodecOf(int layer_idx) const {
  for (const LayerCodecs& entry : layer_codecs) {
    if (entry.layer_idx == layer_idx && !entry.k_codec.empty()) return entry.k_codec;
  }
  return k_codec;
}

const std::string& KvConfig::VCodecOf(int layer_idx) const {
  for (const LayerCodecs& entry : layer_codecs) {
    if (entry.layer_idx == layer_idx && !entry.v_codec.empty()) return entry.v_codec;
  }
  return v_codec;
}

const std::string& KvConfig::KCodecOf(int layer_idx, int kv_head) const {
  for (const HeadCodecs& entry : head_codecs) {
    if (entry.layer_idx == layer_idx && entry.kv_head == kv_head && !entry.k_codec.empty()) {
      return entry.k_codec;
    }
  }
  return KCodecOf(layer_idx);
}

const std::string& KvConfig::VCodecOf(int layer_idx, int kv_head) const {
  for (const HeadCodecs& entry : head_codecs) {
    if (entry.layer_idx == layer_idx && entry.kv_head == kv_head && !entry.v_codec.empty()) {
      return entry.v_codec;
    }
  }
  return VCodecOf(layer_idx);
}

const std::string& KvConfig::PolicyOf(int layer_idx) const {
  for (const LayerCodecs& entry : layer_codecs) {
    if (entry.layer_idx == layer_idx && !entry.policy.empty()) return entry.policy;
  }
  return policy;
}

bool KvConfig::PolicyUsed(std::string_view name) const {
  if (policy == name) return true;
  return std::any_of(layer_codecs.begin(), layer_codecs.end(),
                     [&](const LayerCodecs& entry) { return entry.policy == name; });
}

PolicyParams PolicyParamsOf(const KvConfig& config) {
  return PolicyParams{.sink_tokens = config.policy_sinks,
                      .recent_tokens = config.policy_recent,
                      .observation_window = config.observation_window,
                      .pool_kernel = config.pool_kernel};
}

bool KvConfig::evicts() const {
  if (policy != "full") return true;
  return std::any_of(layer_codecs.begin(), layer_codecs.end(), [](const LayerCodecs& entry) {
    return !entry.policy.empty() && entry.policy != "full";
  });
}

// The additions print only when set, so the lines of earlier reports stay comparable.
std::string KvConfig::ToString() const {
  std::string out =
      absl::StrCat("layout=", std::string(LayoutName(layout)),
                   " block_size=", block_size > 0 ? absl::StrCat(block_size) : std::string("auto"),
                   " k=", k_codec, " v=", v_codec, " capacity=", capacity,
                   " max_sequences=", max_sequences, " policy=", policy);
  if (sink_tokens > 0) absl::StrAppend(&out, " sinks=", sink_tokens);
  if (hadamard_keys) absl::StrAppend(&out, " hadamard");
  if (recent_tokens > 0) absl::StrAppend(&out, " recent=", recent_tokens);
  if (!profile.empty()) absl::StrAppend(&out, " profile=", profile);
  if (budget.is_set()) absl::StrAppend(&out, " budget=", budget.ToString());
  if (evicts()) {
    absl::StrAppend(&out, " layer_budget=", layer_budget, " head_budget=", head_budget,
                    " evict_step=", evict_step, " policy_sinks=", policy_sinks,
                    " policy_recent=", policy_recent, " aggregation=", score_aggregation,
                    " positions=", positions);
    if (PolicyUsed("snapkv")) {
      absl::StrAppend(&out, " observation_window=", observation_window,
                      " pool_kernel=", pool_kernel);
    }
    if (PolicyUsed("duo")) {
      absl::StrAppend(&out, " head_profile=", head_profile,
                      " retrieval_fraction=", retrieval_fraction);
    }
  }
  for (const LayerCodecs& entry : layer_codecs) {
    absl::StrAppend(&out, " layer.", entry.layer_idx, "=", KCodecOf(entry.layer_idx), "/",
                    VCodecOf(entry.layer_idx));
    if (!entry.policy.empty()) absl::StrAppend(&out, "/", entry.policy);
  }
  for (const HeadCodecs& entry : head_codecs) {
    absl::StrAppend(&out, " head.", entry.layer_idx, ".", entry.kv_head, "=",
                    KCodecOf(entry.layer_idx, entry.kv_head), "/",
                    VCodecOf(entry.layer_idx, entry.kv_head));
  }
  return out;
}

absl::Status ValidateKvConfig(const KvConfig& config) {
  if (static_cast<size_t>(config.layout) >= kLayoutNames.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: layout value ", static_cast<int>(config.layout),
                     " is invalid; allowed: ", JoinNames(kLayoutNames)));
  }
  if (config.block_size < 0 || config.block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: block_size ", config.block_size,
                                                   " is out of range; allowed: 0 (sized to the "
                                                   "codecs' units) or 1..",
                                                   kMaxBlockSize));
  }
  KVS_RETURN_IF_ERROR(CheckCodecField("k_codec", config.k_codec));
  KVS_RETURN_IF_ERROR(CheckCodecField("v_codec", config.v_codec));
  if (config.capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: capacity ", config.capacity,
                     " is negative; allowed: 0 (resolved by the engine) or a token count"));
  }
  if (config.max_sequences < 1 || config.max_sequences > kMaxSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: max_sequences ", config.max_sequences,
                     " is out of range; allowed: 1..", kMaxSequences));
  }
  KVS_RETURN_IF_ERROR(ValidateSelection(config));
  if (config.sink_tokens < 0 || config.sink_tokens > kMaxSinkTokens) {
    return absl::InvalidArgumentError(absl::StrCat("kv config: sink_tokens ", config.sink_tokens,
                                                   " is out of range; allowed: 0..",
                                                   kMaxSinkTokens));
  }
  if (config.recent_tokens < 0 || config.recent_tokens > kMaxSinkTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv config: recent_tokens ", config.recent_tokens,
                     " is out of range; allowed: 0..", kMaxSinkTokens));
  }
  // layer_idx < num_layers is checked by KvCache::Create, the first place the model is known.
  std::vector<int> seen_layers;
  for (const KvConfig::LayerCodecs& entry : config.layer_codecs) {
    const std::string field = absl::StrCat("layer_codecs[layer ", entry.layer_idx, "]");
    if (entry.layer_idx < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv config: ", field, " has a negative layer index; allowed: layer_idx >= 0"));
    }
    if (std::find(seen_layers.begin(), seen_layers.end(), entry.layer_idx) != seen_layers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv config: layer ", entry.layer_idx, " has two overrides; allowed: one"));
    }
    seen_layers.push_back(entry.layer_idx);
    if (!entry.k_codec.empty()) {
      KVS_RETURN_IF_ERROR(CheckCodecField(absl::StrCat(field, ".k_codec"), entry.k_codec));
    }
    if (!entry.v_codec.empty()) {
      KVS_RETURN_IF_ERROR(CheckCodecField(absl::StrCat(field, ".v_codec"), entry.v_codec));
    }
    if (!entry.policy.empty()) {
      KVS_RETURN_IF_ERROR(CheckName(absl::StrCat(field, ".policy"), entry.policy, PolicyNames()));
    }
  }
  // kv_head < num_kv_heads, too, is checked by KvCache::Create.
  std::vector<std::pair<int, int>> seen_heads;
  for (const KvConfig::HeadCodecs& entry : config.head_codecs) {
    const std::string field =
        absl::StrCat("head_codecs[layer ", entry.layer_idx, " head ", entry.kv_head, "]");
    if (entry.layer_idx < 0 || entry.kv_head < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv config: ", field, " has a negative index; allowed: layer and kv head >= 0"));
    }
    const std::pair<int, int> key(entry.layer_idx, entry.kv_head);
    if (std::find(seen_heads.begin(), seen_heads.end(), key) != seen_heads.end()) {
      return absl::InvalidArgumentError(absl::StrCat("kv config: kv head ", entry.kv_head,
                                                     " of layer ", entry.layer_idx,
                                                     " has two overrides; allowed: one"));
    }
    seen_heads.push_back(key);
    if (IsLatentCodecName(config.KCodecOf(entry.layer_idx))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv config: ", field, ": layer ", entry.layer_idx, " is latent ('",
          config.KCodecOf(entry.layer_idx),
          "'), one joint basis for all its kv heads; allowed: head overrides in layers whose "
          "codecs are not latent"));
    }
    if (entry.k_codec.empty() && entry.v_codec.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv config: ", field, " names no codec; allowed: a k_codec, a v_codec or both"));
    }
    for (const auto& [side, name] :
         {std::pair("k_codec", &entry.k_codec), std::pair("v_codec", &entry.v_codec)}) {
      if (name->empty()) continue;
      KVS_RETURN_IF_ERROR(CheckCodecField(absl::StrCat(field, ".", side), *name));
      if (IsLatentCodecName(*name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kv config: ", field, ".", side, " '", *name,
            "': a latent codec has one joint basis per layer; allowed: latent codecs per "
            "layer only (--layer-codec)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KvConfig> ParseKvConfigToml(std::string_view toml_text) {
  return ParseToml(toml_text, "<string>");
}

absl::StatusOr<KvConfig> LoadKvConfigFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open kv config file '", path, "'"));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad())
    return absl::DataLossError(absl::StrCat("cannot read kv config file '", path, "'"));
  absl::StatusOr<KvConfig> config = ParseToml(text.str(), path);
  if (!config.ok() && !absl::StrContains(config.status().message(), path)) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace kvstack
