// The scaled codecs (fp8_e4m3, fp8_e5m2, int8) choose each token's F16 scale by a search at
// encode time (scaled_codec.cc). These tests check what the search promises against a plain
// reference written here from the format contract: the decoded row's squared error is never
// worse than with the plain scale (the smallest F16 value at which the token's absmax does
// not saturate), the absmax never saturates, the scale stays within one octave above the
// plain one, and fp8 scales stay F16 normals. Rows: random, outlier channels, and the
// adversarial ones (all zeros, one huge element, subnormal-range magnitudes, non-finite).
// The codecs search with a Highway kernel; SimdMatchesScalarReference checks it picks the
// scalar reference's scale (and so writes its bytes) on these rows and on rows built to
// expose any difference in rounding, at head_dim 8, 64, 128 and odd sizes around them.
#include "represent/scale_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kvstack/codec.h"
#include "kvstack/numeric.h"
#include "represent/fp8.h"

namespace kvstack {
namespace {

struct Format {
  const char* name;
  float fmax;
  bool fp8_normal_scale;  // fp8: the target is halved until the scale is an F16 normal
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};

uint8_t Int8Encode(float x) {
  if (std::isnan(x)) return 0;
  const float clamped = std::fmin(std::fmax(x, -127.0f), 127.0f);
  return static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(clamped)));
}
float Int8Decode(uint8_t code) { return static_cast<float>(static_cast<int8_t>(code)); }

const Format kFormats[] = {
    {"fp8_e4m3", 448.0f, true, &Fp8E4M3ToF32, &F32ToFp8E4M3},
    {"fp8_e5m2", 57344.0f, true, &Fp8E5M2ToF32, &F32ToFp8E5M2},
    {"int8", 127.0f, false, &Int8Decode, &Int8Encode},
};

ScaledGrid GridOf(const Format& f) {
  const std::string name = f.name;
  return name == "int8"       ? ScaledGrid::kInt8
         : name == "fp8_e4m3" ? ScaledGrid::kFp8E4M3
                              : ScaledGrid::kFp8E5M2;
}

float FiniteAbsMax(const std::vector<float>& row) {
  float absmax = 0.0f;
  for (const float x : row) {
    if (std::isfinite(x)) absmax = std::fmax(absmax, std::fabs(x));
  }
  return absmax;
}

// The code range the token's absmax is mapped to: FMAX, halved for fp8 while the scale
// would be below F16's smallest normal (down to 1: smaller tokens get subnormal scales).
float Target(const Format& f, float absmax) {
  float target = f.fmax;
  while (f.fp8_normal_scale && target > 1.0f && absmax / target < 0x1p-14f) target *= 0.5f;
  return target;
}

// The plain scale: absmax / target rounded up to F16 (so the absmax does not saturate),
// at most F16's largest finite value 65504.
float PlainScale(const Format& f, float absmax) {
  constexpr uint16_t kF16MaxBits = 0x7BFF;
  const float floor = absmax / Target(f, absmax);
  if (floor >= 65504.0f) return 65504.0f;
  uint16_t bits = F32ToF16(floor);
  if (F16ToF32(bits) < floor && bits < kF16MaxBits) ++bits;
  return F16ToF32(bits);
}

// Squared error over the finite elements of `row` decoded as `decoded`.
double SquaredError(const std::vector<float>& row, const std::vector<float>& decoded) {
  double error = 0.0;
  for (size_t i = 0; i < row.size(); ++i) {
    if (!std::isfinite(row[i])) continue;
    const double d = static_cast<double>(decoded[i]) - row[i];
    error += d * d;
  }
  return error;
}

// The row encoded with the plain scale and decoded, by the format contract.
std::vector<float> PlainRoundTrip(const Format& f, const std::vector<float>& row) {
  const float scale = PlainScale(f, FiniteAbsMax(row));
  std::vector<float> decoded(row.size());
  for (size_t i = 0; i < row.size(); ++i) {
    const uint8_t code =
        scale > 0.0f ? f.encode(row[i] / scale) : (std::isfinite(row[i]) ? 0 : f.encode(row[i]));
    decoded[i] = f.decode(code) * scale;
  }
  return decoded;
}

struct Encoded {
  float scale;
  uint16_t scale_bits;
  std::vector<float> decoded;
};

Encoded RoundTrip(const Codec& codec, const std::vector<float>& row) {
  std::vector<std::byte> unit(codec.unit_bytes());
  codec.Encode(row, unit);
  Encoded out;
  out.scale_bits = static_cast<uint16_t>(std::to_integer<uint16_t>(unit[0]) |
                                         (std::to_integer<uint16_t>(unit[1]) << 8));
  out.scale = F16ToF32(out.scale_bits);
  out.decoded.resize(row.size());
  codec.Decode(unit, out.decoded);
  return out;
}

