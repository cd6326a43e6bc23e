// Policies that rank tokens by attention scores the kernels accumulate: H2O (mass summed over
// every query), TOVA (the latest query's attention) and SnapKV (the last W queries' attention,
// max-pooled). They differ in which scores they read, what they protect and how they turn
// scores into a ranking; the selection itself is shared (keep_top.h).
#include <algorithm>

#include "kvstack/check.h"
#include "select/keep_top.h"
#include "select/policy_factories.h"

namespace kvstack::select_internal {
namespace {

class H2oPolicy final : public SelectionPolicy {
 public:
  explicit H2oPolicy(const PolicyParams& params)
      : sink_tokens_(params.sink_tokens), recent_tokens_(params.recent_tokens) {}
  std::string_view name() const override { return "h2o"; }
  ScoreKind score_kind() const override { return ScoreKind::kAccumulated; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    // H2O splits its cache evenly between heavy hitters and recent tokens.
    const int recent = recent_tokens_ >= 0 ? recent_tokens_ : budget / 2;
    return ClampProtected(num_tokens, budget, sink_tokens_, recent);
  }

 private:
  int sink_tokens_;
  int recent_tokens_;
};

// TOVA drops the token the current query attends least, one per step; keeping the top
// `budget` by the latest query's scores is the same answer for any number of steps at once.
class TovaPolicy final : public SelectionPolicy {
 public:
  explicit TovaPolicy(const PolicyParams& params) : sink_tokens_(params.sink_tokens) {}
  std::string_view name() const override { return "tova"; }
  ScoreKind score_kind() const override { return ScoreKind::kRecent; }
  int observation_window() const override { return 1; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    return ClampProtected(num_tokens, budget, sink_tokens_, 0);
  }

 private:
  int sink_tokens_;
};

class SnapKvPolicy final : public SelectionPolicy {
 public:
  explicit SnapKvPolicy(const PolicyParams& params)
      : sink_tokens_(params.sink_tokens),
        recent_tokens_(params.recent_tokens >= 0 ? params.recent_tokens
                                                 : params.observation_window),
        observation_window_(params.observation_window),
        pool_kernel_(params.pool_kernel) {}
  std::string_view name() const override { return "snapkv"; }
  ScoreKind score_kind() const override { return ScoreKind::kRecent; }
  int observation_window() const override { return observation_window_; }
  ProtectedTokens Protected(int num_tokens, int budget) const override {
    return ClampProtected(num_tokens, budget, sink_tokens_, recent_tokens_);
  }
  // Max-pooling keeps a selected token's neighbours competitive with it, so SnapKV keeps
  // whole phrases around the tokens the window attends to rather than isolated tokens.
  // Neighbours are logical (kept tokens after earlier evictions count as adjacent); the window
  // is clipped at both ends.
  std::span<const float> RankingScores(const SelectionInput& input,
                                       std::vector<float>* scratch) const override {
    if (pool_kernel_ == 1) return input.scores;
    const int n = static_cast<int>(input.scores.size());
    const int half = pool_kernel_ / 2;
    scratch->resize(n);
    for (int i = 0; i < n; ++i) {
      const int lo = std::max(0, i - half);
      const int hi = std::min(n - 1, i + half);
      float best = RankValue(input.scores[lo]);
      for (int j = lo + 1; j <= hi; ++j) best = std::max(best, RankValue(input.scores[j]));
      (*scratch)[i] = best;
    }
    return *scratch;
  }

 private:
  int sink_tokens_;
  int recent_tokens_;
  int observation_window_;
  int pool_kernel_;
};

}  // namespace

std::unique_ptr<SelectionPolicy> MakeH2oPolicy(const PolicyParams& params) {
  return std::make_unique<H2oPolicy>(params);
}

std::unique_ptr<SelectionPolicy> MakeTovaPolicy(const PolicyParams& params) {
  return std::make_unique<TovaPolicy>(params);
}

std::unique_ptr<SelectionPolicy> MakeSnapKvPolicy(const PolicyParams& params) {
  return std::make_unique<SnapKvPolicy>(params);
}

}  // namespace kvstack::select_internal
