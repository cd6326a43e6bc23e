// The low-rank codec (Palu-like): each kv head's vectors are stored as their first `rank`
// coordinates in that head's calibrated PCA basis (from a KvProfile), as F16 or as 4-bit
// integers (one F16 scale and minimum per token per head). Decoding maps the coordinates
// back: x ~= mean + sum_j c_j u_j. Names:
//   lowrank-r<R>[-int4]   fixed rank R (1..head_dim)
//   lowrank-e<P>[-int4]   the smallest rank that keeps P% of the variance in every kv head
//                         of the layer (P in 1..100), so one unit size serves the layer
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "kvstack/codec.h"
#include "kvstack/kv_profile.h"

namespace kvstack {

bool IsLowRankCodecName(std::string_view name);
// Checks the grammar only (no profile needed).
absl::Status CheckLowRankCodecName(std::string_view name);

class LowRankCodec final : public Codec {
 public:
  // Errors: bad name, a rank above head_dim, a profile whose head_dim differs.
  static absl::StatusOr<std::unique_ptr<LowRankCodec>> Create(std::string_view name,
                                                              const KvProfile& profile,
                                                              int layer_idx, KvKind kind);

  CodecId id() const override { return CodecId::kLowRank; }
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
  void EncodeHead(int kv_head, std::span<const float> src, std::span<std::byte> dst) const override;
  void DecodeHead(int kv_head, std::span<const std::byte> src, std::span<float> dst) const override;

  // The basis of one kv head: mean [head_dim] and rows u_j [rank][head_dim].
  std::span<const float> mean(int kv_head) const;
  std::span<const float> basis(int kv_head) const;

 private:
  LowRankCodec() = default;

  std::string name_;
  int head_dim_ = 0;
  int rank_ = 0;
  bool int4_ = false;
  int num_kv_heads_ = 0;
  std::vector<float> means_;  // [num_kv_heads][head_dim]
  std::vector<float> bases_;  // [num_kv_heads][rank][head_dim]
};

}  // namespace kvstack
