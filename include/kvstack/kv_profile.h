// KvProfile: per-layer, per-kv-head principal-component statistics of a model's keys and
// values measured on real text (`kvstack calibrate`). It says how much of each head's key and
// value energy a rank-r basis keeps, and carries the bases that low-rank codecs project onto.
// A profile belongs to exactly one model: it is keyed by the model file's content hash and
// shape, and loading it for another model is an error.
//
// File format (little-endian), version 1:
//   "KVSPROF\0" magic, u32 version, u64 model content hash, u32 num_layers, num_kv_heads,
//   head_dim, u64 tokens seen, then for each layer, kv head and kind (K then V):
//   f64 mean[head_dim], f64 eigenvalues[head_dim] (descending),
//   f64 basis[head_dim][head_dim] (row j = the j-th principal direction, unit length).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

// The principal components of one (layer, kv head, kind).
struct HeadComponents {
  std::vector<double> mean;         // [head_dim]
  std::vector<double> eigenvalues;  // [head_dim], descending, >= 0
  std::vector<double> basis;        // [head_dim][head_dim], row-major, rows orthonormal

  // Fraction of the total variance the first `rank` components keep (1 for an all-zero head).
  double EnergyRetained(int rank) const;
  // The smallest rank that keeps at least `fraction` (in (0, 1]) of the variance.
  int RankForEnergy(double fraction) const;
};

class KvProfile {
 public:
  static constexpr uint32_t kVersion = 1;

  // An empty profile for a model of this shape and hash.
  KvProfile(uint64_t model_hash, int num_layers, int num_kv_heads, int head_dim);

  uint64_t model_hash() const { return model_hash_; }
  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  uint64_t tokens_seen() const { return tokens_seen_; }

  // Accumulates rows of one (layer, kind): rows [num_tokens, num_kv_heads, head_dim].
  void Accumulate(int layer_idx, KvKind kind, std::span<const float> rows);
  // Counts tokens for the report (call once per token position, not per layer).
  void AddTokens(uint64_t num_tokens) { tokens_seen_ += num_tokens; }
  // Turns the accumulated moments into components (eigen-decomposition of each covariance).
  // FailedPrecondition when nothing was accumulated.
  absl::Status Finalize();

  const HeadComponents& components(int layer_idx, int kv_head, KvKind kind) const;

  absl::Status Save(const std::string& path) const;
  // Loads a profile and checks that it belongs to the model with this hash and shape; a
  // profile of another model is refused with an error naming both hashes.
  static absl::StatusOr<KvProfile> Load(const std::string& path, uint64_t model_hash,
                                        int num_layers, int num_kv_heads, int head_dim);

 private:
  size_t Index(int layer_idx, int kv_head, KvKind kind) const;

  uint64_t model_hash_;
  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  uint64_t tokens_seen_ = 0;
  // Running first and second moments per (layer, head, kind), in double.
  std::vector<uint64_t> counts_;
  std::vector<std::vector<double>> sums_;      // [head_dim]
  std::vector<std::vector<double>> products_;  // [head_dim][head_dim]
  std::vector<HeadComponents> components_;
};

// Eigen-decomposition of a symmetric matrix (cyclic Jacobi; exact to ~1e-12 for the head
// sizes of real models). a: [n][n] row-major. Outputs eigenvalues descending and the
// matching unit eigenvectors as rows of `vectors` ([n][n]).
void SymmetricEigen(std::vector<double> a, int n, std::vector<double>* values,
                    std::vector<double>* vectors);

}  // namespace kvstack
