// HeadProfile: DuoAttention-style head classes for one model. Each (layer, kv head) carries a
// retrieval score: the fraction of its attention mass that falls outside the sinks and a
// recent window on real text, measured elsewhere (`kvstack calibrate --heads`). Heads with the
// highest scores are retrieval heads — they look far back, so the engine keeps every token
// for them — and the rest are streaming heads, which keep sinks + a window (policy "duo").
// A profile belongs to one model: it carries the model file's content hash and shape, and
// CheckMatches refuses it for any other model.
//
// File format: text, one record per line ('#' starts a comment line; blank lines are
// ignored), version 1:
//   kvstack-head-profile 1
//   model_hash <16 hex digits>
//   num_layers <L>
//   num_kv_heads <H>
//   layer 0 <H scores>
//   ...
//   layer <L-1> <H scores>
// Scores are decimal numbers in [0, 1], written with enough digits to read back exactly.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

class HeadProfile {
 public:
  static constexpr int kVersion = 1;
  // Shape limits a file must respect (a corrupted count must not allocate gigabytes).
  static constexpr int kMaxLayers = 4096;
  static constexpr int kMaxKvHeads = 4096;

  // A profile of a model of this hash and shape with every score 0. num_layers in
  // [1, kMaxLayers], num_kv_heads in [1, kMaxKvHeads] (CHECKed).
  HeadProfile(uint64_t model_hash, int num_layers, int num_kv_heads);

  uint64_t model_hash() const { return model_hash_; }
  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  // The file the profile was loaded from; empty for one built in memory. Error messages name
  // it.
  const std::string& path() const { return path_; }

  double score(int layer, int head) const;
  // score in [0, 1] (CHECKed: measurements produce fractions).
  void set_score(int layer, int head, double score);
  // [num_layers][num_kv_heads], layer-major.
  std::span<const double> scores() const { return scores_; }

  // Writes the profile to `path` (replacing it). Errors name the path.
  absl::Status Save(const std::string& path) const;
  // Reads a profile. NotFound when the file cannot be opened; InvalidArgument, naming the path
  // and line, when it is not a version-1 head profile or is malformed or truncated.
  static absl::StatusOr<HeadProfile> Load(const std::string& path);

  // OK when the profile was measured on the model with this hash and shape; otherwise
  // FailedPrecondition, one line naming the profile's path and both hashes (or shapes).
  absl::Status CheckMatches(uint64_t model_hash, int num_layers, int num_kv_heads) const;

  // Which heads are retrieval heads: the round(fraction * num_layers * num_kv_heads) heads
  // with the highest scores (equal scores: the lower layer, then the lower head). fraction in
  // [0, 1] (CHECKed: configuration validation rejects the rest). Entry [layer * num_kv_heads
  // + head].
  std::vector<bool> RetrievalHeads(double fraction) const;

 private:
  size_t Index(int layer, int head) const;

  uint64_t model_hash_;
  int num_layers_;
  int num_kv_heads_;
  std::vector<double> scores_;  // [num_layers][num_kv_heads]
  std::string path_;
};

}  // namespace kvstack
