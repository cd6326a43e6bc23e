// What the selection suites share: creating a policy that must exist, and running Select on
// hand-made scores with positions 0..n-1.
#pragma once

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstack/policy.h"

namespace kvstack::select_test {

inline std::vector<int> Iota(int n, int first = 0) {
  std::vector<int> out(n);
  std::iota(out.begin(), out.end(), first);
  return out;
}

// The policy `name`; a failure to create it fails the test and returns null.
inline std::unique_ptr<SelectionPolicy> MustCreate(const std::string& name,
                                                   const PolicyParams& params = {}) {
  auto policy = CreatePolicy(name, params);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return policy.ok() ? std::move(*policy) : nullptr;
}

// Select over n tokens at positions 0..n-1; `scores` gives n (empty for position policies,
// whose n is then `num_tokens`).
inline std::vector<int> Keep(const SelectionPolicy& policy, const std::vector<float>& scores,
                             int budget, int num_tokens = -1) {
  const int n = num_tokens >= 0 ? num_tokens : static_cast<int>(scores.size());
  const std::vector<int> positions = Iota(n);
  std::vector<int> keep = {-7};  // stale content must be replaced
  policy.Select({.positions = positions, .scores = scores, .budget = budget}, &keep);
  return keep;
}

}  // namespace kvstack::select_test
