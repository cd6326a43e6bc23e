// The latent codec (MLA-like): one joint basis per (layer, kv head) for the concatenated
// [k; v] of 2 * head_dim dims, from the profile's joint components (kv_profile.h). Each token
// stores rank R coordinates once, in the key arena, and both its key and its value decode from
// them. Name: latent-r<R>[-int4], R in 1..2*head_dim; a layer's key and value codecs must both
// be the same latent codec (CheckLatentPair).
//
// Why per kv head and not one basis across the heads of a layer (as MLA's single latent per
// token): the cache stores, evicts and reads each kv head's units separately, and attention
// handles one kv head per pass over its keys; a per-head latent keeps all of that as it is,
// so a kv head reads only its own R coordinates instead of the whole layer's latent.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "represent/lowrank_codec.h"

namespace kvstack {

bool IsLatentCodecName(std::string_view name);
// Checks the grammar only (no profile needed).
absl::Status CheckLatentCodecName(std::string_view name);
// A layer's key and value codec names: latent with latent of the same name, or neither
// latent. InvalidArgument (one line) for any other combination.
absl::Status CheckLatentPair(std::string_view k_name, std::string_view v_name);

class LatentCodec final : public CoordinateCodec {
 public:
  // The codec of one layer in `role`: it decodes that half of [k; v]. Errors: bad name, a rank
  // above 2 * head_dim.
  static absl::StatusOr<std::unique_ptr<LatentCodec>> Create(std::string_view name,
                                                             const KvProfile& profile,
                                                             int layer_idx, CodecRole role);

  CodecId id() const override { return CodecId::kLatent; }
  CodecRole role() const { return role_; }
  bool joint() const override { return true; }
  // c_j = e_j . ([k; v] - mean): the projection onto the joint principal directions
  // (kv_profile.h). A non-finite element contributes as the mean would.
  void EncodeJointHead(int kv_head, std::span<const float> k, std::span<const float> v,
                       std::span<std::byte> dst) const override;
  // One side alone cannot be encoded: invariant violation (see Codec::joint).
  void EncodeHead(int kv_head, std::span<const float> src, std::span<std::byte> dst) const override;

 private:
  using CoordinateCodec::CoordinateCodec;

  CodecRole role_ = CodecRole::kKey;
  std::vector<double> joint_means_;  // [num_kv_heads][2 * head_dim]
  std::vector<double> joint_rows_;   // [num_kv_heads][rank][2 * head_dim]: principal directions
};

}  // namespace kvstack
