// KvProfile: the eigen-solver against known spectra, PCA of synthetic data with a known
// covariance, the joint [k; v] components, energy/rank queries,
// and the file format (round trip, foreign model and old version refused, corruption caught).
#include "kvstack/kv_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "support/scratch_dir.h"

namespace kvstack {
namespace {

TEST(SymmetricEigen, DiagonalAndRotatedMatrices) {
  std::vector<double> values, vectors;
  SymmetricEigen({2, 0, 0, 0, 5, 0, 0, 0, 1}, 3, &values, &vectors);
  EXPECT_NEAR(values[0], 5, 1e-12);
  EXPECT_NEAR(values[1], 2, 1e-12);
  EXPECT_NEAR(values[2], 1, 1e-12);
  EXPECT_NEAR(std::fabs(vectors[1]), 1, 1e-12);  // first row = e1
  // [[2,1],[1,2]]: eigenvalues 3 and 1, eigenvectors (1,1)/sqrt2 and (1,-1)/sqrt2.
  SymmetricEigen({2, 1, 1, 2}, 2, &values, &vectors);
  EXPECT_NEAR(values[0], 3, 1e-12);
  EXPECT_NEAR(values[1], 1, 1e-12);
  EXPECT_NEAR(std::fabs(vectors[0]), std::sqrt(0.5), 1e-12);
  EXPECT_NEAR(vectors[0] * vectors[1], 0.5, 1e-12);
}

// Checks a decomposition of a: V^T diag(values) V reproduces a, the rows of V are orthonormal
// and the values descend, each to `tolerance` times the matrix's largest |entry|.
void ExpectDecomposes(const std::vector<double>& a, int n, double tolerance) {
  std::vector<double> values, vectors;
  SymmetricEigen(a, n, &values, &vectors);
  ASSERT_EQ(values.size(), static_cast<size_t>(n));
  ASSERT_EQ(vectors.size(), static_cast<size_t>(n) * n);
  double scale = 1e-300;
  for (double x : a) scale = std::max(scale, std::fabs(x));
  for (int i = 1; i < n; ++i) EXPECT_GE(values[i - 1], values[i]) << i;
  double worst_reconstruction = 0, worst_orthonormality = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0, dot = 0;
      for (int k = 0; k < n; ++k) {
        sum += vectors[k * n + i] * values[k] * vectors[k * n + j];
        dot += vectors[i * n + k] * vectors[j * n + k];
      }
      worst_reconstruction = std::max(worst_reconstruction, std::fabs(sum - a[i * n + j]));
      worst_orthonormality = std::max(worst_orthonormality, std::fabs(dot - (i == j ? 1 : 0)));
    }
  }
  EXPECT_LE(worst_reconstruction, tolerance * scale) << "n " << n;
  EXPECT_LE(worst_orthonormality, tolerance) << "n " << n;
}

std::vector<double> RandomSymmetric(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> a(n * n);
  for (int i = 0; i < n; ++i) {
    for (int j = i; j < n; ++j) a[i * n + j] = a[j * n + i] = normal(rng);
  }
  return a;
}

TEST(SymmetricEigen, DecomposesRandomMatricesOfHeadSizes) {
  // Up to the joint [k; v] basis of head_dim 128.
  for (int n : {1, 2, 3, 16, 64, 129, 256}) ExpectDecomposes(RandomSymmetric(n, n), n, 1e-10);
}

TEST(SymmetricEigen, DecomposesCovariancesWithRepeatedAndZeroEigenvalues) {
  // Rank-deficient covariances (fewer samples than dimensions, as in a short calibration),
  // repeated eigenvalues (the identity, a scaled block), the zero matrix.
  const int n = 48;
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  std::vector<double> samples(10 * n), cov(n * n, 0.0);
  for (double& x : samples) x = normal(rng);
  for (int t = 0; t < 10; ++t) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) cov[i * n + j] += samples[t * n + i] * samples[t * n + j];
    }
  }
  ExpectDecomposes(cov, n, 1e-10);
  std::vector<double> identity(n * n, 0.0), blocks(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    identity[i * n + i] = 1.0;
    blocks[i * n + i] = i < n / 2 ? 3.0 : 0.5;
  }
  ExpectDecomposes(identity, n, 1e-12);
  ExpectDecomposes(blocks, n, 1e-12);
  ExpectDecomposes(std::vector<double>(n * n, 0.0), n, 1e-12);
}

TEST(SymmetricEigen, SpectrumOfAKnownMatrix) {
  // The second-difference matrix tridiag(-1, 2, -1) of size n has eigenvalues
  // 2 - 2 cos(pi k / (n + 1)), k = 1..n.
  const int n = 100;
  std::vector<double> a(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    a[i * n + i] = 2.0;
    if (i + 1 < n) a[i * n + i + 1] = a[(i + 1) * n + i] = -1.0;
  }
  std::vector<double> values, vectors;
  SymmetricEigen(a, n, &values, &vectors);
  for (int k = 1; k <= n; ++k) {
    EXPECT_NEAR(values[n - k], 2.0 - 2.0 * std::cos(M_PI * k / (n + 1)), 1e-12) << k;
  }
}

// Rows with independent channels of known variances, offset by a known mean.
KvProfile SyntheticProfile() {
  KvProfile profile(0x1234, 2, 2, 4);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const float stddev[4] = {4, 2, 1, 0.5f};
  std::vector<float> rows;
  for (int t = 0; t < 20000; ++t) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 4; ++c) rows.push_back(10.0f * h + stddev[c] * normal(rng));
    }
  }
  for (int l = 0; l < 2; ++l) profile.Accumulate(l, rows, rows);
  profile.AddTokens(20000);
  EXPECT_TRUE(profile.Finalize().ok());
  return profile;
}

