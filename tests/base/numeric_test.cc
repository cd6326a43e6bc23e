// Tests of the scalar F16/BF16 conversions in numeric.h: exhaustive round trips over every
// half bit pattern, F32ToF16 against the CPU's own conversion (F16C) on edge cases and millions
// of random floats, and BF16 rounding and NaN handling against values worked out by hand.
#include "kvstack/numeric.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvstack {
namespace {

bool IsF16NaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsBF16NaN(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

TEST(NumericTest, F16RoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = F16ToF32(h);
    if (IsF16NaN(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
      EXPECT_TRUE(IsF16NaN(F32ToF16(f))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << "half bits 0x" << std::hex << bits << " value " << f;
  }
}

TEST(NumericTest, F16ToF32KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

#if defined(__x86_64__)
// CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c").
bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

__attribute__((target("f16c"))) uint16_t HardwareF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// The floats where a conversion is most likely wrong: around the subnormal/normal boundary,
// the overflow boundary, exact ties at every exponent, and the specials.
std::vector<float> EdgeFloats() {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               65504.0f,
                               65519.996f,
                               65520.0f,
                               65536.0f,
                               0x1p-14f,
                               0x1p-24f,
                               0x1p-25f,
                               0x1.8p-25f,
                               0x1p-26f,
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity()};
  // Ties and their neighbours: for every half value, the midpoint to the next half value.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float lo = F16ToF32(static_cast<uint16_t>(h));
    const float hi = F16ToF32(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: one more mantissa bit than half has
    values.push_back(mid);
    values.push_back(std::nextafter(mid, 0.0f));
    values.push_back(std::nextafter(mid, 1e30f));
  }
  // Every float bit pattern around the two boundaries, step by step.
  for (uint32_t bits : {0x38800000u, 0x477ff000u, 0x33000000u}) {
    for (uint32_t d = 0; d < 4096; ++d) {
      values.push_back(std::bit_cast<float>(bits + d));
      values.push_back(std::bit_cast<float>(bits - d));
    }
  }
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) values.push_back(-values[i]);
  return values;
}

TEST(NumericTest, F32ToF16MatchesHardwareOnEdgeCases) {
  if (!CpuHasF16c()) GTEST_SKIP() << "CPU has no F16C";
  for (const float f : EdgeFloats()) {
    ASSERT_EQ(F32ToF16(f), HardwareF32ToF16(f))
        << "float bits 0x" << std::hex << std::bit_cast<uint32_t>(f) << " value " << f;
  }
}

TEST(NumericTest, F32ToF16MatchesHardwareOnRandomFloats) {
  if (!CpuHasF16c()) GTEST_SKIP() << "CPU has no F16C";
  std::mt19937 rng(1234);
  // Uniform bit patterns cover every exponent; a second stream concentrates on the half range.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = (i & 1) ? std::bit_cast<float>(static_cast<uint32_t>(rng())) : in_range(rng);
    if (std::isnan(f)) {
      EXPECT_TRUE(IsF16NaN(F32ToF16(f)));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), HardwareF32ToF16(f))
        << "float bits 0x" << std::hex << std::bit_cast<uint32_t>(f) << " value " << f;
  }
}
#endif  // __x86_64__

TEST(NumericTest, F32ToF16KeepsNaNAndSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsF16NaN(F32ToF16(nan)));
  EXPECT_TRUE(IsF16NaN(F32ToF16(-nan)));
  // A NaN whose payload sits only in the low mantissa bits must not become infinity.
  EXPECT_TRUE(IsF16NaN(F32ToF16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

TEST(NumericTest, BF16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 (even) and 1 + 2^-7 (odd): rounds down.
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(F32ToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above and below a tie go to the nearer value.
  EXPECT_EQ(F32ToBF16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(F32ToBF16(std::nextafter(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3f81);
  EXPECT_EQ(F32ToBF16(-1.0f - 0x1p-8f), 0xbf80);
  // The largest finite float rounds up to infinity, as IEEE round-to-nearest does.
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(NumericTest, BF16KeepsNaNs) {
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::numeric_limits<float>::quiet_NaN())));
  // Payload only in the low 16 bits: truncation alone would give infinity.
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::bit_cast<float>(0xff800001u))));
  // Rounding must not carry a NaN's all-ones mantissa over into the exponent.
  EXPECT_TRUE(IsBF16NaN(F32ToBF16(std::bit_cast<float>(0x7fffffffu))));
  EXPECT_TRUE(std::signbit(BF16ToF32(F32ToBF16(std::bit_cast<float>(0xffc00000u)))));
}

TEST(NumericTest, BF16RoundTripsEveryNonNaNPattern) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    if (IsBF16NaN(b)) {
      EXPECT_TRUE(IsBF16NaN(F32ToBF16(BF16ToF32(b))));
    } else {
      ASSERT_EQ(F32ToBF16(BF16ToF32(b)), b) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace kvstack
