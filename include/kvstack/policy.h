// SelectionPolicy: which keys and values a sequence keeps (layer 1, information). A policy
// sees the positions (and, for score-based policies, accumulated attention scores) of one
// (layer, kv-head) and answers which logical tokens to keep under a budget. It orders and
// picks; it never frees memory itself — the cache does, from the answer.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

struct SelectionInput {
  std::span<const int> positions;  // [num_tokens] position of each logical token, oldest first
  std::span<const float> scores;   // [num_tokens] accumulated attention mass, or empty
  int budget = 0;                  // tokens to keep at most
};

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Whether Select needs `scores`; kernels accumulate them only when some policy does.
  virtual bool needs_scores() const = 0;
  // Writes the logical indices to keep, ascending, at most input.budget of them.
  virtual void Select(const SelectionInput& input, std::vector<int>* keep) const = 0;
};

// "full" keeps everything. Unknown names: InvalidArgument listing the allowed names.
absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreatePolicy(std::string_view name);
std::vector<std::string> PolicyNames();

}  // namespace kvstack
