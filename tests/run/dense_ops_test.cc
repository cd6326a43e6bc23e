// Tests of the dense kernels (run/dense_ops.h) against their scalar references over many shapes,
// both weight types, with and without a thread pool, on every SIMD target this CPU supports;
// plus known values that do not depend on the references (identity at pos 0, a hand-computed
// rotation, RMSNorm of constants).
#include "run/dense_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kvstack/numeric.h"

namespace kvstack::ops {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomFloats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Owns the bytes behind a WeightMatrix.
struct TestWeights {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  WeightMatrix matrix;
};

TestWeights MakeWeights(WeightType type, int rows, int cols, uint32_t seed) {
  TestWeights w;
  w.f32 = RandomFloats(static_cast<size_t>(rows) * cols, -1.0f, 1.0f, seed);
  w.matrix.type = type;
  w.matrix.rows = rows;
  w.matrix.cols = cols;
  if (type == WeightType::kF16) {
    for (float f : w.f32) w.f16.push_back(F32ToF16(f));
    w.matrix.data = w.f16.data();
  } else {
    w.matrix.data = w.f32.data();
  }
  return w;
}

float WeightAt(const TestWeights& w, size_t idx) {
  return w.matrix.type == WeightType::kF16 ? F16ToF32(w.f16[idx]) : w.f32[idx];
}

// Checks MatMul against MatMulReference. Float sums in a different order differ from the
// double reference by a few ulp of the sum of |terms|, so that is the scale of the tolerance.
void ExpectMatMulMatches(WeightType type, int rows, int cols, int num_tokens, ThreadPool* pool) {
  SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " num_tokens=" +
               std::to_string(num_tokens) + " f16=" + std::to_string(type == WeightType::kF16) +
               " pool=" + std::to_string(pool != nullptr));
  const TestWeights w = MakeWeights(type, rows, cols, 1000 * rows + cols);
  const std::vector<float> x =
      RandomFloats(static_cast<size_t>(num_tokens) * cols, -2.0f, 2.0f, 7 + num_tokens);
  // NaN-filled so that an output the kernel never writes fails the comparison.
  std::vector<float> y(static_cast<size_t>(num_tokens) * rows, kNaN);
  std::vector<float> y_ref(y.size());
  MatMul(w.matrix, x.data(), num_tokens, y.data(), pool);
  MatMulReference(w.matrix, x.data(), num_tokens, y_ref.data());
  int num_failures = 0;
  for (int t = 0; t < num_tokens; ++t) {
    for (int r = 0; r < rows; ++r) {
      double abs_sum = 0.0;
      for (int c = 0; c < cols; ++c) {
        abs_sum += std::abs(WeightAt(w, static_cast<size_t>(r) * cols + c) *
                            x[static_cast<size_t>(t) * cols + c]);
      }
      const size_t idx = static_cast<size_t>(t) * rows + r;
      if (!(std::abs(y[idx] - y_ref[idx]) <= 1e-5 * abs_sum + 1e-30) && ++num_failures <= 5) {
        ADD_FAILURE() << "y[" << t << ", " << r << "] = " << y[idx] << ", reference " << y_ref[idx];
      }
    }
  }
  EXPECT_EQ(num_failures, 0);
}

TEST(MatMul, KnownValues) {
  // w = [[1, 2], [3, 4], [-1, 0.5]], tokens (1, 1) and (2, -1).
  const float w_data[] = {1, 2, 3, 4, -1, 0.5f};
  const WeightMatrix w{WeightType::kF32, w_data, 3, 2};
  const float x[] = {1, 1, 2, -1};
  float y[6];
  MatMul(w, x, 2, y, nullptr);
  const float expected[] = {3, 7, -0.5f, 0, 2, -2.5f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y[i], expected[i]) << i;
}

TEST(MatMul, ZeroTokensWritesNothing) {
  const TestWeights w = MakeWeights(WeightType::kF16, 4, 8, 1);
  float y = 42.0f;
  MatMul(w.matrix, nullptr, 0, &y, nullptr);
  EXPECT_EQ(y, 42.0f);
}

