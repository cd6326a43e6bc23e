// SelectionState: positions and scores per (layer, kv head), laid out as the kernels want
// them (one padded score row per head, so a kernel adds into its head's row with one index)
// and compacted in place on eviction exactly as the cache compacts its tokens.
#include "kvstack/selection_state.h"

#include <algorithm>

#include "kvstack/check.h"

namespace kvstack {
namespace {

constexpr int kRowAlignFloats = 16;  // 64 bytes

}  // namespace

SelectionState::SelectionState(int num_layers, int num_kv_heads, int capacity)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      capacity_(capacity),
      stride_((capacity + kRowAlignFloats - 1) / kRowAlignFloats * kRowAlignFloats) {
  KVS_CHECK(num_layers >= 1 && num_kv_heads >= 1 && capacity >= 0);
  const size_t heads = static_cast<size_t>(num_layers) * num_kv_heads;
  head_tokens_.assign(heads, 0);
  positions_.assign(heads * capacity, 0);
  scores_.assign(heads * stride_, 0.0f);
}

size_t SelectionState::HeadIndex(int layer, int head) const {
  KVS_CHECK(0 <= layer && layer < num_layers_ && 0 <= head && head < num_kv_heads_);
  return static_cast<size_t>(layer) * num_kv_heads_ + head;
}

void SelectionState::Append(int layer, int first_position, int count) {
  KVS_CHECK(count >= 0);
  for (int h = 0; h < num_kv_heads_; ++h) {
    const size_t idx = HeadIndex(layer, h);
    const int n = head_tokens_[idx];
    KVS_CHECK(count <= capacity_ - n);
    int* positions = positions_.data() + idx * capacity_ + n;
    float* scores = scores_.data() + idx * stride_ + n;
    for (int j = 0; j < count; ++j) {
      positions[j] = first_position + j;
      scores[j] = 0.0f;
    }
    head_tokens_[idx] = n + count;
  }
}

int SelectionState::HeadTokens(int layer, int head) const {
  return head_tokens_[HeadIndex(layer, head)];
}

std::span<const int> SelectionState::Positions(int layer, int head) const {
  const size_t idx = HeadIndex(layer, head);
  return {positions_.data() + idx * capacity_, static_cast<size_t>(head_tokens_[idx])};
}

std::span<const float> SelectionState::Scores(int layer, int head) const {
  const size_t idx = HeadIndex(layer, head);
  return {scores_.data() + idx * stride_, static_cast<size_t>(head_tokens_[idx])};
}

float* SelectionState::ScoreRows(int layer) {
  return scores_.data() + HeadIndex(layer, 0) * stride_;
}

void SelectionState::ClearScores(int layer) {
  float* rows = ScoreRows(layer);
  std::fill(rows, rows + static_cast<size_t>(num_kv_heads_) * stride_, 0.0f);
}

void SelectionState::Retain(int layer, int head, std::span<const int> keep) {
  const size_t idx = HeadIndex(layer, head);
  const int n = head_tokens_[idx];
  int* positions = positions_.data() + idx * capacity_;
  float* scores = scores_.data() + idx * stride_;
  // keep[i] >= i for an ascending, distinct list, so moving forward never overwrites an entry
  // still to be read.
  for (size_t i = 0; i < keep.size(); ++i) {
    KVS_CHECK(keep[i] < n && (i == 0 ? keep[i] >= 0 : keep[i] > keep[i - 1]));
    positions[i] = positions[keep[i]];
    scores[i] = scores[keep[i]];
  }
  const int kept = static_cast<int>(keep.size());
  std::fill(scores + kept, scores + n, 0.0f);
  head_tokens_[idx] = kept;
}

void SelectionState::SetPositions(int layer, int head, std::span<const int> positions) {
  const size_t idx = HeadIndex(layer, head);
  KVS_CHECK(static_cast<int>(positions.size()) == head_tokens_[idx]);
  KVS_CHECK(std::adjacent_find(positions.begin(), positions.end(),
                               [](int a, int b) { return a >= b; }) == positions.end());
  std::copy(positions.begin(), positions.end(), positions_.data() + idx * capacity_);
}

SelectionInput SelectionState::Input(int layer, int head, int budget, ScoreKind kind) const {
  SelectionInput input;
  input.positions = Positions(layer, head);
  if (kind != ScoreKind::kNone) input.scores = Scores(layer, head);
  input.budget = budget;
  return input;
}

void SelectionState::LayerInputs(int layer, int budget, ScoreKind kind,
                                 std::vector<SelectionInput>* inputs) const {
  inputs->resize(num_kv_heads_);
  for (int h = 0; h < num_kv_heads_; ++h) (*inputs)[h] = Input(layer, h, budget, kind);
}

}  // namespace kvstack
