// Low-rank storage of keys and values: coordinates in a calibrated per-head basis. The
// projection and reconstruction are plain dot products in float; the 4-bit variant quantises
// the coordinates of a row with one asymmetric scale, since a row's coordinates share a
// dynamic range that shrinks with the component index (the same asymmetric quantiser as the
// int4 codecs, from quant.h). The unit format and decode are shared with the latent codec,
// which differs only in how it finds the coordinates.
#include "represent/lowrank_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/numeric.h"
#include "represent/latent_codec.h"
#include "represent/quant.h"

namespace kvstack {
namespace {

struct LowRankName {
  bool by_energy = false;
  int value = 0;  // rank, or energy percent
  bool int4 = false;
};

absl::StatusOr<LowRankName> ParseName(std::string_view name) {
  const auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec '%s': expected lowrank-r<rank>[-int4] or lowrank-e<percent>[-int4]",
                        std::string(name)));
  };
  constexpr std::string_view kPrefix = "lowrank-";
  if (name.substr(0, kPrefix.size()) != kPrefix) return bad();
  std::string_view rest = name.substr(kPrefix.size());
  LowRankName out;
  constexpr std::string_view kInt4 = "-int4";
  if (rest.size() > kInt4.size() && rest.substr(rest.size() - kInt4.size()) == kInt4) {
    out.int4 = true;
    rest.remove_suffix(kInt4.size());
  }
  if (rest.empty() || (rest[0] != 'r' && rest[0] != 'e')) return bad();
  out.by_energy = rest[0] == 'e';
  if (!absl::SimpleAtoi(std::string(rest.substr(1)), &out.value) || out.value < 1) return bad();
  if (out.by_energy && out.value > 100) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec '%s': energy percent %d is out of range; allowed: 1..100",
                        std::string(name), out.value));
  }
  return out;
}

}  // namespace

bool IsLowRankCodecName(std::string_view name) {
  return name.substr(0, 8) == "lowrank-" || IsLatentCodecName(name);
}

absl::Status CheckLowRankCodecName(std::string_view name) {
  if (IsLatentCodecName(name)) return CheckLatentCodecName(name);
  return ParseName(name).status();
}

absl::StatusOr<std::unique_ptr<Codec>> CreateProfiledCodec(std::string_view name,
                                                           const KvProfile& profile, int layer_idx,
                                                           CodecRole role) {
  if (IsLatentCodecName(name)) {
    KVS_ASSIGN_OR_RETURN(std::unique_ptr<LatentCodec> codec,
                         LatentCodec::Create(name, profile, layer_idx, role));
    return std::unique_ptr<Codec>(std::move(codec));
  }
  KVS_ASSIGN_OR_RETURN(
      std::unique_ptr<LowRankCodec> codec,
      LowRankCodec::Create(name, profile, layer_idx,
                           role == CodecRole::kKey ? KvKind::kKey : KvKind::kValue));
  return std::unique_ptr<Codec>(std::move(codec));
}

// ---------------------------------------------------------------------------------------------
// CoordinateCodec: the unit format and decode.

size_t CoordinateCodec::unit_bytes() const {
  return int4_ ? 4 + static_cast<size_t>(rank_ + 1) / 2 : 2 * static_cast<size_t>(rank_);
}

std::span<const float> CoordinateCodec::mean(int kv_head) const {
  KVS_CHECK(kv_head >= 0 && kv_head < num_kv_heads_);
  return std::span<const float>(means_).subspan(static_cast<size_t>(kv_head) * head_dim_,
                                                head_dim_);
}

std::span<const float> CoordinateCodec::basis(int kv_head) const {
  KVS_CHECK(kv_head >= 0 && kv_head < num_kv_heads_);
  const size_t size = static_cast<size_t>(rank_) * head_dim_;
  return std::span<const float>(bases_).subspan(kv_head * size, size);
}

void CoordinateCodec::AddHead(std::span<const float> mean, std::span<const float> basis) {
  KVS_CHECK(mean.size() == static_cast<size_t>(head_dim_) &&
            basis.size() == static_cast<size_t>(rank_) * head_dim_);
  means_.insert(means_.end(), mean.begin(), mean.end());
  bases_.insert(bases_.end(), basis.begin(), basis.end());
}