class MatMulTest : public ::testing::TestWithParam<std::tuple<WeightType, int>> {
 protected:
  void SetUp() override {
    const int num_threads = std::get<1>(GetParam());
    if (num_threads > 0) pool_ = std::make_unique<ThreadPool>(num_threads);
  }
  WeightType type() const { return std::get<0>(GetParam()); }
  std::unique_ptr<ThreadPool> pool_;
};

TEST_P(MatMulTest, MatchesReferenceSmallRows) {
  for (int cols : {1, 7, 8, 64, 172, 513}) {
    for (int rows = 1; rows <= 33; ++rows) {
      for (int num_tokens : {1, 3, 4, 17, 64}) {
        ExpectMatMulMatches(type(), rows, cols, num_tokens, pool_.get());
      }
    }
  }
}

TEST_P(MatMulTest, MatchesReferenceLargeRows) {
  // 300 rows: GEMV row ranges that do not end on a tile; both sizes are past the threshold at
  // which the pool takes part.
  for (int rows : {300, 512}) {
    for (int cols : {1, 7, 64, 172, 513}) {
      for (int num_tokens : {1, 3, 4, 17, 64}) {
        ExpectMatMulMatches(type(), rows, cols, num_tokens, pool_.get());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TypesAndPools, MatMulTest,
                         ::testing::Combine(::testing::Values(WeightType::kF32, WeightType::kF16),
                                            ::testing::Values(0, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<WeightType, int>>& info) {
                           return std::string(std::get<0>(info.param) == WeightType::kF16 ? "F16"
                                                                                          : "F32") +
                                  "_threads" + std::to_string(std::get<1>(info.param));
                         });

void ExpectRmsNormMatches(int dim, float eps, uint32_t seed) {
  SCOPED_TRACE("dim=" + std::to_string(dim));
  const std::vector<float> x = RandomFloats(dim, -3.0f, 3.0f, seed);
  const std::vector<float> weight = RandomFloats(dim, 0.5f, 1.5f, seed + 1);
  std::vector<float> out(dim, kNaN);
  std::vector<float> ref(dim);
  RmsNorm(x.data(), weight.data(), dim, eps, out.data());
  RmsNormReference(x.data(), weight.data(), dim, eps, ref.data());
  for (int i = 0; i < dim; ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * std::abs(ref[i]) + 1e-7) << i;
  // In place gives the same result.
  std::vector<float> in_place = x;
  RmsNorm(in_place.data(), weight.data(), dim, eps, in_place.data());
  for (int i = 0; i < dim; ++i) ASSERT_EQ(in_place[i], out[i]) << i;
}

TEST(RmsNorm, MatchesReference) {
  for (int dim : {1, 7, 8, 17, 64, 172, 513, 4096}) {
    for (float eps : {1e-5f, 1e-6f}) ExpectRmsNormMatches(dim, eps, dim);
  }
}

TEST(RmsNorm, KnownValues) {
  // Mean of squares 9: out = 3 / sqrt(9) * weight.
  const std::vector<float> threes(37, 3.0f);
  const std::vector<float> weight(37, 2.0f);
  std::vector<float> out(37);
  RmsNorm(threes.data(), weight.data(), 37, 0.0f, out.data());
  for (float v : out) EXPECT_FLOAT_EQ(v, 2.0f);
  // eps sits inside the sqrt: 1 / sqrt(1 + 3) = 0.5 (not 1 / (1 + 3) or 1 / 1 + 3).
  const float one = 1.0f;
  const float unit_weight = 1.0f;
  float single = 0.0f;
  RmsNorm(&one, &unit_weight, 1, 3.0f, &single);
  EXPECT_FLOAT_EQ(single, 0.5f);
}

void ExpectRopeMatches(int num_heads, int head_dim, int rope_dim, int pos, RopeStyle style) {
  SCOPED_TRACE("num_heads=" + std::to_string(num_heads) + " head_dim=" + std::to_string(head_dim) +
               " rope_dim=" + std::to_string(rope_dim) + " pos=" + std::to_string(pos) +
               " neox=" + std::to_string(style == RopeStyle::kNeox));
  const std::vector<float> x = RandomFloats(num_heads * head_dim, -1.0f, 1.0f, pos + head_dim);
  std::vector<float> out = x;
  std::vector<float> ref = x;
  Rope(out.data(), num_heads, head_dim, rope_dim, pos, 10000.0f, style);
  RopeReference(ref.data(), num_heads, head_dim, rope_dim, pos, 10000.0f, style);
  for (int head = 0; head < num_heads; ++head) {
    double norm_in = 0.0;
    double norm_out = 0.0;
    for (int d = 0; d < head_dim; ++d) {
      const int idx = head * head_dim + d;
      ASSERT_NEAR(out[idx], ref[idx], 2e-6) << "head " << head << " dim " << d;
      // Dims past rope_dim are untouched, bit for bit.
      if (d >= rope_dim) {
        ASSERT_EQ(out[idx], x[idx]) << "head " << head << " dim " << d;
      }
      norm_in += static_cast<double>(x[idx]) * x[idx];
      norm_out += static_cast<double>(out[idx]) * out[idx];
    }
    // A rotation preserves the norm of each head.
    EXPECT_NEAR(norm_out, norm_in, 1e-5 * norm_in) << "head " << head;
  }
}

TEST(Rope, MatchesReferenceBothStyles) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    for (int head_dim : {2, 8, 34, 64, 128}) {
      for (int rope_dim : {head_dim, head_dim / 2 - (head_dim / 2) % 2}) {
        // 16k+ positions: angles computed in float would be off by ~1e-3 rad here.
        for (int pos : {0, 1, 17, 1000, 20000, 100000}) {
          for (int num_heads : {1, 3}) ExpectRopeMatches(num_heads, head_dim, rope_dim, pos, style);
        }
      }
    }
  }
}

TEST(Rope, PositionZeroIsIdentity) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    const std::vector<float> x = RandomFloats(4 * 64, -1.0f, 1.0f, 3);
    std::vector<float> out = x;
    Rope(out.data(), 4, 64, 64, 0, 10000.0f, style);
    EXPECT_EQ(out, x);
  }
}

