// Tests of the layer schedules: uniform and PyramidKV's linear pyramid (total exact, budgets
// non-increasing with the layer, the top at least min_budget, within one token of the line),
// and the schedule names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kvstack/policy.h"

namespace kvstack {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

TEST(LayerBudgetsTest, UniformGivesEveryLayerTheAverage) {
  EXPECT_THAT(LayerBudgets(5, 128, LayerSchedule::kUniform, 16), Each(128));
  EXPECT_EQ(LayerBudgets(1, 7, LayerSchedule::kPyramid, 0), (std::vector<int>{7}));
}

TEST(LayerBudgetsTest, PyramidOnHandChecked) {
  // Top max(8, 100 / 20) = 8, bottom 192, 4 steps of 46.
  EXPECT_EQ(LayerBudgets(5, 100, LayerSchedule::kPyramid, 8),
            (std::vector<int>{192, 146, 100, 54, 8}));
  // Top 100 / 20 = 5, bottom 195; steps of 190 / 3 = 63.33: floors 195, 131, 68, 5 (sum 399)
  // and the one remaining token goes to the largest fractional part (layer 1: 0.67).
  EXPECT_EQ(LayerBudgets(4, 100, LayerSchedule::kPyramid, 0), (std::vector<int>{195, 132, 68, 5}));
}

TEST(LayerBudgetsTest, PyramidPropertiesOverManyShapes) {
  for (int num_layers : {2, 3, 5, 8, 22, 32, 80}) {
    for (int average : {1, 3, 16, 64, 100, 128, 256, 1000}) {
      for (int min_budget : {0, 1, 4, 32, 200}) {
        SCOPED_TRACE(testing::Message()
                     << num_layers << " layers, average " << average << ", min " << min_budget);
        const std::vector<int> b =
            LayerBudgets(num_layers, average, LayerSchedule::kPyramid, min_budget);
        ASSERT_EQ(static_cast<int>(b.size()), num_layers);
        EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}),
                  static_cast<int64_t>(num_layers) * average);
        EXPECT_TRUE(std::is_sorted(b.rbegin(), b.rend()));  // non-increasing with the layer
        const int top = std::min(average, std::max(min_budget, average / 20));
        EXPECT_EQ(b.back(), top);
        EXPECT_EQ(b.front(), 2 * average - top);
        EXPECT_GE(*std::min_element(b.begin(), b.end()), std::min(min_budget, average));
        for (int l = 0; l < num_layers; ++l) {
          const double line =
              (2.0 * average - top) - l * (2.0 * (average - top)) / (num_layers - 1);
          EXPECT_LT(std::fabs(b[l] - line), 1.0) << "layer " << l;
        }
      }
    }
  }
}

TEST(LayerBudgetsTest, MinBudgetAboveTheAverageLeavesEveryLayerTheAverage) {
  EXPECT_THAT(LayerBudgets(6, 10, LayerSchedule::kPyramid, 12), Each(10));
}

TEST(LayerScheduleTest, NamesRoundTripAndUnknownIsAnError) {
  for (LayerSchedule s : {LayerSchedule::kUniform, LayerSchedule::kPyramid}) {
    auto parsed = ParseLayerSchedule(LayerScheduleName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  auto bad = ParseLayerSchedule("pyramidkv");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("unknown layer schedule 'pyramidkv'; allowed: uniform, pyramid"));
}

}  // namespace
}  // namespace kvstack
