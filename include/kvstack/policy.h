// SelectionPolicy: which keys and values a sequence keeps (layer 1, information). A policy
// sees the original positions and, for score-based policies, attention scores of the tokens of
// one (layer, kv head) and answers which logical tokens to keep under a budget. It orders and
// picks; it never frees memory itself — the cache does, from the answer (KvCache::RetainTokens).
//
// Policies (names as users type them):
//   full       keep everything (the baseline; needs a budget >= the context)
//   window     the most recent `budget` tokens (a sliding window; no sinks)
//   streaming  StreamingLLM: the first sink_tokens tokens + the most recent ones
//   h2o        H2O: the sink_tokens first and recent_tokens last tokens, the rest by the
//              attention mass accumulated over every query so far ("heavy hitters")
//   tova       TOVA: the tokens the most recent query attends least are dropped. TOVA itself
//              protects nothing; kvstack keeps the sink_tokens first tokens too (the cache
//              never evicts sinks, and every policy here treats them alike)
//   snapkv     SnapKV: attention of the last observation_window queries, max-pooled over
//              pool_kernel neighbouring tokens; the sinks and the recent_tokens last tokens
//              (the observation window itself by default) are always kept
//   duo        DuoAttention-style head classes from a head profile (head_profile.h): the
//              engine keeps every token of the heads the profile marks as retrieval heads and
//              calls this policy only for the others, the streaming heads, which keep what
//              `streaming` keeps
// Layer budgets (uniform or PyramidKV's) and head budgets (uniform or Ada-KV's adaptive split)
// are separate choices that combine with every policy (SelectLayer; adaptive needs scores).
//
// Every policy answers the same way: of n tokens under budget b it keeps exactly min(n, b),
// ascending logical indices; the protected tokens (sinks at the start, a recent window at the
// end) first, then, for score-based policies, the highest-ranked of the rest. Equal scores go
// to the more recent token, so answers are deterministic. When sinks + recent exceed the
// budget, the recent window shrinks first, then the sinks: with budget 3 and 4 sinks, the
// first 3 tokens are kept.
//
// Policies hold only their parameters: Select is const and safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

// What scores a policy reads (and so what the attention kernels must accumulate for it).
enum class ScoreKind : uint8_t {
  kNone = 0,         // positions only: full, window, streaming, duo
  kAccumulated = 1,  // attention mass summed over every query since the token arrived (H2O)
  kRecent = 2,       // attention of the most recent observation_window() queries only
                     // (TOVA: 1 query; SnapKV: W queries)
};

// The tokens of one (layer, kv head), oldest first.
struct SelectionInput {
  std::span<const int> positions;  // [n] original position (>= 0) of each logical token,
                                   // ascending
  std::span<const float> scores;   // [n] as the policy's ScoreKind says; empty for kNone.
                                   // NaN ranks below every other score.
  int budget = 0;                  // keep at most this many; >= 0 (full: >= n)
};

// Tokens a policy keeps whatever their scores: the first `sinks` and the last `recent` logical
// tokens of a head (never overlapping; sinks + recent <= min(n, budget)).
struct ProtectedTokens {
  int sinks = 0;
  int recent = 0;
  int total() const { return sinks + recent; }
};

struct PolicyParams {
  // Tokens at the start always kept (streaming, h2o, tova, snapkv, duo; window and full ignore
  // it); >= 0. Default: 4.
  int sink_tokens = 4;
  // Most recent tokens always kept by h2o and snapkv (the others ignore it); >= -1.
  // -1: h2o keeps half of the budget (H2O's even split of heavy hitters and recent tokens),
  // snapkv keeps its observation window. Default: -1.
  int recent_tokens = -1;
  // SnapKV: queries whose attention is observed; >= 1. Default: 32.
  int observation_window = 32;
  // SnapKV: width of the max-pool over neighbouring tokens' scores; odd, >= 1 (1: no pooling).
  // Default: 7.
  int pool_kernel = 7;
};

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual ScoreKind score_kind() const = 0;
  bool needs_scores() const { return score_kind() != ScoreKind::kNone; }
  // Queries whose attention a kRecent policy reads (1 for TOVA, W for SnapKV). 0 for the
  // other kinds.
  virtual int observation_window() const { return 0; }

  // Writes the logical indices to keep into *keep (replacing its content), ascending, exactly
  // min(n, input.budget) of them. input.scores must hold n scores when needs_scores().
  void Select(const SelectionInput& input, std::vector<int>* keep) const;

  // The parts of Select, for callers that split one budget over several heads (SelectLayer):
  // the tokens kept whatever their scores, for n tokens under `budget` ...
  virtual ProtectedTokens Protected(int num_tokens, int budget) const = 0;
  // ... and the score by which each of the other tokens competes for the rest of the budget
  // (higher is kept). Score-based policies only (CHECKed): the span is input.scores itself
  // (the default) or *scratch holding a transformed copy (SnapKV's pooled scores), valid until
  // *scratch changes.
  virtual std::span<const float> RankingScores(const SelectionInput& input,
                                               std::vector<float>* scratch) const;
};

