// The sweep's grid and output plumbing, shared by both of its modes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstack/codec.h"
#include "represent/lowrank_codec.h"
#include "sweep.h"

namespace kvstack::cli {

namespace {

// The codec a --lowrank entry names: "lowrank-" + entry unless it is already a profiled codec's
// name (lowrank-... or latent-...).
absl::StatusOr<std::string> LowRankRowCodec(const std::string& entry) {
  const std::string name = IsLowRankCodecName(entry) ? entry : "lowrank-" + entry;
  if (absl::Status status = CheckLowRankCodecName(name); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--lowrank '%s': %s (allowed: r<rank>[-int4], e<percent>[-int4], or a full "
                        "lowrank-... or latent-r<rank>[-int4] name)",
                        entry, status.message()));
  }
  return name;
}

}  // namespace

absl::StatusOr<std::vector<KvConfig>> BuildGrid(const SweepFlags& flags, const KvConfig& base) {
  std::vector<std::string> k_codecs = flags.k_codecs;
  std::vector<std::string> v_codecs = flags.v_codecs;
  if (k_codecs.empty()) k_codecs.push_back(base.k_codec);
  if (v_codecs.empty()) v_codecs.push_back(base.v_codec);
  std::vector<std::pair<std::string, std::string>> codecs;
  if (flags.pairs) {
    if (k_codecs.size() != v_codecs.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--pairs zips --k-codec and --v-codec, which must then have the same length; got %d "
          "key and %d value codecs",
          k_codecs.size(), v_codecs.size()));
    }
    for (size_t i = 0; i < k_codecs.size(); ++i) codecs.emplace_back(k_codecs[i], v_codecs[i]);
  } else {
    for (const std::string& k : k_codecs) {
      for (const std::string& v : v_codecs) codecs.emplace_back(k, v);
    }
  }
  for (const std::string& entry : flags.lowrank) {
    KVS_ASSIGN_OR_RETURN(const std::string name, LowRankRowCodec(entry));
    codecs.emplace_back(name, name);
  }
  std::vector<KvBudget> budgets;
  for (const std::string& text : flags.budgets) {
    absl::StatusOr<KvBudget> budget = ParseKvBudget(text);
    if (!budget.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--budget: ", budget.status().message()));
    }
    budgets.push_back(*budget);
  }
  if (budgets.empty()) budgets.push_back(base.budget);
  std::vector<std::string> policies = flags.policies;
  if (policies.empty()) policies.push_back(base.policy);
  std::vector<int> recents = flags.recents;
  if (recents.empty()) recents.push_back(base.recent_tokens);

  std::vector<KvConfig> grid;
  for (const auto& [k, v] : codecs) {
    for (const int recent : recents) {
      for (const std::string& policy : policies) {
        const bool full = policy == "full";
        if (!full && !budgets.front().is_set()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--policy ", policy, " evicts and needs --budget (e.g. --budget 64,128,256)"));
        }
        for (const KvBudget& budget : budgets) {
          KvConfig config = base;
          config.k_codec = k;
          config.v_codec = v;
          config.recent_tokens = recent;
          config.policy = policy;
          config.budget = full ? KvBudget{} : budget;
          grid.push_back(std::move(config));
          if (full) break;  // one full-cache row per codec pair and window
        }
      }
    }
  }
  return grid;
}

absl::StatusOr<std::pair<std::string, std::string>> ParseProbeHeads(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string k = spec.substr(0, colon);
  const std::string v = colon == std::string::npos ? k : spec.substr(colon + 1);
  if (k.empty() || v.empty() || v.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--probe-heads '%s': expected K:V (key and value codec) or one codec for both, e.g. "
        "int8 or kivi4-g64:int4-g64",
        spec));
  }
  for (const std::string& name : {k, v}) {
    if (absl::Status status = CheckCodecName(name); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--probe-heads '%s': %s", spec, status.message()));
    }
  }
  return std::pair(k, v);
}

namespace {

// `config` with kv head (layer_idx, kv_head) stored as `codecs`, replacing any override the
// config has for that head.
void OverrideHead(int layer_idx, int kv_head, const std::pair<std::string, std::string>& codecs,
                  KvConfig* config) {
  std::erase_if(config->head_codecs, [&](const KvConfig::HeadCodecs& head) {
    return head.layer_idx == layer_idx && head.kv_head == kv_head;
  });
  config->head_codecs.push_back({.layer_idx = layer_idx,
                                 .kv_head = kv_head,
                                 .k_codec = codecs.first,
                                 .v_codec = codecs.second});
}

}  // namespace

std::vector<KvConfig> HeadProbeRows(const KvConfig& first,
                                    const std::pair<std::string, std::string>& codecs,
                                    int num_layers, int num_kv_heads) {
  std::vector<KvConfig> rows;
  for (int layer_idx = 0; layer_idx < num_layers; ++layer_idx) {
    for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
      KvConfig config = first;
      OverrideHead(layer_idx, kv_head, codecs, &config);
      rows.push_back(std::move(config));
    }
  }
  return rows;
}

std::vector<int> RankProbes(std::span<const double> probe_dppl) {
  std::vector<int> ranked(probe_dppl.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int a, int b) { return probe_dppl[a] < probe_dppl[b]; });
  return ranked;
}

