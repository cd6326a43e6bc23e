// KvProfile: per-layer, per-kv-head principal-component statistics of a model's keys and
// values measured on real text (`kvstack calibrate`). It says how much of each head's key and
// value energy a rank-r basis keeps, and carries the bases that low-rank codecs project onto:
// one for keys and one for values (low-rank codecs), and one joint basis for the concatenated
// [k; v] (latent codecs, which store one set of coordinates from which both are decoded).
// A profile belongs to exactly one model: it is keyed by the model file's content hash and
// shape, and loading it for another model is an error.
//
// File format (little-endian), version 2:
//   "KVSPROF\0" magic, u32 version, u64 model content hash, u32 num_layers, num_kv_heads,
//   head_dim, u64 tokens seen, then for each layer and kv head:
//     keys, then values: f64 mean[head_dim], f64 eigenvalues[head_dim] (descending),
//                        f64 basis[head_dim][head_dim] (row j = the j-th principal direction);
//     joint [k; v]:      mean, eigenvalues and basis as above over 2 * head_dim dims.
// Version 1 (no joint section) is refused: calibrate again.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

// The principal components of one (layer, kv head, kind), or of the joint [k; v].
struct HeadComponents {
  std::vector<double> mean;         // [dims]
  std::vector<double> eigenvalues;  // [dims], descending, >= 0
  std::vector<double> basis;        // [dims][dims], row-major, rows orthonormal

  // Fraction of the total variance the first `rank` components keep (1 for an all-zero head).
  double EnergyRetained(int rank) const;
  // The smallest rank that keeps at least `fraction` (in (0, 1]) of the variance.
  int RankForEnergy(double fraction) const;
};

class KvProfile {
 public:
  static constexpr uint32_t kVersion = 2;

  // An empty profile for a model of this shape and hash.
  KvProfile(uint64_t model_hash, int num_layers, int num_kv_heads, int head_dim);

  uint64_t model_hash() const { return model_hash_; }
  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  uint64_t tokens_seen() const { return tokens_seen_; }

  // Accumulates the keys and values of the same tokens in one layer:
  //   keys, values: [num_tokens, num_kv_heads, head_dim]
  // A (token, kv head) whose key or value holds a non-finite element is skipped.
  void Accumulate(int layer_idx, std::span<const float> keys, std::span<const float> values);
  // Counts tokens for the report (call once per token position, not per layer).
  void AddTokens(uint64_t num_tokens) { tokens_seen_ += num_tokens; }
  // Turns the accumulated moments into components (eigen-decompositions of the key, value
  // and joint covariances). FailedPrecondition when nothing was accumulated.
  absl::Status Finalize();

  const HeadComponents& components(int layer_idx, int kv_head, KvKind kind) const;
  // The principal components of the concatenated [k; v] (2 * head_dim dims, keys first): the
  // plain PCA, which minimises the squared error of key and value together. (Weighting the
  // halves to equal variance first was measured worse on stories260K: ΔPPL +655 % against
  // +88 % at latent-r12; docs/representation-results.md.)
  const HeadComponents& joint_components(int layer_idx, int kv_head) const;

  absl::Status Save(const std::string& path) const;
  // Loads a profile and checks that it belongs to the model with this hash and shape; a
  // profile of another model, or of another format version, is refused with an error naming
  // both hashes (versions).
  static absl::StatusOr<KvProfile> Load(const std::string& path, uint64_t model_hash,
                                        int num_layers, int num_kv_heads, int head_dim);

 private:
  size_t HeadIndex(int layer_idx, int kv_head) const;

  uint64_t model_hash_;
  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  uint64_t tokens_seen_ = 0;
  // Running first and second moments of [k; v] per (layer, head), in double: the key and
  // value covariances are its diagonal blocks.
  std::vector<uint64_t> counts_;
  std::vector<std::vector<double>> sums_;      // [2 * head_dim]
  std::vector<std::vector<double>> products_;  // [2 * head_dim][2 * head_dim], upper triangle
  std::vector<HeadComponents> components_;     // [layer][head][kind]
  std::vector<HeadComponents> joint_;          // [layer][head], 2 * head_dim dims
};

// Eigen-decomposition of a symmetric matrix (Householder tridiagonalisation and implicit QL,
// src/represent/symmetric_eigen.cc; residuals ~1e-12 of the matrix's norm at the head sizes of
// real models). a: [n][n] row-major, n >= 1. Outputs eigenvalues descending and the matching
// unit eigenvectors as rows of `vectors` ([n][n]).
void SymmetricEigen(std::vector<double> a, int n, std::vector<double>* values,
                    std::vector<double>* vectors);

}  // namespace kvstack