// Rows of head_dim elements: normal, outlier channels, and the adversarial kinds.
std::vector<std::vector<float>> Rows(int head_dim) {
  std::mt19937 rng(1234 + head_dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  auto random_row = [&](float magnitude) {
    std::vector<float> row(head_dim);
    for (float& x : row) x = magnitude * normal(rng);
    return row;
  };
  for (int i = 0; i < 200; ++i) rows.push_back(random_row(std::exp2(normal(rng) * 3.0f)));
  for (int i = 0; i < 20; ++i) {  // two outlier channels 20x larger
    std::vector<float> row = random_row(1.0f);
    row[1 % head_dim] *= 20.0f;
    row[head_dim / 2] *= 20.0f;
    rows.push_back(row);
  }
  rows.push_back(std::vector<float>(head_dim, 0.0f));
  for (const float huge : {1e4f, 3e6f, 1e9f}) {  // one huge element among small ones
    std::vector<float> row = random_row(1e-3f);
    row[head_dim - 1] = -huge;
    rows.push_back(row);
  }
  for (const float tiny : {1e-3f, 1e-5f, 6e-8f, 1e-9f, 1e-20f}) {  // F16 and fp8 subnormal range
    rows.push_back(random_row(tiny));
  }
  for (const float special :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> row = random_row(2.0f);
    row[0] = special;
    rows.push_back(row);
  }
  std::vector<float> constant(head_dim, 0.3f);  // every element on the absmax
  rows.push_back(constant);
  return rows;
}

class ScaleSearchTest : public ::testing::TestWithParam<std::tuple<Format, int>> {};

TEST_P(ScaleSearchTest, NeverWorseThanThePlainScaleAndNeverSaturates) {
  const auto& [format, head_dim] = GetParam();
  auto codec = CreateCodec(format.name, head_dim);
  ASSERT_TRUE(codec.ok()) << codec.status();
  int row_index = 0;
  for (const std::vector<float>& row : Rows(head_dim)) {
    SCOPED_TRACE(::testing::Message() << format.name << " row " << row_index++);
    const float absmax = FiniteAbsMax(row);
    const float plain = PlainScale(format, absmax);
    const Encoded got = RoundTrip(**codec, row);
    const double plain_error = SquaredError(row, PlainRoundTrip(format, row));
    const double error = SquaredError(row, got.decoded);
    // The codec compares candidates by float sums; allow their rounding.
    EXPECT_LE(error, plain_error * (1.0 + 1e-5)) << "plain scale " << plain;

    if (absmax == 0.0f || plain == 0.0f) {
      EXPECT_EQ(got.scale, 0.0f);
      continue;
    }
    // One octave at most above the plain scale (plus the candidate's F16 rounding).
    EXPECT_GE(got.scale, plain);
    EXPECT_LE(got.scale, 2.0f * plain * (1.0f + 0x1p-10f));
    // The absmax is not clipped unless F16 cannot hold the scale it needs (65504 at most).
    if (absmax / Target(format, absmax) <= 65504.0f) {
      EXPECT_GE(got.scale * Target(format, absmax), absmax);
    }
    // fp8 scales are F16 normals wherever a target >= 1 allows it (absmax >= 2^-14).
    if (format.fp8_normal_scale && absmax >= 0x1p-14f) {
      EXPECT_NE(got.scale_bits & 0x7C00u, 0u) << "fp8 scale must be an F16 normal";
    }
  }
}

// The plain scale the benchmarks measure against is the one written here from the contract.
TEST_P(ScaleSearchTest, PlainChoiceIsThePlainScale) {
  const auto& [format, head_dim] = GetParam();
  const ScaledGrid grid = GridOf(format);
  for (const std::vector<float>& row : Rows(head_dim)) {
    EXPECT_EQ(ChooseScale(grid, row, ScaleSearch::kPlain).value,
              PlainScale(format, FiniteAbsMax(row)));
  }
}

// Rows where the Highway search could part from the reference if any operation differed:
// elements exactly on codes and on midpoints between codes of the plain scale's grid and of
// other candidates' (a multiply by 1 / s, or a fused multiply-add, rounds those differently
// from x / s), elements deep in fp8's subnormal range next to a large one, and magnitudes
// across the float range. Plus the rows above.
std::vector<std::vector<float>> ExactnessRows(const Format& format, int head_dim) {
  std::vector<std::vector<float>> rows = Rows(head_dim);
  std::mt19937 rng(99 + head_dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_int_distribution<int> candidate(0, kScaleCandidates - 1);
  // The grid's values: every finite code decoded.
  std::vector<float> grid;
  for (int c = 0; c < 256; ++c) {
    const float v = format.decode(static_cast<uint8_t>(c));
    if (std::isfinite(v)) grid.push_back(v);
  }
  std::sort(grid.begin(), grid.end());
  for (int i = 0; i < 300; ++i) {
    const float magnitude = std::exp2(normal(rng) * 4.0f);
    std::vector<float> row(head_dim);
    for (float& x : row) x = magnitude * normal(rng);
    const float absmax = FiniteAbsMax(row);
    // Put elements on codes or midpoints of one candidate's grid (the candidate as the
    // codec would store it: the plain scale times 2^(j / K), rounded to F16).
    const float plain = PlainScale(format, absmax);
    if (plain == 0.0f) continue;
    const int j = i % 3 == 0 ? 0 : candidate(rng);
    const float scale =
        F16ToF32(F32ToF16(std::fmax(plain, plain * std::exp2(static_cast<float>(j) / 32))));
    for (int c = 0; c < head_dim; ++c) {
      if (std::fabs(row[c]) == absmax) continue;  // keeps the plain scale
      const size_t k = static_cast<size_t>(code(rng)) % (grid.size() - 1);
      const float v = (i % 2 == 0) ? grid[k] : 0.5f * (grid[k] + grid[k + 1]);
      // Every fourth row one float step off: x / s then lies next to a midpoint, not on it.
      const float x =
          i % 4 == 3 ? std::nextafter(v * scale, c % 2 ? INFINITY : -INFINITY) : v * scale;
      if (std::fabs(x) <= absmax) row[c] = x;
    }
    rows.push_back(row);
  }
  for (const float small : {1e-3f, 1e-6f, 1e-9f}) {  // fp8 subnormals beside a large element
    std::vector<float> row(head_dim);
    for (float& x : row) x = small * normal(rng);
    row[0] = 300.0f;
    rows.push_back(row);
  }
  for (int e = -60; e <= 60; e += 10) {  // magnitudes across the float range
    std::vector<float> row(head_dim);
    for (float& x : row) x = std::ldexp(normal(rng), e);
    rows.push_back(row);
  }
  return rows;
}

void ExpectSimdMatchesScalar(const Format& format, int head_dim) {
  for (const int dim : {head_dim, head_dim - 1, head_dim + 5}) {
    auto reference = CreateScaledCodec(format.name, dim, ScaleSearch::kScalar);
    auto simd = CreateScaledCodec(format.name, dim, ScaleSearch::kSimd);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ASSERT_TRUE(simd.ok()) << simd.status();
    std::vector<std::byte> want((*reference)->unit_bytes()), got((*simd)->unit_bytes());
    int row_index = 0;
    for (const std::vector<float>& row : ExactnessRows(format, dim)) {
      SCOPED_TRACE(::testing::Message() << format.name << " dim " << dim << " row " << row_index++);
      (*reference)->Encode(row, want);
      (*simd)->Encode(row, got);
      ASSERT_EQ(got, want);
      std::array<float, kScaleCandidates> want_errors, got_errors;
      ScaleCandidateErrors(GridOf(format), row, ScaleSearch::kScalar, want_errors);
      ScaleCandidateErrors(GridOf(format), row, ScaleSearch::kSimd, got_errors);
      for (int j = 0; j < kScaleCandidates; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got_errors[j]), std::bit_cast<uint32_t>(want_errors[j]))
            << "candidate " << j << ": " << got_errors[j] << " vs " << want_errors[j];
      }
    }
  }
}

