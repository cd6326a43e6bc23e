// Tests of HeadProfile: a round trip through a real file, the one-line errors for a missing,
// foreign, corrupted or truncated file and for another model, and the choice of retrieval
// heads.
#include "kvstack/head_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/scratch_dir.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kHash = 0x0123456789abcdefull;

// A path of this process's own (tests of several processes may share the temp dir).
std::string TempPath(const std::string& name) {
  return testing_support::ScratchDir() + "/head_profile_" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

HeadProfile Sample() {
  HeadProfile profile(kHash, 2, 3);
  const double scores[2][3] = {{0.1, 0.9, 1.0 / 3.0}, {0.0, 0.75, 0.2}};
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 3; ++h) profile.set_score(l, h, scores[l][h]);
  }
  return profile;
}

// The error a file with `text` gets from Load.
std::string LoadError(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  WriteFile(path, text);
  auto loaded = HeadProfile::Load(path);
  std::remove(path.c_str());
  EXPECT_FALSE(loaded.ok()) << name;
  if (loaded.ok()) return "";
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << name;
  const std::string message(loaded.status().message());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, Not(HasSubstr("\n")));
  return message;
}

const char kHeader[] =
    "kvstack-head-profile 1\nmodel_hash 0123456789abcdef\nnum_layers 2\nnum_kv_heads 3\n";

TEST(HeadProfileTest, RoundTripThroughAFile) {
  const HeadProfile profile = Sample();
  const std::string path = TempPath("round_trip.txt");
  ASSERT_TRUE(profile.Save(path).ok());
  auto loaded = HeadProfile::Load(path);
  std::remove(path.c_str());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model_hash(), kHash);
  EXPECT_EQ(loaded->num_layers(), 2);
  EXPECT_EQ(loaded->num_kv_heads(), 3);
  EXPECT_EQ(loaded->path(), path);
  // Exactly, not approximately: the file keeps every bit of the doubles.
  EXPECT_EQ(std::vector<double>(loaded->scores().begin(), loaded->scores().end()),
            std::vector<double>(profile.scores().begin(), profile.scores().end()));
  EXPECT_TRUE(loaded->CheckMatches(kHash, 2, 3).ok());
}

TEST(HeadProfileTest, CommentsAndBlankLinesAreIgnored) {
  const std::string path = TempPath("comments.txt");
  WriteFile(path, std::string("# measured by hand\n\n") + kHeader +
                      "# layer 0\nlayer 0 0.5 0.25 1\n\nlayer 1 0 0 0.125\n");
  auto loaded = HeadProfile::Load(path);
  std::remove(path.c_str());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->score(0, 1), 0.25);
  EXPECT_EQ(loaded->score(1, 2), 0.125);
}

TEST(HeadProfileTest, OtherModelIsAOneLineFailedPrecondition) {
  const std::string path = TempPath("other_model.txt");
  ASSERT_TRUE(Sample().Save(path).ok());
  auto loaded = HeadProfile::Load(path);
  std::remove(path.c_str());
  ASSERT_TRUE(loaded.ok());
  const absl::Status other_hash = loaded->CheckMatches(0xfeedull, 2, 3);
  EXPECT_EQ(other_hash.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(other_hash.message()),
            "head profile '" + path +
                "' was measured on another model (hash 0123456789abcdef; this model "
                "000000000000feed)");
  const absl::Status other_shape = loaded->CheckMatches(kHash, 4, 3);
  EXPECT_EQ(other_shape.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other_shape.message()),
              HasSubstr("has 2 layers x 3 kv heads; the model has 4 x 3"));
  // One built in memory says so instead of a path.
  EXPECT_THAT(std::string(Sample().CheckMatches(1, 2, 3).message()),
              HasSubstr("head profile (in memory) was measured on another model"));
}

