// The plain floating-point codecs (F32, F16, BF16) and the by-name factory. The plain codecs
// are the reference formats: one scalar conversion per element from numeric.h, no scales, no
// calibration. The quantising codecs live in their own files (codec_impl.h lists them); the
// name grammar and unit sizes of every codec are in codec_name.cc.
#include "kvstack/codec.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "kvstack/check.h"
#include "kvstack/numeric.h"
#include "represent/codec_impl.h"
#include "represent/codec_name.h"
#include "represent/lowrank_codec.h"

namespace kvstack {
namespace {

class F32Codec final : public Codec {
 public:
  explicit F32Codec(int head_dim) : head_dim_(head_dim) {}
  CodecId id() const override { return CodecId::kF32; }
  std::string_view name() const override { return "f32"; }
  int head_dim() const override { return head_dim_; }
  size_t unit_bytes() const override { return sizeof(float) * head_dim_; }

  void Encode(std::span<const float> src, std::span<std::byte> dst) const override {
    CheckedNumUnits(src.size(), dst.size(), head_dim_, unit_bytes());
    if (!src.empty()) std::memcpy(dst.data(), src.data(), dst.size());
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    CheckedNumUnits(dst.size(), src.size(), head_dim_, unit_bytes());
    if (!dst.empty()) std::memcpy(dst.data(), src.data(), src.size());
  }

 private:
  int head_dim_;
};

// F16 and BF16 differ only in the scalar conversion pair, so one template serves both. The
// bytes are stored in host order through memcpy: the arenas carry no alignment promise for
// 16-bit access beyond what the kernels arrange themselves.
template <CodecId kId, uint16_t (*kEncode)(float), float (*kDecode)(uint16_t)>
class Half16Codec final : public Codec {
 public:
  Half16Codec(std::string_view name, int head_dim) : name_(name), head_dim_(head_dim) {}
  CodecId id() const override { return kId; }
  std::string_view name() const override { return name_; }
  int head_dim() const override { return head_dim_; }
  size_t unit_bytes() const override { return sizeof(uint16_t) * head_dim_; }

  void Encode(std::span<const float> src, std::span<std::byte> dst) const override {
    CheckedNumUnits(src.size(), dst.size(), head_dim_, unit_bytes());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t h = kEncode(src[i]);
      std::memcpy(dst.data() + i * sizeof(uint16_t), &h, sizeof(h));
    }
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    CheckedNumUnits(dst.size(), src.size(), head_dim_, unit_bytes());
    for (size_t i = 0; i < dst.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, src.data() + i * sizeof(uint16_t), sizeof(h));
      dst[i] = kDecode(h);
    }
  }

 private:
  std::string_view name_;
  int head_dim_;
};

using F16Codec = Half16Codec<CodecId::kF16, &F32ToF16, &F16ToF32>;
using BF16Codec = Half16Codec<CodecId::kBF16, &F32ToBF16, &BF16ToF32>;

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view name, int head_dim,
                                                   CodecRole role) {
  if (IsLowRankCodecName(name)) {
    KVS_RETURN_IF_ERROR(CheckLowRankCodecName(name));
    return absl::InvalidArgumentError(absl::StrCat(
        "codec '", std::string(name),
        "' needs a calibration profile: give --profile (kvstack calibrate writes one)"));
  }
  KVS_ASSIGN_OR_RETURN(const CodecFormat format, ResolveCodecFormat(name, head_dim, role));
  switch (format.name.id) {
    case CodecId::kF32:
      return std::make_unique<F32Codec>(head_dim);
    case CodecId::kF16:
      return std::make_unique<F16Codec>("f16", head_dim);
    case CodecId::kBF16:
      return std::make_unique<BF16Codec>("bf16", head_dim);
    case CodecId::kFp8E4M3:
    case CodecId::kFp8E5M2:
    case CodecId::kInt8:
      return MakeScaledCodec(format);
    case CodecId::kQ4Absmax:
      return MakeQ4AbsmaxCodec(format);
    case CodecId::kInt4:
    case CodecId::kInt2:
    case CodecId::kKivi4:
    case CodecId::kKivi2:
      return MakeAffineCodec(format);
    case CodecId::kLowRank:  // need a profile: CreateProfiledCodec (lowrank_codec.h)
    case CodecId::kLatent:
      break;
  }
  KVS_CHECK(false && "CreateCodec: a CodecId without a factory");
  return nullptr;
}

absl::Status CheckCodecName(std::string_view name) {
  if (IsLowRankCodecName(name)) return CheckLowRankCodecName(name);
  return ParseCodecName(name).status();
}

std::vector<std::string> CodecNames() { return CodecBaseNames(); }

}  // namespace kvstack
