// KeepWholeUnits: a policy's per-token keep list rounded to whole encoded units.
#include "select/whole_units.h"

#include <algorithm>
#include <numeric>

#include "kvstack/check.h"

namespace kvstack {

std::vector<int> KeepWholeUnits(std::span<const int> keep, int encoded_end, int period,
                                int num_sinks) {
  KVS_CHECK(period >= 1 && encoded_end >= 0 && encoded_end % period == 0);
  const int num_units = encoded_end / period;
  std::vector<int> kept_in_unit(num_units, 0);
  const auto first_f32 = std::lower_bound(keep.begin(), keep.end(), encoded_end);
  for (auto it = keep.begin(); it != first_f32; ++it) ++kept_in_unit[*it / period];
  const bool already_whole = std::all_of(kept_in_unit.begin(), kept_in_unit.end(),
                                         [&](int n) { return n == 0 || n == period; });
  if (already_whole) return std::vector<int>(keep.begin(), keep.end());

  const int budget = static_cast<int>(keep.size());
  const int num_f32 = static_cast<int>(keep.end() - first_f32);
  const int sink_units = std::min(num_units, (num_sinks + period - 1) / period);
  int used = num_f32 + sink_units * period;
  if (used > budget) return std::vector<int>(keep.begin(), keep.end());

  std::vector<bool> chosen(num_units, false);
  std::fill(chosen.begin(), chosen.begin() + sink_units, true);
  std::vector<int> candidates(num_units - sink_units);
  std::iota(candidates.begin(), candidates.end(), sink_units);
  std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
    return kept_in_unit[a] != kept_in_unit[b] ? kept_in_unit[a] > kept_in_unit[b] : a > b;
  });
  for (const int u : candidates) {
    if (kept_in_unit[u] == 0 || used + period > budget) break;
    chosen[u] = true;
    used += period;
  }

  std::vector<int> result;
  result.reserve(used);
  for (int u = 0; u < num_units; ++u) {
    if (!chosen[u]) continue;
    for (int t = u * period; t < (u + 1) * period; ++t) result.push_back(t);
  }
  result.insert(result.end(), first_f32, keep.end());
  return result;
}

}  // namespace kvstack
