// Tests of the sampler: option validation, greedy decoding, repeatability for a seed, the
// top-k and top-p cuts, and that draws follow the softmax distribution.
#include "kvstack/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvstack {
namespace {

using ::testing::HasSubstr;

Sampler MakeSampler(const SamplerOptions& options) {
  absl::StatusOr<Sampler> sampler = Sampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

std::vector<TokenId> Draw(Sampler& sampler, const std::vector<float>& logits, int num_draws) {
  std::vector<TokenId> ids;
  for (int idx = 0; idx < num_draws; ++idx) ids.push_back(sampler.Sample(logits));
  return ids;
}

TEST(SamplerTest, RejectsOptionsOutOfRange) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (float temperature : {-0.5f, kNan, kInf}) {
    absl::Status status = Sampler::Create({.temperature = temperature}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << temperature;
    EXPECT_THAT(status.message(), HasSubstr("temperature")) << temperature;
  }
  absl::Status status = Sampler::Create({.top_k = -1}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("top_k"));
  for (float top_p : {0.0f, -0.1f, 1.01f, kNan}) {
    status = Sampler::Create({.top_p = top_p}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << top_p;
    EXPECT_THAT(status.message(), HasSubstr("top_p")) << top_p;
    EXPECT_THAT(status.message(), HasSubstr("(0, 1]")) << top_p;
  }
  EXPECT_TRUE(Sampler::Create({.temperature = 0.7f, .top_k = 40, .top_p = 0.9f}).ok());
}

TEST(SamplerTest, GreedyPicksTheArgmaxAndTheLowestIdOnTies) {
  Sampler sampler = MakeSampler({});
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.5f}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-3.0f, 4.0f, 1.0f, 4.0f}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-5.0f}), 0);
}

TEST(SamplerTest, SameSeedGivesTheSameSequence) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, 0.8f, 0.9f};
  Sampler a = MakeSampler({.temperature = 1.0f, .seed = 42});
  Sampler b = MakeSampler({.temperature = 1.0f, .seed = 42});
  Sampler c = MakeSampler({.temperature = 1.0f, .seed = 43});
  const std::vector<TokenId> from_a = Draw(a, logits, 64);
  EXPECT_EQ(from_a, Draw(b, logits, 64));
  EXPECT_NE(from_a, Draw(c, logits, 64));  // 5^-64 chance of a coincidence
}

TEST(SamplerTest, TopKOfOneIsGreedyAtAnyTemperature) {
  const std::vector<float> logits = {0.3f, 0.2f, 0.31f, 0.1f, 0.31f};
  for (float temperature : {0.5f, 1.0f, 100.0f}) {
    Sampler sampler = MakeSampler({.temperature = temperature, .top_k = 1, .seed = 7});
    for (TokenId id : Draw(sampler, logits, 50)) EXPECT_EQ(id, 2) << temperature;
  }
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheMostLikely) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.9f, 0.95f};
  Sampler sampler = MakeSampler({.temperature = 5.0f, .top_p = 1e-6f, .seed = 3});
  for (TokenId id : Draw(sampler, logits, 50)) EXPECT_EQ(id, 1);
}

TEST(SamplerTest, TopKAndTopPKeepOnlyTheirCandidates) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at T = 1.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  Sampler top_k = MakeSampler({.temperature = 1.0f, .top_k = 2, .seed = 5});
  Sampler top_p = MakeSampler({.temperature = 1.0f, .top_p = 0.7f, .seed = 5});
  std::vector<int> counts_k(4), counts_p(4);
  for (TokenId id : Draw(top_k, logits, 400)) ++counts_k[id];
  for (TokenId id : Draw(top_p, logits, 400)) ++counts_p[id];
  // top_k = 2 and top_p = 0.7 (0.5 falls short, 0.5 + 0.3 reaches it) both keep ids 1 and 3,
  // in ratio 5 : 3.
  for (const std::vector<int>& counts : {counts_k, counts_p}) {
    EXPECT_EQ(counts[0], 0);
    EXPECT_EQ(counts[2], 0);
    EXPECT_GT(counts[1], 180);  // expected 250, sd ~9.7
    EXPECT_GT(counts[3], 90);   // expected 150
  }
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  // Logits log(p) / T at T = 0.5 give back p = {0.2, 0.5, 0.3} after scaling by 1/T.
  const double kT = 0.5;
  const std::vector<double> probs = {0.2, 0.5, 0.3};
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p) * kT));
  Sampler sampler = MakeSampler({.temperature = static_cast<float>(kT), .seed = 2024});
  const int kNumDraws = 6000;
  std::vector<int> counts(3);
  for (TokenId id : Draw(sampler, logits, kNumDraws)) ++counts[id];
  double chi_square = 0.0;
  for (int idx = 0; idx < 3; ++idx) {
    const double expected = probs[idx] * kNumDraws;
    chi_square += (counts[idx] - expected) * (counts[idx] - expected) / expected;
  }
  // 2 degrees of freedom: P(chi2 > 13.8) = 0.001. A wrong temperature (e.g. not applied) moves
  // the frequencies to {0.30, 0.39, 0.31} and chi2 to about 400.
  EXPECT_LT(chi_square, 13.8) << counts[0] << " " << counts[1] << " " << counts[2];
}

TEST(SamplerTest, TinyTemperatureIsStillFinite) {
  // Scaling logits by 1/T would overflow; subtracting the maximum first keeps it greedy-like.
  Sampler sampler = MakeSampler({.temperature = 1e-30f, .seed = 1});
  for (TokenId id : Draw(sampler, {1.0f, 3.0f, 2.0f}, 20)) EXPECT_EQ(id, 1);
}

}  // namespace
}  // namespace kvstack