// The Highway search picks the reference's scale, so the codec writes the same bytes, on
// every target this machine runs (AVX3 and AVX2 take the fused quotient, SSE4 and EMU128
// divide).
TEST_P(ScaleSearchTest, SimdMatchesScalarReference) {
  const auto& [format, head_dim] = GetParam();
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    ExpectSimdMatchesScalar(format, head_dim);
  }
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU supports
}

// The search must pay for itself: on N(0, 1) rows of stories260K's head_dim, E4M3's mean
// squared error drops well below the plain scale's (about 0.7x measured; 16 candidates).
TEST(ScaleSearchGainTest, E4M3ErrorDropsOnNormalRows) {
  auto codec = CreateCodec("fp8_e4m3", 8);
  ASSERT_TRUE(codec.ok()) << codec.status();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double plain_error = 0.0, error = 0.0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> row(8);
    for (float& x : row) x = normal(rng);
    plain_error += SquaredError(row, PlainRoundTrip(kFormats[0], row));
    error += SquaredError(row, RoundTrip(**codec, row).decoded);
  }
  EXPECT_LT(error, 0.8 * plain_error);
}

INSTANTIATE_TEST_SUITE_P(Formats, ScaleSearchTest,
                         ::testing::Combine(::testing::ValuesIn(kFormats),
                                            ::testing::Values(8, 64, 128)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kvstack
