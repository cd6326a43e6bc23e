// Next-token sampling: greedy, or temperature + top-k + top-p over a softmax, drawn from a
// seeded mt19937_64 so that the same seed gives the same tokens on every platform.
#include "kvstack/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstack/check.h"

namespace kvstack {

absl::StatusOr<Sampler> Sampler::Create(const SamplerOptions& options) {
  // Written as !(in range) so that NaN fails too.
  if (!(std::isfinite(options.temperature) && options.temperature >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("sampler: temperature is ", options.temperature,
                                                   "; it must be finite and >= 0 (0 = greedy)"));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: top_k is ", options.top_k, "; it must be >= 0 (0 = all tokens)"));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: top_p is ", options.top_p, "; it must be in (0, 1]"));
  }
  return Sampler(options);
}

TokenId Sampler::Sample(std::span<const float> logits) {
  KVS_CHECK(!logits.empty());
  const int vocab_size = static_cast<int>(logits.size());
  // max_element returns the first maximum: the lowest id on ties.
  const TokenId argmax =
      static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (options_.temperature == 0.0f) return argmax;

  // Candidates ordered by logit descending, lowest id first on ties, so that top-k and top-p
  // cut a well-defined prefix. Sorting is only needed when something is cut.
  std::vector<std::pair<float, TokenId>> candidates(vocab_size);  // (logit, id)
  for (TokenId id = 0; id < vocab_size; ++id) candidates[id] = {logits[id], id};
  auto more_likely = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int num_kept = vocab_size;
  if (options_.top_k > 0 && options_.top_k < vocab_size) {
    num_kept = options_.top_k;
    std::partial_sort(candidates.begin(), candidates.begin() + num_kept, candidates.end(),
                      more_likely);
    candidates.resize(num_kept);
  } else if (options_.top_p < 1.0f) {
    std::sort(candidates.begin(), candidates.end(), more_likely);
  }

  // Softmax of logit / T. Subtracting the maximum before dividing keeps every exponent <= 0,
  // so a tiny temperature gives 0 for the others instead of inf - inf.
  const float max_logit = logits[argmax];
  const double inv_temperature = 1.0 / options_.temperature;
  std::vector<double> weights(num_kept);
  double total = 0.0;
  for (int idx = 0; idx < num_kept; ++idx) {
    weights[idx] = std::exp((candidates[idx].first - max_logit) * inv_temperature);
    total += weights[idx];
  }

  if (options_.top_p < 1.0f) {
    // The smallest prefix whose probability mass reaches top_p (at least one token).
    const double target = options_.top_p * total;
    double mass = 0.0;
    int num_nucleus = 0;
    while (num_nucleus < num_kept) {
      mass += weights[num_nucleus++];
      if (mass >= target) break;
    }
    num_kept = num_nucleus;
    total = mass;
  }

  // A 53-bit uniform in [0, 1) from the raw generator output: std::uniform_real_distribution's
  // algorithm differs between standard libraries, this does not.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double threshold = u * total;
  double cumulative = 0.0;
  int last_possible = 0;
  for (int idx = 0; idx < num_kept; ++idx) {
    if (weights[idx] == 0.0) continue;
    cumulative += weights[idx];
    last_possible = idx;
    if (threshold < cumulative) return candidates[idx].second;
  }
  // Rounding can leave u * total at the very top; the last token with any weight gets it.
  return candidates[last_possible].second;
}

}  // namespace kvstack
