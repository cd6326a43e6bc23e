// Exhaustive tests of the scalar FP8 conversions in src/represent/fp8.h against a
// straightforward reference built from the format definition with std::ldexp.
#include "represent/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvstack/codec.h"

namespace kvstack {
namespace {

struct Fp8Case {
  const char* name;
  int exp_bits;
  int mant_bits;
  bool has_inf;
  float max_finite;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  float (*round)(float);
};

// The format definition, written out as plainly as possible.
float ReferenceDecode(const Fp8Case& c, uint8_t code) {
  const int bias = (1 << (c.exp_bits - 1)) - 1;
  const int exp_all_ones = (1 << c.exp_bits) - 1;
  const int exp = (code >> c.mant_bits) & exp_all_ones;
  const int mant = code & ((1 << c.mant_bits) - 1);
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (c.has_inf && exp == exp_all_ones) {
    return mant == 0 ? sign * std::numeric_limits<float>::infinity()
                     : std::numeric_limits<float>::quiet_NaN();
  }
  if (!c.has_inf && exp == exp_all_ones && mant == (1 << c.mant_bits) - 1) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - bias - c.mant_bits);
  return sign * std::ldexp(1.0f + std::ldexp(static_cast<float>(mant), -c.mant_bits), exp - bias);
}

class Fp8Test : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8Test, DecodesEveryCodeLikeTheReference) {
  const Fp8Case& c = GetParam();
  int num_nan = 0;
  for (int code = 0; code < 256; ++code) {
    const float expected = ReferenceDecode(c, static_cast<uint8_t>(code));
    const float actual = c.decode(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << "code " << code;
      ++num_nan;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(actual), std::bit_cast<uint32_t>(expected))
          << "code " << code << ": " << actual << " vs " << expected;
    }
  }
  EXPECT_EQ(num_nan, c.has_inf ? 6 : 2);  // E5M2: 3 NaN mantissas x 2 signs; E4M3FN: 0x7F/0xFF
  EXPECT_EQ(c.decode(c.has_inf ? 0x7B : 0x7E), c.max_finite);
  EXPECT_EQ(c.has_inf ? kFp8E5M2Max : kFp8E4M3Max, c.max_finite);
}

TEST_P(Fp8Test, EncodeInvertsDecodeForEveryFiniteCode) {
  const Fp8Case& c = GetParam();
  for (int code = 0; code < 256; ++code) {
    const float value = c.decode(static_cast<uint8_t>(code));
    if (!std::isfinite(value)) continue;  // NaN codes, and E5M2 infinities (saturated below)
    EXPECT_EQ(c.encode(value), code) << "value " << value;
  }
}

TEST_P(Fp8Test, RoundsToNearestEvenAndIsMonotonic) {
  const Fp8Case& c = GetParam();
  // Walk the positive finite codes in order; between neighbours a and a+1 the midpoint goes
  // to the even code, points just off the midpoint to the nearer code.
  for (int code = 0; code < 0x7F; ++code) {
    const float lo = c.decode(static_cast<uint8_t>(code));
    const float hi = c.decode(static_cast<uint8_t>(code + 1));
    if (!std::isfinite(hi)) break;
    const float mid = 0.5f * (lo + hi);
    const int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(c.encode(mid), even) << "tie between " << lo << " and " << hi;
    EXPECT_EQ(c.encode(-mid), 0x80 | even);
    EXPECT_EQ(c.encode(std::nextafter(mid, 0.0f)), code);
    EXPECT_EQ(c.encode(std::nextafter(mid, INFINITY)), code + 1);
  }
  // Monotonic over a dense sweep of magnitudes.
  uint8_t previous = 0;
  for (float x = 0.0f; x < 2.0f * c.max_finite; x = x * 1.001f + 1e-6f) {
    const uint8_t code = c.encode(x);
    EXPECT_GE(code, previous) << "x " << x;
    previous = code;
  }
}