TEST(Rope, HandComputedRotation) {
  // One pair, pos 1: theta_0 = 1 * base^0 = 1 rad. (0.5, 2) -> (0.5 cos 1 - 2 sin 1,
  // 0.5 sin 1 + 2 cos 1).
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    float x[2] = {0.5f, 2.0f};
    Rope(x, 1, 2, 2, 1, 10000.0f, style);
    EXPECT_NEAR(x[0], 0.5 * std::cos(1.0) - 2.0 * std::sin(1.0), 1e-6);
    EXPECT_NEAR(x[1], 0.5 * std::sin(1.0) + 2.0 * std::cos(1.0), 1e-6);
  }
  // rope_dim 4, pos 3, base 10000: theta_1 = 3 * 10000^(-2/4) = 0.03 rad. Pair 1 is (x2, x3)
  // for kNormal and (x1, x3) for kNeox; pair 0 turns by 3 rad.
  float normal[4] = {0.0f, 0.0f, 1.0f, 0.0f};
  Rope(normal, 1, 4, 4, 3, 10000.0f, RopeStyle::kNormal);
  EXPECT_NEAR(normal[2], std::cos(0.03), 1e-6);
  EXPECT_NEAR(normal[3], std::sin(0.03), 1e-6);
  float neox[4] = {1.0f, 1.0f, 0.0f, 0.0f};
  Rope(neox, 1, 4, 4, 3, 10000.0f, RopeStyle::kNeox);
  EXPECT_NEAR(neox[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(neox[2], std::sin(3.0), 1e-6);
  EXPECT_NEAR(neox[1], std::cos(0.03), 1e-6);
  EXPECT_NEAR(neox[3], std::sin(0.03), 1e-6);
}

TEST(SwiGlu, MatchesReference) {
  for (int n : {1, 7, 8, 17, 64, 172, 513}) {
    std::vector<float> gate = RandomFloats(n, -10.0f, 10.0f, n);
    // Extremes at the front, where the vector loop handles them: exp(-g) overflows float for
    // g < -88.7, and silu(g) ~ g for large g.
    const float extremes[] = {-100.0f, -88.0f, -20.0f, 0.0f, 20.0f, 88.0f, 100.0f};
    for (int i = 0; i < n && i < 7; ++i) gate[i] = extremes[i];
    const std::vector<float> up = RandomFloats(n, -2.0f, 2.0f, n + 1);
    std::vector<float> out = gate;
    std::vector<float> ref = gate;
    SwiGlu(out.data(), up.data(), n);
    SwiGluReference(ref.data(), up.data(), n);
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(out[i], ref[i], 1e-5 * std::abs(ref[i]) + 1e-30) << "n=" << n << " i=" << i;
    }
  }
}

