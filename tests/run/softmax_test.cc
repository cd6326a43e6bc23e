// Tests for the softmax exponential of the attention kernels (src/run/softmax.h): its error
// against std::exp over the range it promises, on every SIMD target this machine runs.

#include "run/softmax.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace kvstack {
namespace {

// Distance in units in the last place between two positive finite floats.
int64_t UlpDistance(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

// Every 1021st float of [lo, hi] (bit patterns of one sign), both ends included.
std::vector<float> SampleFloats(float lo, float hi) {
  std::vector<float> xs;
  const int32_t a = std::bit_cast<int32_t>(lo), b = std::bit_cast<int32_t>(hi);
  const int32_t first = std::min(a, b), last = std::max(a, b);
  for (int64_t bits = first; bits <= last; bits += 1021) {
    xs.push_back(std::bit_cast<float>(static_cast<int32_t>(bits)));
  }
  xs.push_back(lo);
  xs.push_back(hi);
  return xs;
}

// The largest distance of ExpOfScores(xs) from e^x rounded to float, at the current target.
int64_t LargestUlpError(const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  ExpOfScores(xs.data(), xs.size(), out.data());
  int64_t largest = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float exact = static_cast<float>(std::exp(static_cast<double>(xs[i])));
    const int64_t ulps = UlpDistance(out[i], exact);
    EXPECT_LE(ulps, 2) << "x = " << xs[i] << ": " << out[i] << " against " << exact;
    if (ulps > 2) return ulps;  // (one failure says enough)
    largest = std::max(largest, ulps);
  }
  return largest;
}

TEST(SoftmaxExpTest, EveryTargetWithinTwoUlpOverItsRange) {
  const std::vector<float> negative = SampleFloats(-87.0f, -0.0f);
  const std::vector<float> positive = SampleFloats(1e-30f, 88.0f);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const int64_t largest = std::max(LargestUlpError(negative), LargestUlpError(positive));
    RecordProperty(std::string("ulps_") + hwy::TargetName(target), static_cast<int>(largest));
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the machine's own
}

TEST(SoftmaxExpTest, EveryTargetGivesExactValuesAtTheEnds) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // 0 (the row's largest score) gives exactly 1; the padding (-inf) and anything below -87
  // give exactly 0. 19 elements: whole vectors and a tail at every width.
  std::vector<float> xs = {0.0f,   -0.0f,   -kInf, -87.0001f, -88.0f, -100.0f, -1e30f,
                           -kInf,  0.0f,    -kInf, -90.0f,    0.0f,   -kInf,   -87.5f,
                           -1e10f, -104.0f, -kInf, 0.0f,      -kInf};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (size_t n = 1; n <= xs.size(); ++n) {
      std::vector<float> out(n, -1.0f);
      ExpOfScores(xs.data(), n, out.data());
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(out[i], xs[i] == 0.0f ? 1.0f : 0.0f) << "x = " << xs[i] << ", n = " << n;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(SoftmaxExpTest, InPlaceMatchesOutOfPlace) {
  std::vector<float> x = SampleFloats(-20.0f, -0.0f);
  x.resize(1001);  // (not a multiple of any vector width)
  std::vector<float> out(x.size());
  ExpOfScores(x.data(), x.size(), out.data());
  ExpOfScores(x.data(), x.size(), x.data());
  EXPECT_EQ(x, out);
}

}  // namespace
}  // namespace kvstack
