// Low-rank storage of keys and values: projection onto a calibrated per-head basis. The
// projection and reconstruction are plain dot products in float; the 4-bit variant quantises
// the coordinates of a row with one asymmetric scale, since a row's coordinates share a
// dynamic range that shrinks with the component index.
#include "represent/lowrank_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/numeric.h"

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

bool IsLowRankCodecName(std::string_view name) { return name.substr(0, 8) == "lowrank-"; }

absl::Status CheckLowRankCodecName(std::string_view name) { return ParseName(name).status(); }

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
    return absl::InvalidArgumentError(absl::StrFormat("codec '%s': rank %d is above head_dim %d",
                                                      std::string(name), rank, head_dim));
  }
  std::unique_ptr<LowRankCodec> codec(new LowRankCodec());
  codec->name_ = std::string(name);
  codec->head_dim_ = head_dim;
  codec->rank_ = rank;
  codec->int4_ = parsed.int4;
  codec->num_kv_heads_ = profile.num_kv_heads();
  for (int h = 0; h < profile.num_kv_heads(); ++h) {
    const HeadComponents& c = profile.components(layer_idx, h, kind);
    codec->means_.insert(codec->means_.end(), c.mean.begin(), c.mean.end());
    codec->bases_.insert(codec->bases_.end(), c.basis.begin(),
                         c.basis.begin() + static_cast<size_t>(rank) * head_dim);
  }
  return codec;
}

size_t LowRankCodec::unit_bytes() const {
  return int4_ ? 4 + static_cast<size_t>(rank_ + 1) / 2 : 2 * static_cast<size_t>(rank_);
}

std::span<const float> LowRankCodec::mean(int kv_head) const {
  return std::span<const float>(means_).subspan(static_cast<size_t>(kv_head) * head_dim_,
                                                head_dim_);
}

std::span<const float> LowRankCodec::basis(int kv_head) const {
  const size_t size = static_cast<size_t>(rank_) * head_dim_;
  return std::span<const float>(bases_).subspan(kv_head * size, size);
}

void LowRankCodec::EncodeHead(int kv_head, std::span<const float> src,
                              std::span<std::byte> dst) const {
  KVS_CHECK(kv_head >= 0 && kv_head < num_kv_heads_);
  KVS_CHECK(src.size() % head_dim_ == 0);
  const size_t num_rows = src.size() / head_dim_;
  KVS_CHECK(dst.size() == num_rows * unit_bytes());
  const std::span<const float> mu = mean(kv_head);
  const std::span<const float> u = basis(kv_head);
  std::vector<float> coords(rank_);
  for (size_t r = 0; r < num_rows; ++r) {
    const float* x = src.data() + r * head_dim_;
    for (int j = 0; j < rank_; ++j) {
      double sum = 0;
      for (int i = 0; i < head_dim_; ++i) {
        // A non-finite element must not poison the row: it contributes as the mean would.
        const float xi = std::isfinite(x[i]) ? x[i] : mu[i];
        sum += static_cast<double>(u[static_cast<size_t>(j) * head_dim_ + i]) * (xi - mu[i]);
      }
      coords[j] = static_cast<float>(sum);
    }
    std::byte* out = dst.data() + r * unit_bytes();
    if (!int4_) {
      for (int j = 0; j < rank_; ++j) {
        const uint16_t h = F32ToF16(coords[j]);
        std::memcpy(out + 2 * j, &h, 2);
      }
      continue;
    }
    const auto [lo_it, hi_it] = std::minmax_element(coords.begin(), coords.end());
    const uint16_t min_h = F32ToF16(*lo_it);
    const float min = F16ToF32(min_h);
    const uint16_t scale_h = F32ToF16((*hi_it - min) / 15.0f);
    const float scale = F16ToF32(scale_h);
    std::memcpy(out, &scale_h, 2);
    std::memcpy(out + 2, &min_h, 2);
    std::memset(out + 4, 0, (rank_ + 1) / 2);
    for (int j = 0; j < rank_; ++j) {
      const int q =
          scale > 0 ? std::clamp(static_cast<int>(std::lround((coords[j] - min) / scale)), 0, 15)
                    : 0;
      out[4 + j / 2] |= static_cast<std::byte>(q << (4 * (j % 2)));
    }
  }
}

void LowRankCodec::DecodeHead(int kv_head, std::span<const std::byte> src,
                              std::span<float> dst) const {
  KVS_CHECK(kv_head >= 0 && kv_head < num_kv_heads_);
  KVS_CHECK(dst.size() % head_dim_ == 0);
  const size_t num_rows = dst.size() / head_dim_;
  KVS_CHECK(src.size() == num_rows * unit_bytes());
  const std::span<const float> mu = mean(kv_head);
  const std::span<const float> u = basis(kv_head);
  std::vector<float> coords(rank_);
  for (size_t r = 0; r < num_rows; ++r) {
    const std::byte* in = src.data() + r * unit_bytes();
    if (!int4_) {
      for (int j = 0; j < rank_; ++j) {
        uint16_t h;
        std::memcpy(&h, in + 2 * j, 2);
        coords[j] = F16ToF32(h);
      }
    } else {
      uint16_t scale_h, min_h;
      std::memcpy(&scale_h, in, 2);
      std::memcpy(&min_h, in + 2, 2);
      const float scale = F16ToF32(scale_h);
      const float min = F16ToF32(min_h);
      for (int j = 0; j < rank_; ++j) {
        const int q = (static_cast<int>(in[4 + j / 2]) >> (4 * (j % 2))) & 15;
        coords[j] = q * scale + min;
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

}  // namespace kvstack
