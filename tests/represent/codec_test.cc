// Conformance suite for every codec CreateCodec knows: parameterised over CodecNames(), so a
// new codec runs it as soon as it is registered (and fails until it has a tolerance entry
// below). Plus the factory's error messages.
#include "kvstack/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace kvstack {
namespace {

using ::testing::HasSubstr;

struct CodecSpec {
  size_t bytes_per_element;  // unit_bytes = bytes_per_element * head_dim
  double rel_tolerance;      // round-trip error bound relative to |x|, normal range
  CodecId id;
};

// What each codec promises. A codec missing here fails SpecIsDeclared.
const std::map<std::string, CodecSpec>& Specs() {
  static const auto* specs = new std::map<std::string, CodecSpec>{
      {"f32", {4, 0.0, CodecId::kF32}},
      {"f16", {2, 0x1p-11, CodecId::kF16}},
      {"bf16", {2, 0x1p-8, CodecId::kBF16}},
  };
  return *specs;
}

// Values inside every codec's normal range: magnitudes 2^-10..2^10, both signs.
std::vector<float> RandomRows(int num_rows, int head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-10.0f, 10.0f);
  std::vector<float> values(static_cast<size_t>(num_rows) * head_dim);
  for (float& x : values) x = std::exp2(exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
  return values;
}

class CodecConformanceTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    const auto& [name, head_dim] = GetParam();
    ASSERT_TRUE(Specs().count(name)) << "declare a tolerance for codec '" << name << "'";
    spec_ = Specs().at(name);
    auto codec = CreateCodec(name, head_dim);
    ASSERT_TRUE(codec.ok()) << codec.status();
    codec_ = std::move(*codec);
    head_dim_ = head_dim;
  }

  std::vector<std::byte> Encode(const std::vector<float>& src) const {
    std::vector<std::byte> dst(src.size() / head_dim_ * codec_->unit_bytes());
    codec_->Encode(src, dst);
    return dst;
  }
  std::vector<float> Decode(const std::vector<std::byte>& src) const {
    std::vector<float> dst(src.size() / codec_->unit_bytes() * head_dim_);
    codec_->Decode(src, dst);
    return dst;
  }

  CodecSpec spec_;
  std::unique_ptr<Codec> codec_;
  int head_dim_ = 0;
};

TEST_P(CodecConformanceTest, DescribesItself) {
  EXPECT_EQ(codec_->name(), std::get<0>(GetParam()));
  EXPECT_EQ(codec_->id(), spec_.id);
  EXPECT_EQ(codec_->head_dim(), head_dim_);
  EXPECT_EQ(codec_->unit_bytes(), spec_.bytes_per_element * head_dim_);
  EXPECT_DOUBLE_EQ(codec_->bits_per_element(), 8.0 * spec_.bytes_per_element);
}

TEST_P(CodecConformanceTest, RoundTripWithinTolerance) {
  const std::vector<float> src = RandomRows(5, head_dim_, 7);
  const std::vector<float> decoded = Decode(Encode(src));
  ASSERT_EQ(decoded.size(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_LE(std::abs(decoded[i] - src[i]), spec_.rel_tolerance * std::abs(src[i]))
        << "element " << i << " value " << src[i];
  }
}

TEST_P(CodecConformanceTest, ZerosStayZero) {
  const std::vector<float> src(3 * head_dim_, 0.0f);
  for (const float x : Decode(Encode(src))) EXPECT_EQ(x, 0.0f);
}

TEST_P(CodecConformanceTest, NonFiniteElementStaysConfined) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (const float special : specials) {
    std::vector<float> src = RandomRows(2, head_dim_, 11);
    const size_t poisoned = head_dim_ / 2;  // inside row 0
    src[poisoned] = special;
    const std::vector<float> decoded = Decode(Encode(src));
    if (std::isnan(special)) {
      EXPECT_TRUE(std::isnan(decoded[poisoned]));
    } else {
      EXPECT_EQ(decoded[poisoned], special);
    }
    for (size_t i = 0; i < src.size(); ++i) {
      if (i == poisoned) continue;
      EXPECT_TRUE(std::isfinite(decoded[i])) << "element " << i << " poisoned by " << special;
      EXPECT_LE(std::abs(decoded[i] - src[i]), spec_.rel_tolerance * std::abs(src[i]));
    }
  }
}

TEST_P(CodecConformanceTest, ManyRowsAtOnceEqualRowByRow) {
  const int num_rows = 6;
  const std::vector<float> src = RandomRows(num_rows, head_dim_, 3);
  const std::vector<std::byte> together = Encode(src);
  const size_t unit_bytes = codec_->unit_bytes();
  std::vector<std::byte> one_by_one(together.size());
  for (int r = 0; r < num_rows; ++r) {
    codec_->Encode(std::span(src).subspan(r * head_dim_, head_dim_),
                   std::span(one_by_one).subspan(r * unit_bytes, unit_bytes));
  }
  EXPECT_EQ(std::memcmp(together.data(), one_by_one.data(), together.size()), 0);

  const std::vector<float> decoded = Decode(together);
  for (int r = 0; r < num_rows; ++r) {
    std::vector<float> row(head_dim_);
    codec_->Decode(std::span(together).subspan(r * unit_bytes, unit_bytes), row);
    for (int d = 0; d < head_dim_; ++d) {
      EXPECT_EQ(std::bit_cast<uint32_t>(row[d]),
                std::bit_cast<uint32_t>(decoded[static_cast<size_t>(r) * head_dim_ + d]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecConformanceTest,
                         ::testing::Combine(::testing::ValuesIn(CodecNames()),
                                            ::testing::Values(1, 8, 64, 128)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(CodecFactoryTest, EveryNameHasASpec) {
  for (const std::string& name : CodecNames()) {
    EXPECT_TRUE(Specs().count(name)) << "declare a tolerance for codec '" << name << "'";
  }
}

TEST(CodecFactoryTest, NamesAreStable) {
  EXPECT_EQ(CodecNames(), (std::vector<std::string>{"f32", "f16", "bf16"}));
}

TEST(CodecFactoryTest, UnknownNameListsAllowed) {
  auto codec = CreateCodec("int3", 64);
  ASSERT_FALSE(codec.ok());
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.status().message(), "unknown codec 'int3'; allowed: f32, f16, bf16");
}

TEST(CodecFactoryTest, HeadDimOutOfRange) {
  for (const int head_dim : {0, -1, 4097}) {
    auto codec = CreateCodec("f16", head_dim);
    ASSERT_FALSE(codec.ok()) << head_dim;
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(codec.status().message()), HasSubstr("1..4096"));
  }
  EXPECT_TRUE(CreateCodec("f16", 4096).ok());
}

}  // namespace
}  // namespace kvstack
