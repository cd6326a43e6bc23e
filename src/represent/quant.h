// The pieces every quantising codec shares, in one place: F16 storage of scales and
// minimums (rounded first, so encode and decode use the same value), packing of b-bit codes,
// the asymmetric min/max quantiser of the int and kivi codecs, and the finite-only absmax of
// the symmetric ones. Scalar references; the SIMD kernels decode the same bytes.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvstack/numeric.h"

namespace kvstack::quant {

// v clamped to [lo, hi] with plain compares (std::fmin/fmax are library calls on baseline
// x86-64). v must not be NaN; +-Inf clamp.
inline float Clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Round to nearest, ties to even, for |v| <= 2^22 (every code range here): adding 1.5 * 2^23
// leaves no fraction bits, so the FPU's default rounding does the work. std::nearbyint is a
// library call on baseline x86-64 and was most of the encode time.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 0x1.8p23f;
  return (v + kMagic) - kMagic;
}

// A scale or minimum as stored: the F16 bits and the value they decode to.
struct F16Value {
  uint16_t bits = 0;
  float value = 0.0f;
};

// Rounds to F16 (nearest even), saturating at +-65504 instead of overflowing to infinity:
// a stored infinite scale would turn every code of its group into Inf or NaN.
inline F16Value RoundToF16(float x) {
  constexpr float kF16Max = 65504.0f;
  const uint16_t bits = F32ToF16(Clamp(x, -kF16Max, kF16Max));
  return {bits, F16ToF32(bits)};
}

inline void StoreF16(std::byte* dst, uint16_t bits) {
  dst[0] = static_cast<std::byte>(bits & 0xffu);
  dst[1] = static_cast<std::byte>(bits >> 8);
}
inline float LoadF16(const std::byte* src) {
  return F16ToF32(static_cast<uint16_t>(std::to_integer<uint16_t>(src[0]) |
                                        (std::to_integer<uint16_t>(src[1]) << 8)));
}

// Blocks of b-bit codes (b in {2, 4}): code e sits in byte e * b / 8 at bit offset
// (e * b) % 8, low bits first; the block is padded to whole bytes with zero bits.
// PackCodes writes all ceil(n * b / 8) bytes from n codes q[0..n) (each < 2^b). Codecs fill
// a byte-per-code scratch first and pack once: read-modify-writing each byte per code chains
// every element through store forwarding.
inline void PackCodes(const uint8_t* q, size_t n, int bits, std::byte* codes) {
  const size_t per_byte = 8 / bits;
  for (size_t i = 0; i * per_byte < n; ++i) {
    unsigned byte = 0;
    for (size_t k = 0; k < per_byte && i * per_byte + k < n; ++k) {
      byte |= static_cast<unsigned>(q[i * per_byte + k]) << (k * bits);
    }
    codes[i] = static_cast<std::byte>(byte);
  }
}
inline unsigned GetCode(const std::byte* codes, size_t e, int bits) {
  return (std::to_integer<unsigned>(codes[e * bits / 8]) >> ((e * bits) % 8)) & ((1u << bits) - 1);
}

// Asymmetric quantisation of one group to codes 0..2^bits - 1: min and scale are taken over
// the finite elements only and rounded to F16 first. Decode: q * scale + min.
struct Affine {
  F16Value scale;
  F16Value min;
  float max_code = 0.0f;

  // Quantises one element with the stored (rounded) scale and min. NaN gets the code of 0.0;
  // +-Inf the largest / smallest code; a zero scale (constant group) code 0.
  unsigned Code(float x) const {
    if (std::isnan(x)) x = 0.0f;
    if (!(scale.value > 0.0f)) return 0;
    return static_cast<unsigned>(
        RoundHalfEven(Clamp((x - min.value) / scale.value, 0.0f, max_code)));
  }
};

// Decodes one asymmetric code (the same expression the kernels evaluate).
inline float AffineValue(unsigned q, float scale, float min) {
  return static_cast<float>(q) * scale + min;
}

// Finds min and max over the finite values x[0], x[stride], ... (count of them) and makes
// the group's stored parameters. A group with no finite values gets scale 0, min 0.
inline Affine MakeAffine(const float* x, size_t count, size_t stride, int bits) {
  float lo = INFINITY;
  float hi = -INFINITY;
  for (size_t i = 0; i < count; ++i) {
    const float v = x[i * stride];
    if (!std::isfinite(v)) continue;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  Affine affine;
  affine.max_code = static_cast<float>((1 << bits) - 1);
  if (lo > hi) return affine;  // no finite element
  affine.min = RoundToF16(lo);
  affine.scale = RoundToF16((hi - lo) / affine.max_code);
  return affine;
}

// The largest |x| over the finite elements of x[0..count); 0 when there are none.
inline float FiniteAbsMax(const float* x, size_t count) {
  float absmax = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    const float mag = std::fabs(x[i]);
    if (std::isfinite(mag) && mag > absmax) absmax = mag;
  }
  return absmax;
}

}  // namespace kvstack::quant