// A policy by name. Unknown names or bad params: InvalidArgument, one line listing what is
// allowed.
absl::StatusOr<std::unique_ptr<SelectionPolicy>> CreatePolicy(std::string_view name,
                                                              const PolicyParams& params = {});
// Every name CreatePolicy accepts, "full" first, in a stable order.
std::vector<std::string> PolicyNames();

// ---- Budgets across layers and heads ---------------------------------------------------------

// How a model's token budget is spread over its layers.
enum class LayerSchedule : uint8_t {
  kUniform = 0,  // every layer the same
  kPyramid = 1,  // PyramidKV: more in the lower layers, fewer in the upper, linearly
};
// "uniform" | "pyramid"; anything else: InvalidArgument naming both.
absl::StatusOr<LayerSchedule> ParseLayerSchedule(std::string_view name);
std::string_view LayerScheduleName(LayerSchedule schedule);

// Per-layer budgets (tokens per kv head), num_layers >= 1, average >= 1, min_budget >= 0.
// kUniform: every layer gets `average`. kPyramid: PyramidKV's arithmetic schedule — the top
// layer gets t = max(min_budget, average / 20) (PyramidKV's beta = 20), layer 0 gets
// 2 * average - t, and the layers between lie on the line: rounded down, then the rounding
// remainder goes one token each to the layers with the largest fractional parts (the lower
// layer on equal parts). So budgets never increase with the layer, each is in
// [t, 2 * average - t], and they sum to exactly num_layers * average. A min_budget at or above
// average leaves nothing to shift: every layer gets average.
std::vector<int> LayerBudgets(int num_layers, int average, LayerSchedule schedule, int min_budget);

// How a layer's budget is split across its kv heads.
enum class HeadSplit : uint8_t {
  kUniform = 0,   // every kv head keeps the layer budget
  kAdaptive = 1,  // Ada-KV: the layer keeps num_heads * budget tokens in all, chosen jointly
                  // by score across its heads, so heads with concentrated attention keep few
                  // and heads with spread attention keep many
};
// "uniform" | "adaptive"; anything else: InvalidArgument naming both.
absl::StatusOr<HeadSplit> ParseHeadSplit(std::string_view name);
std::string_view HeadSplitName(HeadSplit split);

// Selects for every kv head of one layer. heads[h] is head h's input (its budget field is
// ignored); `budget` is the per-head budget. keep: resized to [num_heads] ascending lists.
// kUniform: each head as Select with `budget`. kAdaptive (Ada-KV): each head's ranking scores
// are normalised to sum 1, in float (a head whose scores sum to 0 keeps them as they are); every
// head keeps its Protected(n_h, budget) tokens; the top (num_heads * budget - all protected)
// normalised scores among all heads' other tokens are then taken jointly (equal scores: the
// later position, then the lower head). A head may so keep more than `budget` tokens but
// never more than it holds, and the layer keeps min(sum of n_h, num_heads * budget) in all.
// kAdaptive needs a score-based policy (CHECKed: configuration validation rejects the rest).
void SelectLayer(const SelectionPolicy& policy, HeadSplit split,
                 std::span<const SelectionInput> heads, int budget,
                 std::vector<std::vector<int>>* keep);

}  // namespace kvstack
