// Policies that decide by position alone (no scores, so the attention kernels accumulate
// nothing for them): the full cache, a sliding window, StreamingLLM's sinks + window, and the
// streaming heads of DuoAttention. Each only says what it protects: its whole budget, so
// nothing is ever ranked.
#include "kvstack/check.h"
#include "select/keep_top.h"
#include "select/policy_factories.h"

namespace kvstack::select_internal {
namespace {

class FullPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "full"; }
  ScoreKind score_kind() const override { return ScoreKind::kNone; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    // Keeping everything is the policy's contract; a smaller budget means the caller sized the
    // cache for some other policy.
    KVS_CHECK(budget >= num_tokens);
    return {.sinks = num_tokens, .recent = 0};
  }
};

class WindowPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "window"; }
  ScoreKind score_kind() const override { return ScoreKind::kNone; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    return ClampProtected(num_tokens, budget, 0, budget);
  }
};

// StreamingLLM, and DuoAttention's streaming heads, which keep the same tokens (the retrieval
// heads are the engine's business: it never asks a policy about them).
class SinksAndWindowPolicy final : public SelectionPolicy {
 public:
  SinksAndWindowPolicy(std::string_view name, int sink_tokens)
      : name_(name), sink_tokens_(sink_tokens) {}
  std::string_view name() const override { return name_; }
  ScoreKind score_kind() const override { return ScoreKind::kNone; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    return ClampProtected(num_tokens, budget, sink_tokens_, budget);
  }

 private:
  std::string_view name_;
  int sink_tokens_;
};

}  // namespace

std::unique_ptr<SelectionPolicy> MakeFullPolicy() { return std::make_unique<FullPolicy>(); }

std::unique_ptr<SelectionPolicy> MakeWindowPolicy() { return std::make_unique<WindowPolicy>(); }

std::unique_ptr<SelectionPolicy> MakeStreamingPolicy(const PolicyParams& params) {
  return std::make_unique<SinksAndWindowPolicy>("streaming", params.sink_tokens);
}

std::unique_ptr<SelectionPolicy> MakeDuoPolicy(const PolicyParams& params) {
  return std::make_unique<SinksAndWindowPolicy>("duo", params.sink_tokens);
}

}  // namespace kvstack::select_internal
