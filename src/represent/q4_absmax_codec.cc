// q4_absmax: llama.cpp's q4_0 idea applied to one token's row, the baseline the asymmetric
// int4 codecs are measured against. Per block of B = min(32, head_dim) elements the signed
// element m of largest magnitude sets d = m / -8 (rounded to F16), so m itself lands exactly
// on code 0 and the 16 codes cover [-8d, 7d]. Unit: [num_blocks x f16 d][codes, 4 bits].
#include <vector>

#include "represent/codec_impl.h"
#include "represent/quant.h"

namespace kvstack {
namespace {

constexpr int kBits = 4;

class Q4AbsmaxCodec final : public QuantCodec {
 public:
  using QuantCodec::QuantCodec;

 private:
  void EncodeUnit(const float* src, std::byte* dst) const override {
    const CodecFormat& f = format();
    thread_local std::vector<uint8_t> codes;  // one code per element, packed at the end
    codes.resize(f.head_dim);
    for (int g = 0; g < f.num_groups; ++g) {
      const float* x = src + g * f.group_size;
      // The first finite element of largest |x|, sign kept (as q4_0 does).
      float absmax = 0.0f;
      float m = 0.0f;
      for (int i = 0; i < f.group_size; ++i) {
        if (std::isfinite(x[i]) && std::fabs(x[i]) > absmax) {
          absmax = std::fabs(x[i]);
          m = x[i];
        }
      }
      const quant::F16Value d = quant::RoundToF16(m / -8.0f);
      quant::StoreF16(dst + 2 * g, d.bits);
      for (int i = 0; i < f.group_size; ++i) {
        float q = 8;  // the code of 0.0: for NaN and for a zero d
        if (d.value != 0.0f && !std::isnan(x[i])) {
          // q4_0's truncation of x / d + 8.5, clamped in float first so that +-Inf (and
          // anything far out) cannot overflow the integer conversion.
          const float v = x[i] / d.value + 8.5f;
          q = quant::Clamp(v, 0.0f, 15.0f);
        }
        codes[static_cast<size_t>(g) * f.group_size + i] = static_cast<uint8_t>(q);
      }
    }
    quant::PackCodes(codes.data(), codes.size(), kBits, dst + f.header_bytes);
  }

  void DecodeUnit(const std::byte* src, float* dst) const override {
    const CodecFormat& f = format();
    const std::byte* codes = src + f.header_bytes;
    for (int g = 0; g < f.num_groups; ++g) {
      const float d = quant::LoadF16(src + 2 * g);
      for (int i = 0; i < f.group_size; ++i) {
        const size_t e = static_cast<size_t>(g) * f.group_size + i;
        dst[e] = (static_cast<float>(quant::GetCode(codes, e, kBits)) - 8.0f) * d;
      }
    }
  }
};

}  // namespace

std::unique_ptr<Codec> MakeQ4AbsmaxCodec(const CodecFormat& format) {
  KVS_CHECK(format.name.id == CodecId::kQ4Absmax);
  return std::make_unique<Q4AbsmaxCodec>(format);
}

}  // namespace kvstack
