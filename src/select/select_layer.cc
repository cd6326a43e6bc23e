// Selection for all kv heads of one layer, with the layer's budget split uniformly or the
// Ada-KV way. Ada-KV's observation: heads differ in how concentrated their attention is, so a
// fixed per-head budget wastes tokens on concentrated heads and starves spread-out ones;
// ranking every head's tokens on one scale (scores normalised per head to sum 1) and taking
// the top of the union gives each head what its own attention asks for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvstack/check.h"
#include "kvstack/policy.h"
#include "select/keep_top.h"

namespace kvstack {
namespace {

// The rank of one unprotected token competing for a layer's shared budget: its normalised
// score and position (RankKey), then the lower head on a full tie, so the order is total.
struct LayerKey {
  uint64_t rank;
  uint32_t head_order;  // ~head
  auto operator<=>(const LayerKey&) const = default;
};

void SelectAdaptive(const SelectionPolicy& policy, std::span<const SelectionInput> heads,
                    int budget, std::vector<std::vector<int>>* keep) {
  KVS_CHECK(policy.needs_scores());
  const int num_heads = static_cast<int>(heads.size());
  // Per head: what it protects, its ranking (each head its own scratch: all rankings are read
  // twice, once to find the threshold and once to keep) and the scale normalising it to sum 1.
  thread_local std::vector<std::vector<float>> scratch;
  std::vector<ProtectedTokens> protected_tokens(num_heads);
  std::vector<std::span<const float>> rankings(num_heads);
  std::vector<float> scales(num_heads, 1.0f);
  if (scratch.size() < heads.size()) scratch.resize(heads.size());
  int64_t pool = static_cast<int64_t>(num_heads) * budget;
  size_t num_candidates = 0;
  for (int h = 0; h < num_heads; ++h) {
    const SelectionInput& input = heads[h];
    const int n = static_cast<int>(input.positions.size());
    KVS_CHECK(static_cast<int>(input.scores.size()) == n);
    const ProtectedTokens p = policy.Protected(n, budget);
    protected_tokens[h] = p;
    pool -= p.total();
    if (n == p.total()) continue;
    num_candidates += n - p.total();
    rankings[h] = policy.RankingScores(input, &scratch[h]);
    double sum = 0;
    for (float s : rankings[h]) sum += std::isnan(s) ? 0.0 : s;
    if (sum > 0 && std::isfinite(sum)) scales[h] = static_cast<float>(1.0 / sum);
  }
  KVS_CHECK(pool >= 0);
  auto key_of = [&](int h, int i) {
    return LayerKey{
        .rank = select_internal::RankKey(rankings[h][i] * scales[h], heads[h].positions[i]),
        .head_order = ~static_cast<uint32_t>(h)};
  };
  // Every candidate above the largest dropped one is kept; scanning each head's candidates
  // in logical order lays its winners out ascending without a sort.
  const size_t wanted = static_cast<size_t>(pool);
  const bool keep_all = wanted >= num_candidates;
  LayerKey largest_dropped = {};
  if (!keep_all) {
    largest_dropped =
        select_internal::LargestDropped<LayerKey>(num_candidates, wanted, [&](const auto& visit) {
          for (int h = 0; h < num_heads; ++h) {
            const int n = static_cast<int>(heads[h].positions.size());
            const ProtectedTokens p = protected_tokens[h];
            for (int i = p.sinks; i < n - p.recent; ++i) visit(key_of(h, i));
          }
        });
  }
  for (int h = 0; h < num_heads; ++h) {
    const int n = static_cast<int>(heads[h].positions.size());
    const ProtectedTokens p = protected_tokens[h];
    std::vector<int>& out = (*keep)[h];
    out.resize(p.sinks);
    std::iota(out.begin(), out.end(), 0);
    for (int i = p.sinks; i < n - p.recent; ++i) {
      if (keep_all || largest_dropped < key_of(h, i)) out.push_back(i);
    }
    for (int i = n - p.recent; i < n; ++i) out.push_back(i);
  }
}

}  // namespace

absl::StatusOr<HeadSplit> ParseHeadSplit(std::string_view name) {
  if (name == "uniform") return HeadSplit::kUniform;
  if (name == "adaptive") return HeadSplit::kAdaptive;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown head split '", std::string(name), "'; allowed: uniform, adaptive"));
}

std::string_view HeadSplitName(HeadSplit split) {
  switch (split) {
    case HeadSplit::kUniform:
      return "uniform";
    case HeadSplit::kAdaptive:
      return "adaptive";
  }
  KVS_CHECK(false);
  return {};
}

void SelectLayer(const SelectionPolicy& policy, HeadSplit split,
                 std::span<const SelectionInput> heads, int budget,
                 std::vector<std::vector<int>>* keep) {
  KVS_CHECK(budget >= 0);
  keep->resize(heads.size());
  if (split == HeadSplit::kAdaptive) {
    SelectAdaptive(policy, heads, budget, keep);
    return;
  }
  for (size_t h = 0; h < heads.size(); ++h) {
    SelectionInput input = heads[h];
    input.budget = budget;
    policy.Select(input, &(*keep)[h]);
  }
}

}  // namespace kvstack
