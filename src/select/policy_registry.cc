// The policy registry: the one place a policy is named and its parameters checked, so the
// CLI, TOML files and the sweep all accept exactly the same names with the same errors.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvstack/policy.h"
#include "select/policy_factories.h"

namespace kvstack {
namespace {

using select_internal::MakeDuoPolicy;
using select_internal::MakeFullPolicy;
using select_internal::MakeH2oPolicy;
using select_internal::MakeSnapKvPolicy;
using select_internal::MakeStreamingPolicy;
using select_internal::MakeTovaPolicy;
using select_internal::MakeWindowPolicy;

struct PolicyEntry {
  std::string_view name;
  std::unique_ptr<SelectionPolicy> (*make)(const PolicyParams&);
};

// Order is the stable order PolicyNames reports: the baseline, then by what they read.
constexpr PolicyEntry kPolicies[] = {
    {"full", [](const PolicyParams&) { return MakeFullPolicy(); }},
    {"window", [](const PolicyParams&) { return MakeWindowPolicy(); }},
    {"streaming", MakeStreamingPolicy},
    {"h2o", MakeH2oPolicy},
    {"tova", MakeTovaPolicy},
    {"snapkv", MakeSnapKvPolicy},
    {"duo", MakeDuoPolicy},
};

// Every field is checked whichever policy is named: a bad value is a mistake even where this
// policy ignores it, and the same params may be reused with another policy in a sweep.
absl::Status ValidateParams(std::string_view name, const PolicyParams& params) {
  auto bad = [&](std::string_view field, std::string_view allowed, int got) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", std::string(name),
                                                   "': ", std::string(field), " must be ",
                                                   std::string(allowed), " (got ", got, ")"));
  };
  if (params.sink_tokens < 0) return bad("sink_tokens", ">= 0", params.sink_tokens);
  if (params.recent_tokens < -1) {
    return bad("recent_tokens", ">= 0, or -1 for the policy's default", params.recent_tokens);
  }
  if (params.observation_window < 1) {
    return bad("observation_window", ">= 1", params.observation_window);
  }
  if (params.pool_kernel < 1 || params.pool_kernel % 2 == 0) {
    return bad("pool_kernel", "odd and >= 1", params.pool_kernel);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreatePolicy(std::string_view name,
                                                              const PolicyParams& params) {
  for (const PolicyEntry& entry : kPolicies) {
    if (entry.name != name) continue;
    KVS_RETURN_IF_ERROR(ValidateParams(name, params));
    return entry.make(params);
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