TEST(SwiGlu, KnownValues) {
  // silu(0) = 0; silu(x) -> x for large x; silu(-x) -> 0.
  float gate[3] = {0.0f, 30.0f, -30.0f};
  const float up[3] = {5.0f, 2.0f, 1.0f};
  SwiGlu(gate, up, 3);
  EXPECT_EQ(gate[0], 0.0f);
  EXPECT_FLOAT_EQ(gate[1], 60.0f);
  EXPECT_NEAR(gate[2], 0.0f, 1e-11);
}

TEST(EmbeddingRow, ConvertsEachRow) {
  for (WeightType type : {WeightType::kF32, WeightType::kF16}) {
    for (int cols : {1, 7, 8, 64, 172, 513}) {
      const TestWeights w = MakeWeights(type, 5, cols, cols);
      for (int token : {0, 4}) {
        std::vector<float> out(cols, kNaN);
        EmbeddingRow(w.matrix, token, out.data());
        for (int c = 0; c < cols; ++c) {
          ASSERT_EQ(out[c], WeightAt(w, static_cast<size_t>(token) * cols + c)) << cols;
        }
      }
    }
  }
}

// Every SIMD target compiled in and supported here (AVX-512, AVX2, SSE4, emulated 128-bit on a
// recent x86) runs a few shapes of each kernel, so the paths other CPUs take are tested too.
TEST(DenseOps, EveryTargetMatchesReference) {
  // Restores the real target choice however the test exits, so later tests run the best one.
  struct RestoreTargets {
    ~RestoreTargets() {
      hwy::SetSupportedTargetsForTest(0);
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    }
  } restore_targets;
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    for (WeightType type : {WeightType::kF32, WeightType::kF16}) {
      for (int num_tokens : {1, 3, 5, 64}) {
        ExpectMatMulMatches(type, 13, 172, num_tokens, nullptr);
        ExpectMatMulMatches(type, 300, 513, num_tokens, &pool);
      }
    }
    for (int dim : {7, 64, 513}) ExpectRmsNormMatches(dim, 1e-5f, dim);
    for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
      ExpectRopeMatches(3, 64, 64, 20000, style);
      ExpectRopeMatches(2, 34, 16, 5, style);
    }
    std::vector<float> gate = RandomFloats(77, -10.0f, 10.0f, 1);
    const std::vector<float> up = RandomFloats(77, -2.0f, 2.0f, 2);
    std::vector<float> ref = gate;
    SwiGlu(gate.data(), up.data(), 77);
    SwiGluReference(ref.data(), up.data(), 77);
    for (int i = 0; i < 77; ++i) ASSERT_NEAR(gate[i], ref[i], 1e-5 * std::abs(ref[i]) + 1e-30);
  }
}

}  // namespace
}  // namespace kvstack::ops
