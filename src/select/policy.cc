// Selection policies and the by-name factory. "full" is the baseline every other policy is
// measured against: it keeps every token, so it needs no scores and its budget must cover the
// whole sequence (the engine sizes the cache so that it does).
#include "kvstack/policy.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvstack/check.h"

namespace kvstack {
namespace {

class FullPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "full"; }
  bool needs_scores() const override { return false; }
  void Select(const SelectionInput& input, std::vector<int>* keep) const override {
    const int num_tokens = static_cast<int>(input.positions.size());
    // Keeping everything is the policy's contract; a smaller budget means the caller sized the
    // cache for some other policy.
    KVS_CHECK(input.budget >= num_tokens);
    keep->resize(num_tokens);
    std::iota(keep->begin(), keep->end(), 0);
  }
};

struct PolicyEntry {
  std::string_view name;
  std::unique_ptr<SelectionPolicy> (*make)();
};

// The registry: the one place a policy is named. Order is the stable order PolicyNames reports.
constexpr PolicyEntry kPolicies[] = {
    {"full", []() -> std::unique_ptr<SelectionPolicy> { return std::make_unique<FullPolicy>(); }},
};

}  // namespace

absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreatePolicy(std::string_view name) {
  for (const PolicyEntry& entry : kPolicies) {
    if (entry.name == name) return entry.make();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown policy '", std::string(name), "'; allowed: ", absl::StrJoin(PolicyNames(), ", ")));
}

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const PolicyEntry& entry : kPolicies) names.emplace_back(entry.name);
  return names;
}

}  // namespace kvstack
