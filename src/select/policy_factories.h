// Constructors of the concrete policies, for the registry (policy_registry.cc), which is the
// only place a policy is named and its parameters validated. Each receives valid params.
#pragma once

#include <memory>

#include "kvstack/policy.h"

namespace kvstack::select_internal {

// Position policies (position_policies.cc).
std::unique_ptr<SelectionPolicy> MakeFullPolicy();
std::unique_ptr<SelectionPolicy> MakeWindowPolicy();
std::unique_ptr<SelectionPolicy> MakeStreamingPolicy(const PolicyParams& params);
std::unique_ptr<SelectionPolicy> MakeDuoPolicy(const PolicyParams& params);

// Score policies (score_policies.cc).
std::unique_ptr<SelectionPolicy> MakeH2oPolicy(const PolicyParams& params);
std::unique_ptr<SelectionPolicy> MakeTovaPolicy(const PolicyParams& params);
std::unique_ptr<SelectionPolicy> MakeSnapKvPolicy(const PolicyParams& params);

}  // namespace kvstack::select_internal
