// Codecs that store each kv head's vectors as rank-r coordinates in a calibrated per-head
// basis (from a KvProfile), as F16 or as 4-bit integers (one F16 scale and minimum per token
// per head). Decoding maps the coordinates back: x ~= mean + sum_j c_j b_j. Two families:
//   lowrank-r<R>[-int4]   Palu-like: keys and values each in their own PCA basis; fixed rank
//                         R (1..head_dim)
//   lowrank-e<P>[-int4]   the smallest rank that keeps P% of the variance in every kv head
//                         of the layer (P in 1..100), so one unit size serves the layer
//   latent-r<R>[-int4]    MLA-like: one joint basis for [k; v] (latent_codec.h); R in
//                         1..2*head_dim
// Both are built from a profile, not by CreateCodec; the cache calls CreateProfiledCodec.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/codec.h"
#include "kvstack/kv_profile.h"

namespace kvstack {

// Whether `name` is of a codec built from a calibration profile (lowrank-* or latent-*).
bool IsLowRankCodecName(std::string_view name);
// Checks the grammar only (no profile needed).
absl::Status CheckLowRankCodecName(std::string_view name);

// The shared unit format and decode of the low-rank and latent codecs. A unit is one token:
//   F16 coordinates:   [rank x f16 c_j]
//   4-bit coordinates: [f16 scale][f16 min][rank x 4-bit code, padded to a byte], c_j =
//                      code_j * scale + min (quant.h's asymmetric quantiser, one group)
// Attention reads these bytes directly (run/lowrank_attention.h) with mean() and basis().
class CoordinateCodec : public Codec {
 public:
  std::string_view name() const override { return name_; }
  int head_dim() const override { return head_dim_; }
  size_t unit_bytes() const override;
  bool needs_calibration() const override { return true; }
  int rank() const { return rank_; }
  bool int4_coordinates() const { return int4_; }

  // Without a head these use kv head 0's basis; the cache and kernels use the *Head forms.
  void Encode(std::span<const float> src, std::span<std::byte> dst) const override {
    EncodeHead(0, src, dst);
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    DecodeHead(0, src, dst);
  }
  void DecodeHead(int kv_head, std::span<const std::byte> src, std::span<float> dst) const override;

  // What one kv head's coordinates decode to: mean [head_dim] and rows b_j [rank][head_dim].
  std::span<const float> mean(int kv_head) const;
  std::span<const float> basis(int kv_head) const;

 protected:
  CoordinateCodec(std::string name, int head_dim, int rank, bool int4, int num_kv_heads)
      : name_(std::move(name)),
        head_dim_(head_dim),
        rank_(rank),
        int4_(int4),
        num_kv_heads_(num_kv_heads) {}

  int num_kv_heads() const { return num_kv_heads_; }
  // Appends one kv head's decode mean and rows (kv heads in order).
  void AddHead(std::span<const float> mean, std::span<const float> basis);
  // coords: [rank] -> one unit.
  void StoreCoordinates(const float* coords, std::byte* unit) const;

 private:
  std::string name_;
  int head_dim_;
  int rank_;
  bool int4_;
  int num_kv_heads_;
  std::vector<float> means_;  // [num_kv_heads][head_dim]
  std::vector<float> bases_;  // [num_kv_heads][rank][head_dim]
};

// Palu-like low-rank codec: coordinates in the kind's own orthonormal PCA basis, so encoding
// is the projection c_j = b_j . (x - mean).
class LowRankCodec final : public CoordinateCodec {
 public:
  // Errors: bad name, a rank above head_dim, a profile whose head_dim differs.
  static absl::StatusOr<std::unique_ptr<LowRankCodec>> Create(std::string_view name,
                                                              const KvProfile& profile,
                                                              int layer_idx, KvKind kind);

  CodecId id() const override { return CodecId::kLowRank; }
  void EncodeHead(int kv_head, std::span<const float> src, std::span<std::byte> dst) const override;

 private:
  using CoordinateCodec::CoordinateCodec;
};

// The codec `name` (lowrank-* or latent-*) of one layer in `role`, built from the profile.
absl::StatusOr<std::unique_ptr<Codec>> CreateProfiledCodec(std::string_view name,
                                                           const KvProfile& profile, int layer_idx,
                                                           CodecRole role);

}  // namespace kvstack