TEST_P(Fp8Test, SaturatesAndKeepsNan) {
  const Fp8Case& c = GetParam();
  const uint8_t max_code = c.has_inf ? 0x7B : 0x7E;
  EXPECT_EQ(c.encode(c.max_finite), max_code);
  EXPECT_EQ(c.encode(c.max_finite * 1.2f), max_code);
  EXPECT_EQ(c.encode(std::numeric_limits<float>::infinity()), max_code);
  EXPECT_EQ(c.encode(-std::numeric_limits<float>::infinity()), 0x80 | max_code);
  EXPECT_EQ(c.encode(std::numeric_limits<float>::quiet_NaN()), kFp8NanCode);
  EXPECT_TRUE(std::isnan(c.decode(kFp8NanCode)));
  EXPECT_EQ(c.encode(-0.0f), 0x80);
  EXPECT_EQ(c.encode(std::numeric_limits<float>::denorm_min()), 0x00);  // rounds to zero
}

// The branch-free rounding the scale search uses must be Decode(Encode(y)) over the whole
// finite range: at every code, every midpoint (ties) and its neighbours, and a dense sweep.
TEST_P(Fp8Test, RoundInRangeIsDecodeOfEncode) {
  const Fp8Case& c = GetParam();
  auto expect_same = [&](float y) {
    if (!(std::fabs(y) <= c.max_finite)) return;
    const float expected = c.decode(c.encode(y));
    EXPECT_EQ(c.round(y), expected) << "y " << y;
  };
  for (int code = 0; code < 0x7F; ++code) {
    const float lo = c.decode(static_cast<uint8_t>(code));
    const float hi = c.decode(static_cast<uint8_t>(code + 1));
    if (!std::isfinite(hi)) break;
    const float mid = 0.5f * (lo + hi);
    for (const float y : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                          std::nextafter(lo, INFINITY), std::nextafter(hi, 0.0f)}) {
      expect_same(y);
      expect_same(-y);
    }
  }
  expect_same(c.max_finite);
  for (float y = 1e-9f; y <= c.max_finite; y = y * 1.0003f + 1e-12f) {
    expect_same(y);
    expect_same(-y);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test,
                         ::testing::Values(Fp8Case{"E4M3", 4, 3, false, 448.0f, &Fp8E4M3ToF32,
                                                   &F32ToFp8E4M3, &RoundToFp8E4M3},
                                           Fp8Case{"E5M2", 5, 2, true, 57344.0f, &Fp8E5M2ToF32,
                                                   &F32ToFp8E5M2, &RoundToFp8E5M2}),
                         [](const auto& info) { return std::string(info.param.name); });

// The fp8 codecs' F16 scale: E5M2's FMAX is 57344, so absmax / FMAX is an F16 subnormal for
// any token with absmax below 3.5 and 0 below about 0.0017. The scale is floored at F16's
// smallest normal instead, and small tokens keep the elements' own relative precision.
TEST(Fp8CodecScaleTest, SmallTokensKeepTheirRelativePrecision) {
  for (const char* name : {"fp8_e5m2", "fp8_e4m3"}) {
    auto codec = CreateCodec(name, 8);
    ASSERT_TRUE(codec.ok()) << codec.status();
    // Half a step of the element's mantissa: 2 bits (E5M2) or 3 bits (E4M3).
    const float tolerance = std::string(name) == "fp8_e5m2" ? 0.125f : 0.0625f;
    for (float absmax : {3.0f, 0.1f, 1e-3f, 1e-4f}) {
      const std::vector<float> row = {absmax,         -0.5f * absmax, 0.25f * absmax,
                                      -0.7f * absmax, 0.9f * absmax,  -0.3f * absmax,
                                      0.6f * absmax,  -0.8f * absmax};
      std::vector<std::byte> unit((*codec)->unit_bytes());
      std::vector<float> back(row.size());
      (*codec)->Encode(row, unit);
      (*codec)->Decode(unit, back);
      for (size_t i = 0; i < row.size(); ++i) {
        EXPECT_NEAR(back[i], row[i], tolerance * std::fabs(row[i]))
            << name << " absmax " << absmax << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvstack
