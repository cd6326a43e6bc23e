// SelectionState: what layer 1 knows about the tokens one sequence holds — per layer and kv
// head, the original position and the attention score of every token the head still holds,
// in the same logical order as the cache (KvCache). The attention kernels add scores into it,
// policies read it (Input), and every eviction applied to the cache is applied here too
// (Retain with the same keep list), so logical index t means the same token in both.
//
// Heads of one layer may hold different numbers of tokens after an eviction (Ada-KV, or
// per-head policies); appends grow every head of a layer by the same count, as in the cache.
//
// Not thread-safe: one sequence's state is used by one thread at a time, except that kernels
// may add into different heads' score rows concurrently.
#pragma once

#include <span>
#include <vector>

#include "kvstack/policy.h"

namespace kvstack {

class SelectionState {
 public:
  // num_layers, num_kv_heads >= 1; capacity >= 0: the most tokens one head holds at once
  // (the cache's capacity per sequence). All memory is allocated here, none later.
  SelectionState(int num_layers, int num_kv_heads, int capacity);

  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int capacity() const { return capacity_; }
  // Floats between the starts of two heads' score rows (ScoreRows): capacity rounded up to a
  // multiple of 16, so rows start 64 bytes apart.
  int stride() const { return stride_; }

  // Adds `count` tokens at the end of every kv head of `layer`, with positions first_position,
  // first_position + 1, ... and scores 0. Every head must stay within capacity (CHECKed).
  void Append(int layer, int first_position, int count);

  // Tokens kv head `head` of `layer` holds.
  int HeadTokens(int layer, int head) const;
  // [HeadTokens] positions (ascending) and scores of the head's tokens, oldest first. Valid
  // until the next Append, Retain or SetPositions of that layer.
  std::span<const int> Positions(int layer, int head) const;
  std::span<const float> Scores(int layer, int head) const;

  // The layer's score rows for the kernels: [num_kv_heads][stride]; the score of head h's
  // logical token t (t < HeadTokens(layer, h)) is at [h * stride + t]. Kernels add to it
  // (out[h * stride + t] += p); entries beyond a head's tokens are never read.
  float* ScoreRows(int layer);
  // Sets every score of the layer to 0: before each step of a policy whose ScoreKind is
  // kRecent, so the scores cover only the queries since.
  void ClearScores(int layer);

  // Keeps only the logical tokens `keep` (ascending, distinct, < HeadTokens; CHECKed) of one
  // head, which become logical [0, keep.size()) in order with their positions and scores:
  // the same keep list, with the same meaning, as KvCache::RetainTokens.
  void Retain(int layer, int head, std::span<const int> keep);
  // Replaces the positions of one head's tokens ([HeadTokens], strictly ascending; CHECKed):
  // for a cache that re-assigns positions (StreamingLLM's way) after an eviction.
  void SetPositions(int layer, int head, std::span<const int> positions);

  // One head's SelectionInput: its positions, its scores (empty when kind is kNone) and
  // `budget`. Valid as long as Positions/Scores are.
  SelectionInput Input(int layer, int head, int budget, ScoreKind kind) const;
  // Every head's Input for SelectLayer: *inputs is resized to [num_kv_heads].
  void LayerInputs(int layer, int budget, ScoreKind kind,
                   std::vector<SelectionInput>* inputs) const;

 private:
  size_t HeadIndex(int layer, int head) const;

  int num_layers_;
  int num_kv_heads_;
  int capacity_;
  int stride_;
  std::vector<int> head_tokens_;  // [num_layers][num_kv_heads]
  std::vector<int> positions_;    // [num_layers][num_kv_heads][capacity]
  std::vector<float> scores_;     // [num_layers][num_kv_heads][stride]
};

}  // namespace kvstack
