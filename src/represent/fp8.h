// Scalar conversions between F32 and the two OCP 8-bit float formats the fp8 codecs store:
//   E4M3 ("E4M3FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; NaN is
//                    0x7F / 0xFF; largest finite 448 (0x7E).
//   E5M2:            1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like, with
//                    infinities (0x7C / 0xFC) and NaNs; largest finite 57344 (0x7B).
// Encoding rounds to nearest, ties to even, and SATURATES: every finite value or infinity
// beyond the largest finite magnitude encodes as +-largest finite (so E5M2 never produces
// an infinity code); NaN encodes as 0x7F (a NaN in both formats). Decoding is exact.
// These are the scalar references the SIMD kernels and their lookup tables are tested
// against; both directions are header-only so kernels can build tables from them.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace kvstack {

namespace fp8_internal {

// One 8-bit float format: kExpBits + kMantBits + 1 sign bit == 8.
template <int kExpBits, int kMantBits, bool kHasInf>
struct Fp8Format {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  // Largest finite code (sign bit clear): E4M3FN uses the all-ones exponent for normal
  // numbers except mantissa 111 (NaN); E5M2 reserves the all-ones exponent for Inf/NaN.
  static constexpr uint8_t kMaxCode = kHasInf ? static_cast<uint8_t>(0x7B) : 0x7E;
  static constexpr uint8_t kNanCode = 0x7F;
  static constexpr float kMaxFinite = [] {
    const int max_exp = (1 << kExpBits) - (kHasInf ? 2 : 1) - kBias;
    const int max_mant = (1 << kMantBits) - (kHasInf ? 1 : 2);
    float value = 1.0f + static_cast<float>(max_mant) / (1 << kMantBits);
    for (int e = 0; e < max_exp; ++e) value *= 2.0f;
    return value;
  }();

  static float Decode(uint8_t code) {
    const bool negative = (code & 0x80u) != 0;
    const uint32_t exp = (code >> kMantBits) & ((1u << kExpBits) - 1);
    const uint32_t mant = code & ((1u << kMantBits) - 1);
    float value;
    if (kHasInf && exp == (1u << kExpBits) - 1) {
      value = mant == 0 ? INFINITY : NAN;
    } else if (!kHasInf && (code & 0x7Fu) == 0x7Fu) {
      value = NAN;
    } else if (exp == 0) {  // subnormal: mant * 2^(1 - bias - kMantBits), exact in F32
      value = static_cast<float>(mant) *
              std::bit_cast<float>(static_cast<uint32_t>((127 + 1 - kBias - kMantBits) << 23));
    } else {
      value = std::bit_cast<float>(((exp - kBias + 127) << 23) | (mant << (23 - kMantBits)));
    }
    return negative ? -value : value;
  }

  static uint8_t Encode(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return kNanCode;
    if (std::bit_cast<float>(abs) >= kMaxFinite) return sign | kMaxCode;  // saturate (and Inf)
    constexpr int kMinNormalExp = 1 - kBias;
    const int exp32 = static_cast<int>(abs >> 23) - 127;
    uint32_t code;
    if (exp32 < kMinNormalExp) {
      // Subnormal range: count quanta of 2^(kMinNormalExp - kMantBits), round to nearest
      // even. A result of 2^kMantBits is exactly the smallest normal code, so no fix-up.
      const float quanta =
          std::bit_cast<float>(abs) *
          std::bit_cast<float>(static_cast<uint32_t>((127 - kMinNormalExp + kMantBits) << 23));
      code = static_cast<uint32_t>(quanta);
      const float rest = quanta - static_cast<float>(code);
      code += static_cast<uint32_t>((rest > 0.5f) | ((rest == 0.5f) & (code & 1u)));
    } else {
      // Normal: rebias the exponent, cut the mantissa to kMantBits with round to nearest
      // even; a carry out of the mantissa correctly bumps the exponent.
      constexpr int kDropped = 23 - kMantBits;
      code = (static_cast<uint32_t>(exp32 + kBias) << kMantBits) | ((abs & 0x7fffffu) >> kDropped);
      const uint32_t rest = abs & ((1u << kDropped) - 1);
      const uint32_t half = 1u << (kDropped - 1);
      // Branch-free: up or down is a coin flip on real data, and a branch mispredicts.
      code += static_cast<uint32_t>((rest > half) | ((rest == half) & (code & 1u)));
    }
    return sign | static_cast<uint8_t>(code);
  }

  // Decode(Encode(y)) for finite |y| <= kMaxFinite, with neither branches nor tables, so a
  // loop over it vectorises: the scaled codecs' scale search rounds every element once per
  // candidate scale (scale_search.cc repeats these operations in Highway; its test checks the
  // two pick alike). y is rounded to a multiple of its binade's code spacing 2^(e - kMantBits),
  // e = max(y's exponent, 1 - bias) (the subnormal codes share the smallest normal binade's
  // spacing), by adding and subtracting 1.5 * 2^(e + 23 - kMantBits): the sum has no bits
  // below the spacing, so the FPU rounds it to nearest, ties to even (even = the code's last
  // mantissa bit). A carry into the next binade lands on its first code; nothing in range
  // carries past kMaxFinite. The sign is put back for results of 0, as Decode(Encode) keeps it.
  static constexpr uint32_t kExpMask = 0x7F800000u;
  static constexpr uint32_t kSignMask = 0x80000000u;
  static constexpr uint32_t kMinNormalExpBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  // Added to exponent bits 2^e: 1.5 * 2^(e + 23 - kMantBits).
  static constexpr uint32_t kMagicOffset =
      (static_cast<uint32_t>(23 - kMantBits) << 23) | 0x400000u;
  static float RoundInRange(float y) {
    const uint32_t bits = std::bit_cast<uint32_t>(y);
    const uint32_t exp_bits = std::max(bits & kExpMask, kMinNormalExpBits);
    const float magic = std::bit_cast<float>(exp_bits + kMagicOffset);
    const float rounded = (y + magic) - magic;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(rounded) | (bits & kSignMask));
  }
};

using E4M3 = Fp8Format<4, 3, /*kHasInf=*/false>;
using E5M2 = Fp8Format<5, 2, /*kHasInf=*/true>;

}  // namespace fp8_internal

// Largest finite magnitudes (the codecs' FMAX).
inline constexpr float kFp8E4M3Max = fp8_internal::E4M3::kMaxFinite;  // 448
inline constexpr float kFp8E5M2Max = fp8_internal::E5M2::kMaxFinite;  // 57344
// The NaN code Encode produces for NaN inputs (in both formats).
inline constexpr uint8_t kFp8NanCode = 0x7F;

inline float Fp8E4M3ToF32(uint8_t code) { return fp8_internal::E4M3::Decode(code); }
inline uint8_t F32ToFp8E4M3(float f) { return fp8_internal::E4M3::Encode(f); }
inline float Fp8E5M2ToF32(uint8_t code) { return fp8_internal::E5M2::Decode(code); }
inline uint8_t F32ToFp8E5M2(float f) { return fp8_internal::E5M2::Encode(f); }
// Fp8*ToF32(F32ToFp8*(y)) for finite |y| up to the largest finite value, branch-free.
inline float RoundToFp8E4M3(float y) { return fp8_internal::E4M3::RoundInRange(y); }
inline float RoundToFp8E5M2(float y) { return fp8_internal::E5M2::RoundInRange(y); }

}  // namespace kvstack
