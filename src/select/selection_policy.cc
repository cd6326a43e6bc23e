// SelectionPolicy's shared answer (Select) and the protected-plus-top routine behind it. The
// engine calls it for every kv head whenever a sequence is over its budget, inside the decode
// step whose time scoring and eviction are measured against, so it is O(n) on average (a
// partial selection and one pass) and, once warm, allocates nothing beyond *keep.
#include <algorithm>
#include <numeric>

#include "kvstack/check.h"
#include "kvstack/policy.h"
#include "select/keep_top.h"

namespace kvstack {
namespace select_internal {

ProtectedTokens ClampProtected(int num_tokens, int budget, int sink_tokens, int recent_tokens) {
  KVS_DCHECK(sink_tokens >= 0 && recent_tokens >= 0 && budget >= 0);
  const int limit = std::min(num_tokens, budget);
  ProtectedTokens p;
  p.sinks = std::min(sink_tokens, limit);
  p.recent = std::min(recent_tokens, limit - p.sinks);
  return p;
}

void KeepProtectedAndTop(int num_tokens, int budget, ProtectedTokens protected_tokens,
                         std::span<const float> ranking, std::vector<int>* keep) {
  const int sinks = protected_tokens.sinks;
  const int recent = protected_tokens.recent;
  KVS_CHECK(sinks >= 0 && recent >= 0 && protected_tokens.total() <= budget && budget < num_tokens);
  const int wanted = budget - protected_tokens.total();
  const int end = num_tokens - recent;  // candidates are [sinks, end)
  const int num_candidates = end - sinks;
  keep->resize(sinks);
  std::iota(keep->begin(), keep->end(), 0);
  if (wanted > 0) {
    KVS_CHECK(static_cast<int>(ranking.size()) == num_tokens);
    // The steady state evicts a token or a few from thousands, so sorting what is kept would
    // dominate: find the largest dropped key instead, then keep every candidate above it in
    // one pass in logical order. Keys are distinct, so exactly `wanted` are.
    const uint64_t largest_dropped =
        LargestDropped<uint64_t>(num_candidates, wanted, [&](const auto& visit) {
          for (int i = sinks; i < end; ++i) visit(RankKey(ranking[i], i));
        });
    // Branch-free append (whether a token stays is unpredictable): every candidate is written,
    // the cursor advances only past kept ones; one spare slot takes the last write.
    keep->resize(sinks + wanted + 1);
    int* out = keep->data() + sinks;
    for (int i = sinks; i < end; ++i) {
      *out = i;
      out += RankKey(ranking[i], i) > largest_dropped ? 1 : 0;
    }
    KVS_DCHECK(out == keep->data() + sinks + wanted);
    keep->resize(sinks + wanted);
  }
  for (int i = end; i < num_tokens; ++i) keep->push_back(i);
}

}  // namespace select_internal

void SelectionPolicy::Select(const SelectionInput& input, std::vector<int>* keep) const {
  const int num_tokens = static_cast<int>(input.positions.size());
  KVS_CHECK(input.budget >= 0);
  KVS_CHECK(!needs_scores() || static_cast<int>(input.scores.size()) == num_tokens);
  if (num_tokens <= input.budget) {
    keep->resize(num_tokens);
    std::iota(keep->begin(), keep->end(), 0);
    return;
  }
  const ProtectedTokens protected_tokens = Protected(num_tokens, input.budget);
  std::span<const float> ranking;
  // Scratch per thread: Select is const and called from many threads, and a vector per call
  // would allocate in every decode step.
  thread_local std::vector<float> scratch;
  if (protected_tokens.total() < input.budget) ranking = RankingScores(input, &scratch);
  select_internal::KeepProtectedAndTop(num_tokens, input.budget, protected_tokens, ranking, keep);
}

std::span<const float> SelectionPolicy::RankingScores(const SelectionInput& input,
                                                      std::vector<float>* scratch) const {
  // Position policies protect their whole budget, so nothing ever asks them to rank.
  KVS_CHECK(needs_scores());
  return input.scores;
}

}  // namespace kvstack