void CoordinateCodec::StoreCoordinates(const float* coords, std::byte* unit) const {
  if (!int4_) {
    for (int j = 0; j < rank_; ++j) quant::StoreF16(unit + 2 * j, F32ToF16(coords[j]));
    return;
  }
  // The row's coordinates share one asymmetric 4-bit scale: quant.h's group quantiser.
  const quant::Affine affine = quant::MakeAffine(coords, rank_, 1, 4);
  quant::StoreF16(unit, affine.scale.bits);
  quant::StoreF16(unit + 2, affine.min.bits);
  std::vector<uint8_t> codes(rank_);
  for (int j = 0; j < rank_; ++j) codes[j] = static_cast<uint8_t>(affine.Code(coords[j]));
  quant::PackCodes(codes.data(), rank_, 4, unit + 4);
}

void CoordinateCodec::DecodeHead(int kv_head, std::span<const std::byte> src,
                                 std::span<float> dst) const {
  KVS_CHECK(dst.size() % head_dim_ == 0);
  const size_t num_rows = dst.size() / head_dim_;
  KVS_CHECK(src.size() == num_rows * unit_bytes());
  const std::span<const float> mu = mean(kv_head);
  const std::span<const float> u = basis(kv_head);
  std::vector<float> coords(rank_);
  for (size_t r = 0; r < num_rows; ++r) {
    const std::byte* in = src.data() + r * unit_bytes();
    if (!int4_) {
      for (int j = 0; j < rank_; ++j) coords[j] = quant::LoadF16(in + 2 * j);
    } else {
      const float scale = quant::LoadF16(in);
      const float min = quant::LoadF16(in + 2);
      for (int j = 0; j < rank_; ++j) {
        coords[j] = quant::AffineValue(quant::GetCode(in + 4, j, 4), scale, min);
      }
    }
    float* x = dst.data() + r * head_dim_;
    for (int i = 0; i < head_dim_; ++i) x[i] = mu[i];
    for (int j = 0; j < rank_; ++j) {
      for (int i = 0; i < head_dim_; ++i)
        x[i] += coords[j] * u[static_cast<size_t>(j) * head_dim_ + i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LowRankCodec.

absl::StatusOr<std::unique_ptr<LowRankCodec>> LowRankCodec::Create(std::string_view name,
                                                                   const KvProfile& profile,
                                                                   int layer_idx, KvKind kind) {
  KVS_ASSIGN_OR_RETURN(LowRankName parsed, ParseName(name));
  const int head_dim = profile.head_dim();
  int rank = parsed.value;
  if (parsed.by_energy) {
    rank = 1;
    for (int h = 0; h < profile.num_kv_heads(); ++h) {
      rank = std::max(rank,
                      profile.components(layer_idx, h, kind).RankForEnergy(parsed.value / 100.0));
    }
  } else if (rank > head_dim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec '%s': rank %d is above head_dim %d; allowed: 1..%d",
                        std::string(name), rank, head_dim, head_dim));
  }
  std::unique_ptr<LowRankCodec> codec(
      new LowRankCodec(std::string(name), head_dim, rank, parsed.int4, profile.num_kv_heads()));
  for (int h = 0; h < profile.num_kv_heads(); ++h) {
    const HeadComponents& c = profile.components(layer_idx, h, kind);
    const std::vector<float> mean(c.mean.begin(), c.mean.end());
    const std::vector<float> basis(c.basis.begin(),
                                   c.basis.begin() + static_cast<size_t>(rank) * head_dim);
    codec->AddHead(mean, basis);
  }
  return codec;
}

void LowRankCodec::EncodeHead(int kv_head, std::span<const float> src,
                              std::span<std::byte> dst) const {
  const int dim = head_dim();
  KVS_CHECK(src.size() % dim == 0);
  const size_t num_rows = src.size() / dim;
  KVS_CHECK(dst.size() == num_rows * unit_bytes());
  const std::span<const float> mu = mean(kv_head);
  const std::span<const float> u = basis(kv_head);
  std::vector<float> coords(rank());
  for (size_t r = 0; r < num_rows; ++r) {
    const float* x = src.data() + r * dim;
    for (int j = 0; j < rank(); ++j) {
      double sum = 0;
      for (int i = 0; i < dim; ++i) {
        // A non-finite element must not poison the row: it contributes as the mean would.
        const float xi = std::isfinite(x[i]) ? x[i] : mu[i];
        sum += static_cast<double>(u[static_cast<size_t>(j) * dim + i]) * (xi - mu[i]);
      }
      coords[j] = static_cast<float>(sum);
    }
    StoreCoordinates(coords.data(), dst.data() + r * unit_bytes());
  }
}

}  // namespace kvstack
