// How a model's token budget is spread over its layers. PyramidKV observed that attention
// in the lower layers is spread over many tokens and in the upper layers concentrated on a
// few, so it gives the lower layers more of the same total. The schedule is computed in
// integers (no floating point), so budgets are exact, reproducible and sum to the total.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvstack/check.h"
#include "kvstack/policy.h"

namespace kvstack {
namespace {

// PyramidKV's beta: the top layer keeps average / beta tokens (before min_budget).
constexpr int kPyramidBeta = 20;

}  // namespace

absl::StatusOr<LayerSchedule> ParseLayerSchedule(std::string_view name) {
  if (name == "uniform") return LayerSchedule::kUniform;
  if (name == "pyramid") return LayerSchedule::kPyramid;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown layer schedule '", std::string(name), "'; allowed: uniform, pyramid"));
}

std::string_view LayerScheduleName(LayerSchedule schedule) {
  switch (schedule) {
    case LayerSchedule::kUniform:
      return "uniform";
    case LayerSchedule::kPyramid:
      return "pyramid";
  }
  KVS_CHECK(false);
  return {};
}

std::vector<int> LayerBudgets(int num_layers, int average, LayerSchedule schedule, int min_budget) {
  KVS_CHECK(num_layers >= 1 && average >= 1 && min_budget >= 0);
  std::vector<int> budgets(num_layers, average);
  if (schedule == LayerSchedule::kUniform || num_layers == 1) return budgets;

  const int64_t top = std::min(average, std::max(min_budget, average / kPyramidBeta));
  const int64_t bottom = 2 * static_cast<int64_t>(average) - top;
  const int64_t span = bottom - top;
  const int64_t steps = num_layers - 1;
  // Layer l's exact budget is bottom - l * span / steps. Take its floor and remember its
  // fractional part as a numerator over `steps`.
  std::vector<int64_t> fraction(num_layers, 0);
  int64_t total = 0;
  for (int l = 0; l < num_layers; ++l) {
    const int64_t drop = l * span;
    const int64_t whole = drop / steps;
    const int64_t rem = drop % steps;
    budgets[l] = static_cast<int>(bottom - whole - (rem != 0 ? 1 : 0));
    fraction[l] = rem != 0 ? steps - rem : 0;
    total += budgets[l];
  }
  // The fractional parts add up to exactly the remainder, so as many layers have one; giving
  // the remainder to the largest parts (the lower layer on equal parts) keeps the budgets
  // non-increasing and each within one token of the line.
  std::vector<int> order(num_layers);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return fraction[a] > fraction[b]; });
  const int64_t remainder = static_cast<int64_t>(num_layers) * average - total;
  KVS_CHECK(remainder >= 0 && remainder <= num_layers);
  for (int64_t i = 0; i < remainder; ++i) ++budgets[order[i]];
  return budgets;
}

}  // namespace kvstack
