// Internal to the representation layer: the base class of the quantising codecs and the
// factories CreateCodec dispatches to. A quantising codec is a CodecFormat (codec_name.h)
// plus two per-unit functions; the base class does the naming, the sizes and the loop over
// units, so each format's file holds only its arithmetic.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kvstack/check.h"
#include "kvstack/codec.h"
#include "represent/codec_name.h"

namespace kvstack {

// Checks the shapes shared by every codec's Encode/Decode and returns the number of units.
// Callers are our own code paths; a mismatch is a bug, not user input.
inline size_t CheckedNumUnits(size_t num_floats, size_t num_bytes, size_t unit_floats,
                              size_t unit_bytes) {
  KVS_CHECK(num_floats % unit_floats == 0);
  const size_t num_units = num_floats / unit_floats;
  KVS_CHECK(num_bytes == num_units * unit_bytes);
  return num_units;
}

class QuantCodec : public Codec {
 public:
  explicit QuantCodec(const CodecFormat& format)
      : format_(format), name_(format.name.canonical()) {}

  CodecId id() const override { return format_.name.id; }
  std::string_view name() const override { return name_; }
  int head_dim() const override { return format_.head_dim; }
  int group_tokens() const override { return format_.group_tokens; }
  size_t unit_bytes() const override { return format_.unit_bytes; }
  const CodecFormat& format() const { return format_; }

  void Encode(std::span<const float> src, std::span<std::byte> dst) const final {
    const size_t unit_floats = static_cast<size_t>(format_.group_tokens) * format_.head_dim;
    const size_t num_units = CheckedNumUnits(src.size(), dst.size(), unit_floats, unit_bytes());
    for (size_t u = 0; u < num_units; ++u) {
      EncodeUnit(src.data() + u * unit_floats, dst.data() + u * unit_bytes());
    }
  }
  void Decode(std::span<const std::byte> src, std::span<float> dst) const final {
    const size_t unit_floats = static_cast<size_t>(format_.group_tokens) * format_.head_dim;
    const size_t num_units = CheckedNumUnits(dst.size(), src.size(), unit_floats, unit_bytes());
    for (size_t u = 0; u < num_units; ++u) {
      DecodeUnit(src.data() + u * unit_bytes(), dst.data() + u * unit_floats);
    }
  }

 protected:
  // src: [group_tokens, head_dim] floats; dst: [unit_bytes] bytes (every byte written).
  virtual void EncodeUnit(const float* src, std::byte* dst) const = 0;
  // src: [unit_bytes] bytes (any values); dst: [group_tokens, head_dim] floats.
  virtual void DecodeUnit(const std::byte* src, float* dst) const = 0;

 private:
  CodecFormat format_;
  std::string name_;
};

// int8, fp8_e4m3, fp8_e5m2: one F16 absmax scale per token (scaled_codec.cc).
std::unique_ptr<Codec> MakeScaledCodec(const CodecFormat& format);
// q4_absmax (q4_absmax_codec.cc).
std::unique_ptr<Codec> MakeQ4AbsmaxCodec(const CodecFormat& format);
// int4, int2, kivi4, kivi2: asymmetric F16 (scale, min) per group (affine_codec.cc).
std::unique_ptr<Codec> MakeAffineCodec(const CodecFormat& format);

}  // namespace kvstack
