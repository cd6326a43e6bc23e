// The symmetric one-scale-per-token codecs: int8 and the two fp8 formats. A unit is one
// token: [f16 scale][head_dim x 8-bit code], scale = finite absmax / FMAX rounded to F16,
// code = Q(x / scale) (int8: round to nearest even and clamp to +-127; fp8: RNE, saturating).
// The three differ only in FMAX, the 8-bit element conversion and the smallest scale, so one
// template serves. The token's absmax lands on the element's largest code, so the largest
// element (much of a short row's energy) is stored exactly. fp8 scales stay F16 normals
// (>= 2^-14): E5M2's FMAX of 57344 would otherwise make the scale of any token with absmax
// below 3.5 a subnormal, and flush it to 0 (every element lost) below absmax 0.0017. So the
// target is halved (FMAX / 2^k, still an exact code) until the scale is normal; a floating
// element keeps its relative precision at the smaller magnitudes. int8 codes would lose
// levels, so int8 keeps the plain absmax / 127 (its scale is subnormal only below 0.008).
#include <array>
#include <cstdint>

#include "represent/codec_impl.h"
#include "represent/fp8.h"
#include "represent/quant.h"

namespace kvstack {
namespace {

struct Int8Element {
  static constexpr float kMax = 127.0f;
  static constexpr float kMinScale = 0.0f;
  // NaN -> 0 (the code of 0.0), +-Inf -> +-127 via the clamp.
  static uint8_t Encode(float x) {
    if (std::isnan(x)) return 0;
    const float q = quant::RoundHalfEven(quant::Clamp(x, -kMax, kMax));
    return static_cast<uint8_t>(static_cast<int8_t>(q));
  }
  static float Decode(uint8_t code) { return static_cast<float>(static_cast<int8_t>(code)); }
};

template <uint8_t (*kEncode)(float), float (*kDecode)(uint8_t), const float& kFmax>
struct Fp8Element {
  static constexpr float kMax = kFmax;
  static constexpr float kMinScale = 0x1p-14f;  // F16's smallest normal
  static uint8_t Encode(float x) { return kEncode(x); }
  static float Decode(uint8_t code) { return kDecode(code); }
};

using E4M3Element = Fp8Element<&F32ToFp8E4M3, &Fp8E4M3ToF32, kFp8E4M3Max>;
using E5M2Element = Fp8Element<&F32ToFp8E5M2, &Fp8E5M2ToF32, kFp8E5M2Max>;

template <typename Element>
class ScaledCodec final : public QuantCodec {
 public:
  explicit ScaledCodec(const CodecFormat& format) : QuantCodec(format) {
    // 256 codes: a table is cheaper than decoding fp8 bit fields per element.
    for (int code = 0; code < 256; ++code) {
      decode_table_[code] = Element::Decode(static_cast<uint8_t>(code));
    }
  }

 private:
  void EncodeUnit(const float* src, std::byte* dst) const override {
    const int head_dim = format().head_dim;
    const float absmax = quant::FiniteAbsMax(src, head_dim);
    float target = Element::kMax;
    while (target > 1.0f && absmax / target < Element::kMinScale) target *= 0.5f;
    const quant::F16Value scale = quant::RoundToF16(absmax / target);
    quant::StoreF16(dst, scale.bits);
    std::byte* codes = dst + 2;
    for (int c = 0; c < head_dim; ++c) {
      // A scale that rounded to 0 (all zeros, or too small for F16) would divide by zero:
      // finite elements get code 0, NaN and +-Inf their own codes as usual.
      const float x = src[c];
      const uint8_t code = scale.value > 0.0f ? Element::Encode(x / scale.value)
                           : std::isfinite(x) ? 0
                                              : Element::Encode(x);
      codes[c] = static_cast<std::byte>(code);
    }
  }

  void DecodeUnit(const std::byte* src, float* dst) const override {
    const float scale = quant::LoadF16(src);
    const std::byte* codes = src + 2;
    for (int c = 0; c < format().head_dim; ++c) {
      dst[c] = decode_table_[std::to_integer<uint8_t>(codes[c])] * scale;
    }
  }

  std::array<float, 256> decode_table_;
};

}  // namespace

std::unique_ptr<Codec> MakeScaledCodec(const CodecFormat& format) {
  switch (format.name.id) {
    case CodecId::kInt8:
      return std::make_unique<ScaledCodec<Int8Element>>(format);
    case CodecId::kFp8E4M3:
      return std::make_unique<ScaledCodec<E4M3Element>>(format);
    case CodecId::kFp8E5M2:
      return std::make_unique<ScaledCodec<E5M2Element>>(format);
    default:
      KVS_CHECK(false && "MakeScaledCodec: not a scaled codec");
      return nullptr;
  }
}

}  // namespace kvstack
