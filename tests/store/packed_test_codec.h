// PackedF32Codec: a lossless test codec whose units hold several tokens. It stores T tokens of
// F32 plus a checksum, so a unit encoded before all its tokens arrived, or read at the wrong
// address, decodes to NaN. Injected through KvCacheOptions::codec_factory under the names of
// registered codecs (Factory), it lets the cache suites check multi-token units exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvstack/check.h"
#include "kvstack/codec.h"
#include "kvstack/kv_cache.h"

namespace kvstack::cache_test {

class PackedF32Codec final : public Codec {
 public:
  PackedF32Codec(int head_dim, int group_tokens)
      : head_dim_(head_dim),
        group_tokens_(group_tokens),
        name_("packed" + std::to_string(group_tokens)) {}
  CodecId id() const override { return CodecId::kF32; }
  std::string_view name() const override { return name_; }
  int head_dim() const override { return head_dim_; }
  int group_tokens() const override { return group_tokens_; }
  size_t unit_bytes() const override { return UnitFloats() * sizeof(float) + sizeof(uint32_t); }

  void Encode(std::span<const float> src, std::span<std::byte> dst) const override {
    const size_t num_units = NumUnits(src.size(), dst.size());
    for (size_t u = 0; u < num_units; ++u) {
      const float* floats = src.data() + u * UnitFloats();
      std::byte* out = dst.data() + u * unit_bytes();
      std::memcpy(out, floats, UnitFloats() * sizeof(float));
      const uint32_t sum = Checksum(floats);
      std::memcpy(out + UnitFloats() * sizeof(float), &sum, sizeof(sum));
    }
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const override {
    const size_t num_units = NumUnits(dst.size(), src.size());
    for (size_t u = 0; u < num_units; ++u) {
      float* floats = dst.data() + u * UnitFloats();
      const std::byte* in = src.data() + u * unit_bytes();
      std::memcpy(floats, in, UnitFloats() * sizeof(float));
      uint32_t sum;
      std::memcpy(&sum, in + UnitFloats() * sizeof(float), sizeof(sum));
      if (sum != Checksum(floats)) std::fill_n(floats, UnitFloats(), std::nanf(""));
    }
  }

 private:
  size_t UnitFloats() const { return static_cast<size_t>(group_tokens_) * head_dim_; }
  size_t NumUnits(size_t num_floats, size_t num_bytes) const {
    KVS_CHECK(num_floats % UnitFloats() == 0);
    KVS_CHECK(num_bytes == num_floats / UnitFloats() * unit_bytes());
    return num_floats / UnitFloats();
  }
  // Position-weighted and offset by one, so an all-zero (never written) unit fails too.
  uint32_t Checksum(const float* floats) const {
    uint32_t sum = 1;
    for (size_t i = 0; i < UnitFloats(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &floats[i], sizeof(bits));
      sum = sum * 31 + bits * static_cast<uint32_t>(i + 7);
    }
    return sum;
  }

  int head_dim_;
  int group_tokens_;
  std::string name_;
};

// Codec names served by PackedF32Codec with that many tokens per unit; others: CreateCodec.
using PackedNames = std::map<std::string, int>;

inline auto Factory(PackedNames packed) {
  return [packed](std::string_view name, int head_dim,
                  CodecRole role) -> absl::StatusOr<std::unique_ptr<Codec>> {
    auto it = packed.find(std::string(name));
    if (it != packed.end()) return std::make_unique<PackedF32Codec>(head_dim, it->second);
    return CreateCodec(name, head_dim, role);
  };
}

}  // namespace kvstack::cache_test
