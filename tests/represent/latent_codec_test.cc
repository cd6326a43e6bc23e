// The latent codec against data whose joint [k; v] has known rank: keys and values that are
// both linear in the same two hidden variables (values at a twentieth of the keys' scale) are
// reconstructed by rank 2 from one set of coordinates, per kv head; rank 1 loses a direction;
// 4-bit coordinates stay within their bound; non-finite inputs do not poison a row; bad names,
// ranks above 2*head_dim and mixed key/value pairs fail with one-line errors.
#include "represent/latent_codec.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

constexpr int kHeadDim = 8;
constexpr int kHeads = 2;

struct Rows {
  std::vector<float> k, v;  // [num_tokens, kHeads, kHeadDim]
};

// k = mean_k + a d1 + b d2, v = mean_v + 0.05 (b e1 - a e2), directions differing per head.
Rows JointRows(int num_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Rows rows;
  for (int t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      const float a = 3 * normal(rng);
      const float b = normal(rng);
      for (int i = 0; i < kHeadDim; ++i) {
        rows.k.push_back(0.5f * i + (i == h ? a : 0.0f) + (i == 4 + h ? b : 0.0f));
        rows.v.push_back(-0.1f * i + 0.05f * ((i == 7 - h ? b : 0.0f) - (i == 2 ? a : 0.0f)));
      }
    }
  }
  return rows;
}

KvProfile Profile() {
  KvProfile profile(42, 1, kHeads, kHeadDim);
  const Rows rows = JointRows(4000, 3);
  profile.Accumulate(0, rows.k, rows.v);
  EXPECT_TRUE(profile.Finalize().ok());
  return profile;
}

std::vector<float> HeadRows(const std::vector<float>& rows, int head) {
  std::vector<float> out;
  for (size_t t = 0; t < rows.size() / (kHeads * kHeadDim); ++t) {
    const float* row = rows.data() + (t * kHeads + head) * kHeadDim;
    out.insert(out.end(), row, row + kHeadDim);
  }
  return out;
}

// Worst absolute error of keys and of values after a joint round trip through one unit.
struct Errors {
  double key = 0, value = 0;
};
Errors RoundTrip(const std::string& name, int head) {
  const KvProfile profile = Profile();
  auto k_codec = LatentCodec::Create(name, profile, 0, CodecRole::kKey);
  auto v_codec = LatentCodec::Create(name, profile, 0, CodecRole::kValue);
  EXPECT_TRUE(k_codec.ok() && v_codec.ok()) << k_codec.status() << v_codec.status();
  const Rows rows = JointRows(50, 9);
  const std::vector<float> k = HeadRows(rows.k, head), v = HeadRows(rows.v, head);
  std::vector<std::byte> units(50 * (*k_codec)->unit_bytes());
  (*k_codec)->EncodeJointHead(head, k, v, units);
  std::vector<float> k_back(k.size()), v_back(v.size());
  (*k_codec)->DecodeHead(head, units, k_back);
  (*v_codec)->DecodeHead(head, units, v_back);  // the same bytes
  Errors errors;
  for (size_t i = 0; i < k.size(); ++i) {
    errors.key = std::max(errors.key, double(std::fabs(k_back[i] - k[i])));
    errors.value = std::max(errors.value, double(std::fabs(v_back[i] - v[i])));
  }
  return errors;
}

TEST(LatentCodec, RankTwoReconstructsKeysAndValuesFromOneUnit) {
  for (int h = 0; h < kHeads; ++h) {
    const Errors errors = RoundTrip("latent-r2", h);
    EXPECT_LT(errors.key, 0.02) << h;     // F16 rounding of coordinates of size ~10
    EXPECT_LT(errors.value, 0.002) << h;  // values are 20x smaller, and as well kept
  }
  const Errors rank1 = RoundTrip("latent-r1", 0);
  EXPECT_GT(rank1.key, 0.5);  // drops the second hidden variable
}

