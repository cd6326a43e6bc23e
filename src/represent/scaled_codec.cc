// The symmetric one-scale-per-token codecs: int8 and the two fp8 formats. A unit is one
// token: [f16 scale][head_dim x 8-bit code], code = Q(x / scale) (int8: round to nearest
// even and clamp to +-127; fp8: RNE, saturating). The three differ only in FMAX, the 8-bit
// element conversion and the smallest scale, so one template serves.
//
// The scale is chosen per token by a search, not fixed at absmax / FMAX. Rounding an element
// to a code loses up to half a code step; where the row's elements fall between the codes
// (the grid's phase) depends on the scale, and with short rows (stories260K's head_dim is 8)
// a row-wide choice of phase pays: the candidates are absmax / target * 2^(j / K), j < K,
// each rounded to F16 as stored, and the one whose decoded row has the least squared error
// is kept. For fp8 the candidates span one octave, every phase there is (a factor of 2 only
// moves the row by one exponent); for int8 a larger scale also coarsens the grid, so the
// gain is smaller. No candidate is below absmax / target (the smallest is rounded UP to F16),
// so the absmax never saturates; the first candidate is that plain scale, so the search is
// never worse than it. On N(0, 1) rows the squared error falls to 0.39x (E4M3) and 0.66x
// (int8) of the plain scale's at head_dim 8, 0.76x and 0.97x at 128. On stories260K (ctx
// 512, against the F32 cache): E4M3 keys and values +1.99 % -> +0.80 % ΔPPL, int8 +0.165 %
// -> +0.127 % (mean KL 1.5e-3 -> 1.0e-3), E5M2 +9.6 % -> +5.2 %. The search itself is in
// scale_search.cc (a Highway kernel scores the K candidates in one pass over the row; what it
// costs: docs/representation-results.md). The stored format is unchanged, so the decoders
// and every SIMD reader are untouched.
//
// fp8 scales stay F16 normals (>= 2^-14): E5M2's FMAX of 57344 would otherwise make the scale
// of any token with absmax below 3.5 a subnormal, and flush it to 0 (every element lost)
// below absmax 0.0017. So the target is halved (FMAX / 2^k, still an exact code) until the
// scale is normal; a floating element keeps its relative precision at the smaller
// magnitudes. int8 codes would lose levels, so int8's target stays 127 (its scale is
// subnormal only below absmax 0.008).
#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvstack/status.h"
#include "represent/codec_impl.h"
#include "represent/fp8.h"
#include "represent/quant.h"
#include "represent/scale_search.h"

namespace kvstack {
namespace {

// An element format: its codes, and the grid the scale search rounds to (scale_search.h).
struct Int8Element {
  static constexpr ScaledGrid kGrid = ScaledGrid::kInt8;
  static constexpr float kMax = 127.0f;
  // NaN -> 0 (the code of 0.0), +-Inf -> +-127 via the clamp.
  static uint8_t Encode(float x) {
    if (std::isnan(x)) return 0;
    const float q = quant::RoundHalfEven(quant::Clamp(x, -kMax, kMax));
    return static_cast<uint8_t>(static_cast<int8_t>(q));
  }
  static float Decode(uint8_t code) { return static_cast<float>(static_cast<int8_t>(code)); }
};

template <ScaledGrid kGridId, uint8_t (*kEncode)(float), float (*kDecode)(uint8_t)>
struct Fp8Element {
  static constexpr ScaledGrid kGrid = kGridId;
  static uint8_t Encode(float x) { return kEncode(x); }
  static float Decode(uint8_t code) { return kDecode(code); }
};

using E4M3Element = Fp8Element<ScaledGrid::kFp8E4M3, &F32ToFp8E4M3, &Fp8E4M3ToF32>;
using E5M2Element = Fp8Element<ScaledGrid::kFp8E5M2, &F32ToFp8E5M2, &Fp8E5M2ToF32>;

template <typename Element>
class ScaledCodec final : public QuantCodec {
 public:
  ScaledCodec(const CodecFormat& format, ScaleSearch search) : QuantCodec(format), search_(search) {
    // 256 codes: a table is cheaper than decoding fp8 bit fields per element.
    for (int code = 0; code < 256; ++code) {
      decode_table_[code] = Element::Decode(static_cast<uint8_t>(code));
    }
  }

 private:
  void EncodeUnit(const float* src, std::byte* dst) const override {
    const int head_dim = format().head_dim;
    const quant::F16Value scale =
        ChooseScale(Element::kGrid, {src, static_cast<size_t>(head_dim)}, search_);
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
  ScaleSearch search_;
};

std::unique_ptr<Codec> MakeScaledCodecWith(const CodecFormat& format, ScaleSearch search) {
  switch (format.name.id) {
    case CodecId::kInt8:
      return std::make_unique<ScaledCodec<Int8Element>>(format, search);
    case CodecId::kFp8E4M3:
      return std::make_unique<ScaledCodec<E4M3Element>>(format, search);
    case CodecId::kFp8E5M2:
      return std::make_unique<ScaledCodec<E5M2Element>>(format, search);
    default:
      return nullptr;
  }
}

}  // namespace

std::unique_ptr<Codec> MakeScaledCodec(const CodecFormat& format) {
  std::unique_ptr<Codec> codec = MakeScaledCodecWith(format, ScaleSearch::kSimd);
  KVS_CHECK(codec != nullptr && "MakeScaledCodec: not a scaled codec");
  return codec;
}

absl::StatusOr<std::unique_ptr<Codec>> CreateScaledCodec(std::string_view name, int head_dim,
                                                         ScaleSearch search) {
  KVS_ASSIGN_OR_RETURN(const CodecFormat format,
                       ResolveCodecFormat(name, head_dim, CodecRole::kKey));
  std::unique_ptr<Codec> codec = MakeScaledCodecWith(format, search);
  if (codec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec '", std::string(name), "' has no scale search: allowed int8, fp8_e4m3, fp8_e5m2"));
  }
  return codec;
}

}  // namespace kvstack