TEST(HeadProfileTest, MissingFileIsNotFound) {
  auto loaded = HeadProfile::Load(TempPath("does_not_exist.txt"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("does_not_exist.txt"));
}

TEST(HeadProfileTest, CorruptedFilesNameWhatIsWrong) {
  const std::string header = kHeader;
  EXPECT_THAT(LoadError("empty", ""), HasSubstr("is not a kvstack head profile"));
  EXPECT_THAT(LoadError("binary", "KVSPROF\0\1\2\3"), HasSubstr("is not a kvstack head profile"));
  EXPECT_THAT(LoadError("version", "kvstack-head-profile 2\n"),
              HasSubstr("has version '2'; this kvstack reads version 1"));
  EXPECT_THAT(LoadError("no_shape", "kvstack-head-profile 1\nmodel_hash 0123456789abcdef\n"),
              HasSubstr("is truncated"));
  EXPECT_THAT(LoadError("hash",
                        "kvstack-head-profile 1\nmodel_hash xyz\nnum_layers 2\n"
                        "num_kv_heads 3\n"),
              HasSubstr("line 2: model_hash must be 16 hex digits"));
  EXPECT_THAT(LoadError("order",
                        "kvstack-head-profile 1\nnum_layers 2\nmodel_hash 01\n"
                        "num_kv_heads 3\n"),
              HasSubstr("line 2: expected 'model_hash <value>'"));
  EXPECT_THAT(LoadError("layers",
                        "kvstack-head-profile 1\nmodel_hash 0123456789abcdef\n"
                        "num_layers 0\nnum_kv_heads 3\n"),
              HasSubstr("line 3: num_layers must be in [1, 4096]"));
  EXPECT_THAT(LoadError("huge_heads",
                        "kvstack-head-profile 1\nmodel_hash 0123456789abcdef\n"
                        "num_layers 2\nnum_kv_heads 99999999\n"),
              HasSubstr("line 4: num_kv_heads must be in [1, 4096]"));
  EXPECT_THAT(LoadError("truncated", header + "layer 0 0.1 0.2 0.3\n"),
              HasSubstr("is truncated: 1 of 2 layer lines"));
  EXPECT_THAT(LoadError("few_scores", header + "layer 0 0.1 0.2\nlayer 1 0 0 0\n"),
              HasSubstr("line 5: layer 0 has 2 scores; expected 3"));
  EXPECT_THAT(LoadError("layer_order", header + "layer 1 0 0 0\nlayer 0 0 0 0\n"),
              HasSubstr("line 5: expected 'layer 0' and 3 scores"));
  EXPECT_THAT(LoadError("not_number", header + "layer 0 0.1 zero 0.3\nlayer 1 0 0 0\n"),
              HasSubstr("line 5: score 'zero' of kv head 1 is not a number in [0, 1]"));
  EXPECT_THAT(LoadError("out_of_range", header + "layer 0 0.1 1.5 0.3\nlayer 1 0 0 0\n"),
              HasSubstr("score '1.5' of kv head 1 is not a number in [0, 1]"));
  EXPECT_THAT(LoadError("nan", header + "layer 0 0.1 nan 0.3\nlayer 1 0 0 0\n"),
              HasSubstr("score 'nan' of kv head 1"));
  EXPECT_THAT(LoadError("trailing", header + "layer 0 0 0 0\nlayer 1 0 0 0\nlayer 2 0 0 0\n"),
              HasSubstr("line 7: unexpected line after the 2 layer lines"));
}

TEST(HeadProfileTest, SaveToAnUnwritablePathNamesIt) {
  const absl::Status status = Sample().Save("/nonexistent-dir/profile.txt");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("/nonexistent-dir/profile.txt"));
}

TEST(HeadProfileTest, RetrievalHeadsAreTheTopFractionByScore) {
  const HeadProfile profile = Sample();  // scores 0.1 0.9 0.333 / 0 0.75 0.2
  EXPECT_EQ(profile.RetrievalHeads(0.0), std::vector<bool>(6, false));
  EXPECT_EQ(profile.RetrievalHeads(1.0), std::vector<bool>(6, true));
  EXPECT_EQ(profile.RetrievalHeads(1.0 / 3.0),
            (std::vector<bool>{false, true, false, false, true, false}));
  EXPECT_EQ(profile.RetrievalHeads(0.5),
            (std::vector<bool>{false, true, true, false, true, false}));
  // round(0.25 * 6) = 2 (1.5 rounds away from zero).
  EXPECT_EQ(profile.RetrievalHeads(0.25), profile.RetrievalHeads(1.0 / 3.0));
  // Equal scores: the lower layer, then the lower head.
  HeadProfile flat(kHash, 2, 2);
  EXPECT_EQ(flat.RetrievalHeads(0.5), (std::vector<bool>{true, true, false, false}));
}

TEST(HeadProfileDeathTest, FractionOutsideZeroOneIsABug) {
  EXPECT_DEATH(Sample().RetrievalHeads(1.5), "invariant violated");
  EXPECT_DEATH(Sample().RetrievalHeads(-0.1), "invariant violated");
}

}  // namespace
}  // namespace kvstack