std::optional<int> FittingMixCount(std::span<const double> probe_dppl,
                                   std::span<const MixBudget> budgets) {
  const std::vector<int> ranked = RankProbes(probe_dppl);
  const int num_probes = static_cast<int>(ranked.size());
  if (budgets.empty() || num_probes == 0) return std::nullopt;
  // Whether the probes' codecs store more than the first row's: then more heads cost more
  // memory and (the probes' premise) lose less, so the most that fit is the most accurate.
  const MixBudget& lead = budgets.front();
  const bool probes_larger = lead.probe_bits[ranked[0]] >= lead.first_bits;
  // Each budget's estimate for the mix of `count` heads, grown one head at a time.
  std::vector<double> estimates;
  for (const MixBudget& budget : budgets) estimates.push_back(budget.first_bits);
  std::optional<int> fitting;
  for (int count = 0;; ++count) {
    bool fits = true;
    for (size_t b = 0; b < budgets.size(); ++b) {
      fits = fits && WithinBitBound(estimates[b], budgets[b].max_bits);
    }
    if (fits) {
      fitting = count;
      if (!probes_larger) break;  // the fewest heads in the smaller codecs
    }
    if (count == num_probes) break;
    for (size_t b = 0; b < budgets.size(); ++b) {
      estimates[b] += budgets[b].probe_bits[ranked[count]] - budgets[b].first_bits;
    }
  }
  return fitting;
}

KvConfig HeadMix(const KvConfig& first, const std::pair<std::string, std::string>& codecs,
                 std::span<const int> heads, int num_kv_heads) {
  KvConfig config = first;
  for (const int head : heads) {
    OverrideHead(head / num_kv_heads, head % num_kv_heads, codecs, &config);
  }
  return config;
}

std::vector<KvConfig> HeadMixRows(const KvConfig& first,
                                  const std::pair<std::string, std::string>& codecs,
                                  std::span<const double> probe_dppl, int num_kv_heads,
                                  std::span<const int> counts) {
  const std::vector<int> ranked = RankProbes(probe_dppl);
  std::vector<KvConfig> rows;
  for (const int count : counts) {
    rows.push_back(HeadMix(first, codecs, std::span(ranked).first(count), num_kv_heads));
  }
  return rows;
}

absl::StatusOr<std::vector<GreedyRound>> GreedyMixRounds(
    const KvConfig& first, const std::pair<std::string, std::string>& codecs,
    std::span<const double> probe_dppl, int num_kv_heads, int num_heads,
    const EvaluateMixFn& evaluate) {
  const int num_probes = static_cast<int>(probe_dppl.size());
  std::vector<int> chosen = {RankProbes(probe_dppl).front()};
  std::vector<GreedyRound> rounds;
  while (static_cast<int>(chosen.size()) < num_heads) {
    GreedyRound round;
    round.candidate_dppl.assign(num_probes, std::numeric_limits<double>::quiet_NaN());
    std::vector<int> heads = chosen;
    heads.push_back(-1);
    for (int head = 0; head < num_probes; ++head) {
      if (absl::c_linear_search(chosen, head)) continue;
      heads.back() = head;
      KvConfig config = HeadMix(first, codecs, heads, num_kv_heads);
      KVS_ASSIGN_OR_RETURN(ConfigEvaluation mix, evaluate(config));
      round.candidate_dppl[head] = mix.delta_ppl_pct;
      if (round.head < 0 || mix.delta_ppl_pct < round.mix.delta_ppl_pct) {
        round.head = head;
        round.config = std::move(config);
        round.mix = std::move(mix);
      }
    }
    chosen.push_back(round.head);
    rounds.push_back(std::move(round));
  }
  return rounds;
}

std::string SweepLabel(const KvConfig& config) {
  std::string label = absl::StrCat(config.k_codec, " / ", config.v_codec);
  // The overrides apply to every row that has them; the base config line names them all.
  if (config.head_codecs.size() <= 2) {
    for (const KvConfig::HeadCodecs& head : config.head_codecs) {
      absl::StrAppend(&label, " head.", head.layer_idx, ".", head.kv_head, "=",
                      config.KCodecOf(head.layer_idx, head.kv_head), "/",
                      config.VCodecOf(head.layer_idx, head.kv_head));
    }
  } else {
    absl::StrAppend(&label, " +", config.head_codecs.size(), " head overrides");
  }
  if (std::any_of(config.layer_codecs.begin(), config.layer_codecs.end(), [](const auto& layer) {
        return !layer.k_codec.empty() || !layer.v_codec.empty();
      })) {
    absl::StrAppend(&label, " +layer overrides");
  }
  if (config.recent_tokens > 0) absl::StrAppend(&label, " recent=", config.recent_tokens);
  if (config.evicts()) absl::StrAppend(&label, " ", config.policy, "@", config.budget.ToString());
  return label;
}

absl::Status CheckOutputPath(const std::string& flag, const std::string& path) {
  if (path.empty() || path == "-") return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s '%s': directory '%s' does not exist", flag, path, parent.string()));
  }
  return absl::OkStatus();
}

absl::Status WriteOutput(const std::string& flag, const std::string& path,
                         const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return absl::OkStatus();
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrFormat("%s: cannot write '%s'", flag, path));
  return absl::OkStatus();
}

}  // namespace kvstack::cli
