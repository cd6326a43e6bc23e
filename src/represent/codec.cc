// The plain floating-point codecs (F32, F16, BF16) and the by-name factory. These are the
// reference formats: one scalar conversion per element from numeric.h, no scales, no
// calibration. Quantising codecs join the registry table below.
#include "kvstack/codec.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvstack/check.h"
#include "kvstack/numeric.h"

namespace kvstack {
namespace {

constexpr int kMaxHeadDim = 4096;

// Checks the shapes shared by every codec's Encode/Decode and returns the number of rows.
// Callers are our own code paths; a mismatch is a bug, not user input.
size_t CheckedNumRows(size_t num_floats, size_t num_bytes, int head_dim, size_t unit_bytes) {
  KVS_CHECK(num_floats % static_cast<size_t>(head_dim) == 0);
  const size_t num_rows = num_floats / static_cast<size_t>(head_dim);
  KVS_CHECK(num_bytes == num_rows * unit_bytes);
  return num_rows;
}

class F32Codec final : public Codec {
 public:
  explicit F32Codec(int head_dim) : head_dim_(head_dim) {}
  CodecId id() const override { return CodecId::kF32; }
  std::string_view name() const override { return "f32"; }
  int head_dim() const override { return head_dim_; }
  size_t unit_bytes() const override { return sizeof(float) * head_dim_; }

  void Encode(std::span<const float> src, std::span<std::byte> dst) const override {
    CheckedNumRows(src.size(), dst.size(), head_dim_, unit_bytes());
    if (!src.empty()) std::memcpy(dst.data(), src.data(), dst.size());
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    CheckedNumRows(dst.size(), src.size(), head_dim_, unit_bytes());
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
    CheckedNumRows(src.size(), dst.size(), head_dim_, unit_bytes());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t h = kEncode(src[i]);
      std::memcpy(dst.data() + i * sizeof(uint16_t), &h, sizeof(h));
    }
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    CheckedNumRows(dst.size(), src.size(), head_dim_, unit_bytes());
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

struct CodecEntry {
  std::string_view name;
  std::unique_ptr<Codec> (*make)(int head_dim);
};

// The registry: the one place a codec is named. Order is the stable order CodecNames reports.
constexpr CodecEntry kCodecs[] = {
    {"f32",
     [](int head_dim) -> std::unique_ptr<Codec> { return std::make_unique<F32Codec>(head_dim); }},
    {"f16",
     [](int head_dim) -> std::unique_ptr<Codec> {
       return std::make_unique<F16Codec>("f16", head_dim);
     }},
    {"bf16",
     [](int head_dim) -> std::unique_ptr<Codec> {
       return std::make_unique<BF16Codec>("bf16", head_dim);
     }},
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> CreateCodec(std::string_view name, int head_dim,
                                                   CodecRole role) {
  for (const CodecEntry& entry : kCodecs) {
    if (entry.name != name) continue;
    if (head_dim < 1 || head_dim > kMaxHeadDim) {
      return absl::InvalidArgumentError(absl::StrCat("codec '", std::string(name), "': head_dim ",
                                                     head_dim, " is out of range; allowed: 1..",
                                                     kMaxHeadDim));
    }
    return entry.make(head_dim);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", std::string(name), "'; allowed: ", absl::StrJoin(CodecNames(), ", ")));
}

std::vector<std::string> CodecNames() {
  std::vector<std::string> names;
  for (const CodecEntry& entry : kCodecs) names.emplace_back(entry.name);
  return names;
}

}  // namespace kvstack