TEST(LatentCodec, SizesAndFlags) {
  const KvProfile profile = Profile();
  auto f16 = LatentCodec::Create("latent-r5", profile, 0, CodecRole::kKey);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ((*f16)->unit_bytes(), 10u);
  EXPECT_EQ((*f16)->rank(), 5);
  EXPECT_TRUE((*f16)->joint());
  EXPECT_TRUE((*f16)->needs_calibration());
  EXPECT_EQ((*f16)->id(), CodecId::kLatent);
  auto int4 = LatentCodec::Create("latent-r16-int4", profile, 0, CodecRole::kValue);
  ASSERT_TRUE(int4.ok()) << int4.status();
  EXPECT_EQ((*int4)->unit_bytes(), 4u + 8u);
  EXPECT_EQ((*int4)->role(), CodecRole::kValue);
}

TEST(LatentCodec, Int4CoordinatesStayWithinTheirStep) {
  // Two coordinates spanning at most ~25 units: a step of <= 25/15, half a step per coordinate
  // (values: the same, at their twentieth of the scale).
  const Errors errors = RoundTrip("latent-r2-int4", 1);
  EXPECT_LT(errors.key, 2.0);
  EXPECT_LT(errors.value, 0.2);
}

TEST(LatentCodec, NonFiniteElementsDoNotPoisonTheRow) {
  const KvProfile profile = Profile();
  auto codec = LatentCodec::Create("latent-r4", profile, 0, CodecRole::kKey);
  ASSERT_TRUE(codec.ok());
  std::vector<float> k(kHeadDim, 1.0f), v(kHeadDim, 0.0f);
  k[3] = NAN;
  v[5] = INFINITY;
  std::vector<std::byte> unit((*codec)->unit_bytes());
  (*codec)->EncodeJointHead(0, k, v, unit);
  std::vector<float> back(kHeadDim);
  (*codec)->DecodeHead(0, unit, back);
  for (float x : back) EXPECT_TRUE(std::isfinite(x));
}

TEST(LatentCodec, BadNamesAndRanks) {
  const KvProfile profile = Profile();
  for (const char* name : {"latent", "latent-", "latent-e90", "latent-r0", "latent-rx",
                           "latent-r3-int2", "latent-r-int4"}) {
    EXPECT_FALSE(LatentCodec::Create(name, profile, 0, CodecRole::kKey).ok()) << name;
    EXPECT_FALSE(CheckLatentCodecName(name).ok()) << name;
  }
  EXPECT_TRUE(LatentCodec::Create("latent-r16", profile, 0, CodecRole::kKey).ok());
  auto too_big = LatentCodec::Create("latent-r17", profile, 0, CodecRole::kKey);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().message(),
            "codec 'latent-r17': rank 17 is above 2*head_dim 16 (the joint [k; v]); allowed: "
            "1..16");
}

TEST(LatentCodec, KeyAndValueMustBeTheSameLatentCodec) {
  EXPECT_TRUE(CheckLatentPair("latent-r8", "latent-r8").ok());
  EXPECT_TRUE(CheckLatentPair("f16", "int4").ok());
  for (auto [k, v] :
       std::vector<std::pair<const char*, const char*>>{{"latent-r8", "f16"},
                                                        {"f16", "latent-r8"},
                                                        {"latent-r8", "latent-r4"},
                                                        {"latent-r8", "latent-r8-int4"},
                                                        {"lowrank-r4", "latent-r4"}}) {
    const absl::Status status = CheckLatentPair(k, v);
    ASSERT_FALSE(status.ok()) << k << " " << v;
    EXPECT_THAT(std::string(status.message()), HasSubstr("allowed: the same latent-r<rank>"));
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  }
}

TEST(LatentCodecDeathTest, OneSideAloneIsAnInvariantViolation) {
  const KvProfile profile = Profile();
  auto codec = LatentCodec::Create("latent-r4", profile, 0, CodecRole::kKey);
  ASSERT_TRUE(codec.ok());
  std::vector<float> k(kHeadDim, 1.0f);
  std::vector<std::byte> unit((*codec)->unit_bytes());
  EXPECT_DEATH((*codec)->EncodeHead(0, k, unit), "EncodeJointHead");
}

}  // namespace
}  // namespace kvstack