TEST(KvProfile, RecoversKnownVariancesMeansAndEnergy) {
  const KvProfile profile = SyntheticProfile();
  const HeadComponents& c = profile.components(1, 1, KvKind::kValue);
  EXPECT_NEAR(c.mean[0], 10.0, 0.1);
  EXPECT_NEAR(c.eigenvalues[0], 16.0, 0.5);
  EXPECT_NEAR(c.eigenvalues[3], 0.25, 0.02);
  EXPECT_NEAR(std::fabs(c.basis[0]), 1.0, 0.01);  // the first direction is channel 0
  const double total = 16 + 4 + 1 + 0.25;
  EXPECT_NEAR(c.EnergyRetained(2), 20 / total, 0.01);
  EXPECT_EQ(c.RankForEnergy(0.5), 1);
  EXPECT_EQ(c.RankForEnergy(0.9), 2);
  EXPECT_EQ(c.RankForEnergy(1.0), 4);
}

// Values that are a fixed linear function of the keys (v = 0.1 P k, P a channel swap) add
// no dimension: the joint [k; v] has the keys' rank, and each joint direction is a key
// direction d followed by 0.1 P d (so 1/1.01 of its weight lies in the key half).
TEST(KvProfile, JointComponentsSpanKeysAndValuesTogether) {
  KvProfile profile(7, 1, 1, 4);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> keys, values;
  for (int t = 0; t < 5000; ++t) {
    const float a = 3 * normal(rng), b = normal(rng);
    const float k[4] = {a + 1, b, 0.5f * a, -2};
    keys.insert(keys.end(), k, k + 4);
    const float v[4] = {0.1f * k[1], 0.1f * k[0], 0.1f * k[3], 0.1f * k[2]};
    values.insert(values.end(), v, v + 4);
  }
  profile.Accumulate(0, keys, values);
  ASSERT_TRUE(profile.Finalize().ok());
  const HeadComponents& c = profile.joint_components(0, 0);
  ASSERT_EQ(c.mean.size(), 8u);
  EXPECT_NEAR(c.mean[0], 1.0, 0.1);
  EXPECT_NEAR(c.mean[4 + 2], -0.2, 1e-5);
  EXPECT_NEAR(c.EnergyRetained(2), 1.0, 1e-9);
  EXPECT_LT(c.EnergyRetained(1), 0.95);
  for (int j = 0; j < 2; ++j) {
    double key_part = 0;
    for (int i = 0; i < 4; ++i) key_part += c.basis[j * 8 + i] * c.basis[j * 8 + i];
    EXPECT_NEAR(key_part, 1 / 1.01, 1e-6) << j;
  }
  // The key and value blocks alone are what separate accumulation would give.
  EXPECT_NEAR(profile.components(0, 0, KvKind::kKey).eigenvalues[0], 9 * 1.25, 0.5);
  EXPECT_NEAR(profile.components(0, 0, KvKind::kValue).eigenvalues[0], 0.09 * 1.25, 0.005);
}

TEST(KvProfile, NonFiniteTokensAreSkipped) {
  KvProfile profile(7, 1, 1, 2);
  const std::vector<float> keys = {1, 2, 3, 4, NAN, 0};
  const std::vector<float> values = {1, 1, INFINITY, 1, 2, 2};
  profile.Accumulate(0, keys, values);  // only token 0 is finite in both
  ASSERT_TRUE(profile.Finalize().ok());
  EXPECT_EQ(profile.components(0, 0, KvKind::kKey).mean, (std::vector<double>{1, 2}));
}

TEST(KvProfile, FinalizeWithoutDataIsAnError) {
  KvProfile profile(1, 1, 1, 4);
  EXPECT_EQ(profile.Finalize().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KvProfile, FileRoundTripAndRefusals) {
  const KvProfile profile = SyntheticProfile();
  const std::string path = testing_support::ScratchDir() + "/p.kvsprof";
  ASSERT_TRUE(profile.Save(path).ok());
  auto loaded = KvProfile::Load(path, 0x1234, 2, 2, 4);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokens_seen(), 20000u);
  EXPECT_EQ(loaded->components(1, 0, KvKind::kKey).basis,
            profile.components(1, 0, KvKind::kKey).basis);
  EXPECT_EQ(loaded->joint_components(1, 1).basis, profile.joint_components(1, 1).basis);

  auto foreign = KvProfile::Load(path, 0x9999, 2, 2, 4);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(std::string(foreign.status().message()).find("another model"), std::string::npos);
  auto shape = KvProfile::Load(path, 0x1234, 3, 2, 4);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(std::string(shape.status().message()).find("shape"), std::string::npos);

  // Truncated and foreign files.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path + ".cut", std::ios::binary) << bytes.substr(0, bytes.size() - 9);
  auto cut = KvProfile::Load(path + ".cut", 0x1234, 2, 2, 4);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(std::string(cut.status().message()).find("truncated"), std::string::npos);
  // A version-1 file (before the joint section) is refused with both versions named.
  std::string old = bytes;
  old[8] = 1;
  std::ofstream(path + ".v1", std::ios::binary) << old;
  auto v1 = KvProfile::Load(path + ".v1", 0x1234, 2, 2, 4);
  ASSERT_FALSE(v1.ok());
  EXPECT_NE(std::string(v1.status().message()).find("version 1; this kvstack reads version 2"),
            std::string::npos)
      << v1.status();
  std::ofstream(path + ".bad", std::ios::binary) << "GGUF and then some";
  EXPECT_FALSE(KvProfile::Load(path + ".bad", 0x1234, 2, 2, 4).ok());
  EXPECT_FALSE(KvProfile::Load(path + ".missing", 0x1234, 2, 2, 4).ok());
}

}  // namespace
}  // namespace kvstack
