// The low-rank codec against data of known rank: vectors in a 2-dimensional subspace are
// reconstructed by rank 2 (to F16 rounding), energy-named ranks pick the right rank, the
// 4-bit coordinates stay within their quantisation bound, bad names fail clearly, and the
// profile-built factory tells low-rank from latent names.
#include "represent/lowrank_codec.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kvstack/codec.h"

namespace kvstack {
namespace {

constexpr int kHeadDim = 8;
constexpr int kHeads = 2;

// Rows mean + a*d1 + b*d2 (+ tiny noise), different directions per head.
std::vector<float> SubspaceRows(int num_tokens, std::mt19937& rng, float noise) {
  std::normal_distribution<float> normal;
  std::vector<float> rows;
  for (int t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      const float a = 3 * normal(rng);
      const float b = normal(rng);
      for (int i = 0; i < kHeadDim; ++i) {
        const float d1 = (i == h) ? 1.0f : 0.0f;
        const float d2 = (i == 4 + h) ? 1.0f : 0.0f;
        rows.push_back(0.5f * i + a * d1 + b * d2 + noise * normal(rng));
      }
    }
  }
  return rows;
}

KvProfile Profile() {
  std::mt19937 rng(3);
  KvProfile profile(42, 1, kHeads, kHeadDim);
  const std::vector<float> rows = SubspaceRows(4000, rng, 0.01f);
  profile.Accumulate(0, rows, rows);
  EXPECT_TRUE(profile.Finalize().ok());
  return profile;
}

double MaxError(const LowRankCodec& codec, int head) {
  std::mt19937 rng(9);
  const std::vector<float> rows = SubspaceRows(50, rng, 0.0f);
  std::vector<float> head_rows;
  for (int t = 0; t < 50; ++t) {
    const float* row = rows.data() + (t * kHeads + head) * kHeadDim;
    head_rows.insert(head_rows.end(), row, row + kHeadDim);
  }
  std::vector<std::byte> bytes(50 * codec.unit_bytes());
  codec.EncodeHead(head, head_rows, bytes);
  std::vector<float> back(head_rows.size());
  codec.DecodeHead(head, bytes, back);
  double worst = 0;
  for (size_t i = 0; i < back.size(); ++i)
    worst = std::max(worst, double(std::fabs(back[i] - head_rows[i])));
  return worst;
}

TEST(LowRankCodec, RankTwoReconstructsTwoDimensionalData) {
  const KvProfile profile = Profile();
  auto codec = LowRankCodec::Create("lowrank-r2", profile, 0, KvKind::kKey);
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->unit_bytes(), 4u);
  EXPECT_DOUBLE_EQ((*codec)->bits_per_element(), 4.0);
  for (int h = 0; h < kHeads; ++h) EXPECT_LT(MaxError(**codec, h), 0.06) << h;
  auto rank1 = LowRankCodec::Create("lowrank-r1", profile, 0, KvKind::kKey);
  ASSERT_TRUE(rank1.ok());
  EXPECT_GT(MaxError(**rank1, 0), 0.5);  // drops the second direction
}

TEST(LowRankCodec, EnergyNamesPickTheRank) {
  const KvProfile profile = Profile();
  auto e90 = LowRankCodec::Create("lowrank-e80", profile, 0, KvKind::kValue);
  ASSERT_TRUE(e90.ok());
  EXPECT_EQ((*e90)->rank(), 1);  // variance 9 of 10 in the first direction
  auto e99 = LowRankCodec::Create("lowrank-e99", profile, 0, KvKind::kValue);
  ASSERT_TRUE(e99.ok());
  EXPECT_EQ((*e99)->rank(), 2);
}

TEST(LowRankCodec, Int4CoordinatesStayWithinTheirStep) {
  const KvProfile profile = Profile();
  auto codec = LowRankCodec::Create("lowrank-r2-int4", profile, 0, KvKind::kKey);
  ASSERT_TRUE(codec.ok());
  EXPECT_EQ((*codec)->unit_bytes(), 5u);
  // Two coordinates spanning at most ~20 units: a step of <= 20/15, error <= half a step
  // per coordinate, two coordinates.
  EXPECT_LT(MaxError(**codec, 1), 1.5);
}

TEST(LowRankCodec, BadNamesAndRanks) {
  const KvProfile profile = Profile();
  for (const char* name :
       {"lowrank", "lowrank-", "lowrank-x2", "lowrank-r0", "lowrank-e101", "lowrank-r2-int3"}) {
    EXPECT_FALSE(LowRankCodec::Create(name, profile, 0, KvKind::kKey).ok()) << name;
    EXPECT_FALSE(CheckLowRankCodecName(name).ok()) << name;
  }
  auto too_big = LowRankCodec::Create("lowrank-r9", profile, 0, KvKind::kKey);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(std::string(too_big.status().message()).find("above head_dim 8; allowed: 1..8"),
            std::string::npos);
}

// The profile-built factory serves both families, by name; CreateCodec cannot build either.
TEST(LowRankCodec, ProfiledFactoryDispatchesByName) {
  const KvProfile profile = Profile();
  auto low = CreateProfiledCodec("lowrank-r3-int4", profile, 0, CodecRole::kValue);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ((*low)->id(), CodecId::kLowRank);
  EXPECT_FALSE((*low)->joint());
  auto latent = CreateProfiledCodec("latent-r5", profile, 0, CodecRole::kValue);
  ASSERT_TRUE(latent.ok()) << latent.status();
  EXPECT_EQ((*latent)->id(), CodecId::kLatent);
  EXPECT_TRUE((*latent)->joint());
  for (const char* name : {"lowrank-r2", "latent-r2"}) {
    EXPECT_TRUE(IsLowRankCodecName(name));
    EXPECT_TRUE(CheckCodecName(name).ok()) << name;
    EXPECT_FALSE(CreateCodec(name, kHeadDim).ok()) << name;
  }
  EXPECT_FALSE(IsLowRankCodecName("int4"));
}

}  // namespace
}  // namespace kvstack
