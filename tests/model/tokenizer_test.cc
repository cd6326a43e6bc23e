// Tests of the SentencePiece tokenizer: the merge order, byte fallback and decoding on small
// hand-made vocabularies (internal::SpmVocab), then golden results on the real stories260K
// vocabulary read through Tokenizer::FromGguf, and FromGguf's errors on malformed metadata.
#include "kvstack/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kvstack/gguf.h"
#include "model/tokenizer_vocab.h"

namespace kvstack {
namespace {

using internal::SpmVocab;
using internal::TokenType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581

// A llama-style vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF> (when with_bytes),
// then `pieces` (text with U+2581 for space, score) as normal tokens.
struct VocabSpec {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

VocabSpec MakeSpec(const std::vector<std::pair<std::string, float>>& pieces, bool with_bytes) {
  VocabSpec spec;
  auto add = [&](std::string text, float score, TokenType type) {
    spec.tokens.push_back(std::move(text));
    spec.scores.push_back(score);
    spec.types.push_back(static_cast<int32_t>(type));
  };
  add("<unk>", 0.0f, TokenType::kUnknown);
  add("<s>", 0.0f, TokenType::kControl);
  add("</s>", 0.0f, TokenType::kControl);
  if (with_bytes) {
    for (int byte = 0; byte < 256; ++byte) {
      add(absl::StrFormat("<0x%02X>", byte), 0.0f, TokenType::kByte);
    }
  }
  for (const auto& [text, score] : pieces) add(text, score, TokenType::kNormal);
  return spec;
}

SpmVocab MakeVocab(const std::vector<std::pair<std::string, float>>& pieces,
                   bool with_bytes = true) {
  VocabSpec spec = MakeSpec(pieces, with_bytes);
  absl::StatusOr<SpmVocab> vocab =
      SpmVocab::Create(spec.tokens, spec.scores, spec.types, /*bos_id=*/1, /*eos_id=*/2,
                       /*unk_id=*/0);
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  return *std::move(vocab);
}

std::string S(const std::string& text) {  // spaces as U+2581, for readable piece lists
  std::string out;
  for (char c : text) out += (c == ' ') ? std::string(kSpace) : std::string(1, c);
  return out;
}

// The ids of the pieces, in vocabulary order after the 259 special and byte tokens.
constexpr TokenId kFirstPiece = 259;
TokenId ByteId(uint8_t byte) { return 3 + byte; }

TEST(SpmVocabTest, HigherScoreMergesFirst) {
  // "abc" -> ▁ a b c. "bc" (-1) beats "ab" (-2); then "▁a" (-5) is the only pair left.
  const SpmVocab vocab = MakeVocab(
      {{S(" "), -10}, {"a", -10}, {"b", -10}, {"c", -10}, {"ab", -2}, {"bc", -1}, {S(" a"), -5}});
  const TokenId kBc = kFirstPiece + 5, kSpaceA = kFirstPiece + 6;
  EXPECT_THAT(vocab.Encode("abc", /*add_bos=*/false), ElementsAre(kSpaceA, kBc));
}

TEST(SpmVocabTest, EqualScoresMergeLeftmostFirst) {
  // ▁ a a a: both "aa" pairs score 0; the leftmost wins, leaving a lone "a" on the right.
  const SpmVocab vocab = MakeVocab({{S(" "), -10}, {"a", -10}, {"aa", 0}, {S(" a"), -5}});
  const TokenId kSpaceId = kFirstPiece, kA = kFirstPiece + 1, kAa = kFirstPiece + 2;
  EXPECT_THAT(vocab.Encode("aaa", false), ElementsAre(kSpaceId, kAa, kA));
}

TEST(SpmVocabTest, MergesChainIntoLongerPieces) {
  const SpmVocab vocab =
      MakeVocab({{S(" "), -10}, {"h", -10}, {"i", -10}, {"hi", -1}, {S(" hi"), -2}, {S(" h"), -3}});
  const TokenId kSpaceHi = kFirstPiece + 4, kSpaceId = kFirstPiece;
  // "hi hi": ▁hi ▁hi; the spaces become U+2581 and the dummy prefix comes first.
  EXPECT_THAT(vocab.Encode("hi hi", /*add_bos=*/true), ElementsAre(1, kSpaceHi, kSpaceHi));
  // Two spaces: the first is a lone ▁.
  EXPECT_THAT(vocab.Encode(" hi", false), ElementsAre(kSpaceId, kSpaceHi));
}

TEST(SpmVocabTest, EmptyTextGivesNothingOrBos) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}});
  EXPECT_TRUE(vocab.Encode("", false).empty());
  EXPECT_THAT(vocab.Encode("", true), ElementsAre(1));
  EXPECT_EQ(vocab.Decode({}, true), "");
}

TEST(SpmVocabTest, UnknownCharactersFallBackToBytes) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {"x", 0}, {"\xE6\x97\xA5", 0}});  // 日
  // "é" (C3 A9) is not a piece: its two bytes; "日" is one piece; "\n" falls back to 0x0A.
  EXPECT_THAT(vocab.Encode("\xC3\xA9x\xE6\x97\xA5\n", false),
              ElementsAre(kFirstPiece, ByteId(0xC3), ByteId(0xA9), kFirstPiece + 1, kFirstPiece + 2,
                          ByteId(0x0A)));
}

TEST(SpmVocabTest, InvalidUtf8FallsBackToBytesAndRoundTrips) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {"a", 0}});
  // A stray lead byte, a stray continuation, a truncated sequence, and a space right after it
  // that must stay a U+2581 piece (not be taken as the sequence's third byte).
  const std::string text = "a\xFF\x80\xE6\x97 a";
  const std::vector<TokenId> ids = vocab.Encode(text, false);
  EXPECT_THAT(ids, ElementsAre(kFirstPiece, kFirstPiece + 1, ByteId(0xFF), ByteId(0x80),
                               ByteId(0xE6), ByteId(0x97), kFirstPiece, kFirstPiece + 1));
  EXPECT_EQ(vocab.Decode(ids, true), text);
}

TEST(SpmVocabTest, MissingByteTokenGivesUnk) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {"a", 0}}, /*with_bytes=*/false);
  const TokenId kSpaceId = 3, kA = 4;
  EXPECT_THAT(vocab.Encode("a\xC3\xA9", false), ElementsAre(kSpaceId, kA, 0, 0));
}

TEST(SpmVocabTest, ControlAndByteTokensAreNotMatchedFromText) {
  // "<s>" and "<0x41>" typed as text must not become the control or byte token.
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {"<", 0}, {"s", 0}, {">", 0}, {"<s", 1}});
  const std::vector<TokenId> ids = vocab.Encode("<s>", false);
  EXPECT_THAT(ids, ElementsAre(kFirstPiece, kFirstPiece + 4, kFirstPiece + 3));
}

TEST(SpmVocabTest, DecodeRules) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {S(" hi"), 0}, {"!", 0}});
  const TokenId kSpaceHi = kFirstPiece + 1, kBang = kFirstPiece + 2;
  // BOS/EOS vanish, U+2581 is a space, byte tokens are their bytes, <unk> is " ⁇ ".
  EXPECT_EQ(vocab.Decode(std::vector<TokenId>{1, kSpaceHi, ByteId('\n'), kBang, 0, 2}, false),
            " hi\n! \xE2\x81\x87 ");
  EXPECT_EQ(vocab.Decode(std::vector<TokenId>{1, kSpaceHi, kSpaceHi}, true), "hi hi");
  // Only one leading space is the dummy prefix.
  EXPECT_EQ(vocab.Decode(std::vector<TokenId>{kFirstPiece, kSpaceHi}, true), " hi");
}

TEST(SpmVocabTest, TokenTextDropsTheDummyPrefixOnlyAtTheStart) {
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {S(" Once"), 0}});
  const TokenId kSpaceOnce = kFirstPiece + 1;
  EXPECT_EQ(vocab.TokenText(1, kSpaceOnce), "Once");   // after BOS
  EXPECT_EQ(vocab.TokenText(-1, kSpaceOnce), "Once");  // at the very start
  EXPECT_EQ(vocab.TokenText(kSpaceOnce, kSpaceOnce), " Once");
  EXPECT_EQ(vocab.TokenText(kSpaceOnce, ByteId(0xE6)), "\xE6");
  EXPECT_EQ(vocab.TokenText(kSpaceOnce, 2), "");  // EOS
}

TEST(SpmVocabTest, RoundTripsEdgeCases) {
  const SpmVocab vocab = MakeVocab({{S(" "), -1},
                                    {"a", -2},
                                    {"n", -2},
                                    {"\xC3\xAF", -2},  // ï
                                    {"na", -1},
                                    {S(" na"), 0},
                                    {S("  "), 0}});
  for (const std::string text :
       {"", " ", "   ", "\n", "\n\n a\n", "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC",
        "  leading", "trailing  ", "\t\x01\x7F\xFF", "a  b   c"}) {
    EXPECT_EQ(vocab.Decode(vocab.Encode(text, true), true), text) << "text: \"" << text << "\"";
  }
}

TEST(SpmVocabTest, LongInputIsNotQuadratic) {
  // 256k equal characters: every step has many equal-score candidates, which a rescan of all
  // pairs per merge would take minutes over.
  const SpmVocab vocab = MakeVocab({{S(" "), 0}, {"a", 0}, {"aa", 1}, {"aaaa", 2}});
  const std::string text(256 * 1024, 'a');
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = vocab.Encode(text, false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(ids.size(), 1 + text.size() / 4);
  EXPECT_EQ(ids[1], kFirstPiece + 3);
  EXPECT_LT(seconds, 3.0);
}

TEST(SpmVocabTest, CreateRejectsBadVocabularies) {
  VocabSpec spec = MakeSpec({{"a", 0}}, true);
  auto create = [](VocabSpec s, TokenId bos = 1) {
    return SpmVocab::Create(s.tokens, s.scores, s.types, bos, 2, 0).status();
  };
  EXPECT_THAT(SpmVocab::Create({}, {}, {}, 0, 0, 0).status().message(), HasSubstr("empty"));
  {
    VocabSpec bad = spec;
    bad.scores.pop_back();
    EXPECT_THAT(create(bad).message(), HasSubstr("equal length"));
  }
  {
    VocabSpec bad = spec;
    bad.types[5] = 9;
    EXPECT_THAT(create(bad).message(), HasSubstr("token 5 has type 9"));
  }
  {
    VocabSpec bad = spec;
    bad.tokens[3] = "<0xZZ>";
    EXPECT_THAT(create(bad).message(), HasSubstr("<0xHH>"));
  }
  EXPECT_THAT(create(spec, /*bos=*/260).message(), HasSubstr("bos id 260"));
  EXPECT_THAT(create(spec, /*bos=*/-1).message(), HasSubstr("bos id -1"));
  EXPECT_TRUE(create(spec).ok());
}

// ---- The real vocabulary, through FromGguf ----

std::string SharedPath(const std::string& relative) {
  return std::string(KVS_SHARED_DIR) + "/" + relative;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class StoriesTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<GgufFile>> gguf =
        GgufFile::Open(SharedPath("models/stories260K.gguf"));
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer).release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static const Tokenizer* tokenizer_;
};
const Tokenizer* StoriesTokenizerTest::tokenizer_ = nullptr;

TEST_F(StoriesTokenizerTest, VocabularyFacts) {
  ASSERT_NE(tokenizer_, nullptr);
  EXPECT_EQ(tokenizer_->vocab_size(), 512);
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_id(), 2);
}

TEST_F(StoriesTokenizerTest, EncodesOnceUponATime) {
  ASSERT_NE(tokenizer_, nullptr);
  EXPECT_THAT(tokenizer_->Encode("Once upon a time", true), ElementsAre(1, 403, 407, 261, 378));
  std::string streamed;
  TokenId prev = -1;
  for (TokenId id : tokenizer_->Encode("Once upon a time", true)) {
    streamed += tokenizer_->TokenText(prev, id);
    prev = id;
  }
  EXPECT_EQ(streamed, "Once upon a time");
}

TEST_F(StoriesTokenizerTest, EncodesTinyStoriesLikeTheReference) {
  ASSERT_NE(tokenizer_, nullptr);
  const std::string text = ReadFile(SharedPath("data/tinystories_valid_head256k.txt"));
  const std::string raw = ReadFile(SharedPath("data/tinystories_valid_head256k.stories260K.u16le"));
  ASSERT_EQ(raw.size() % 2, 0u);
  std::vector<TokenId> expected(raw.size() / 2);
  for (size_t idx = 0; idx < expected.size(); ++idx) {
    expected[idx] = static_cast<uint8_t>(raw[2 * idx]) |
                    (static_cast<TokenId>(static_cast<uint8_t>(raw[2 * idx + 1])) << 8);
  }
  ASSERT_EQ(expected.size(), 127606u);

  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = tokenizer_->Encode(text, /*add_bos=*/false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 3.0) << "encoding 256 KB must not be quadratic";

  size_t first_diff = 0;
  while (first_diff < ids.size() && first_diff < expected.size() &&
         ids[first_diff] == expected[first_diff]) {
    ++first_diff;
  }
  if (first_diff < ids.size() || first_diff < expected.size()) {
    auto window = [&](const std::vector<TokenId>& v) {
      std::ostringstream out;
      const size_t begin = first_diff < 8 ? 0 : first_diff - 8;
      for (size_t idx = begin; idx < std::min(v.size(), first_diff + 8); ++idx) {
        out << (idx == first_diff ? "[" : "") << v[idx] << (idx == first_diff ? "] " : " ");
      }
      return out.str();
    };
    ADD_FAILURE() << "encoded " << ids.size() << " ids, expected " << expected.size()
                  << "; first difference at index " << first_diff << "\n  got:      " << window(ids)
                  << "\n  expected: " << window(expected);
  }
  EXPECT_TRUE(tokenizer_->Decode(expected, true) == text)
      << "decoding the reference ids does not give the text back";
}

TEST_F(StoriesTokenizerTest, RoundTripsEdgeCases) {
  ASSERT_NE(tokenizer_, nullptr);
  for (const std::string text :
       {"", " ", "    ", "\n", "\n\nThe end.\n",
        "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC", "  two leading", "trailing   ",
        "\x01\x7F\xFF\xFE bytes", "Lily's mom said, \"Yes!\""}) {
    for (bool add_bos : {false, true}) {
      EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, add_bos)), text)
          << "text: \"" << text << "\" add_bos " << add_bos;
    }
  }
}

// ---- FromGguf's validation of the metadata ----

struct TokenizerKeys {
  std::string model = "llama";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"};
  std::vector<float> scores = {0, 0, 0, -1, -1};
  std::vector<int32_t> types = {2, 3, 3, 1, 1};
  std::string skip;  // a key to leave out
};

absl::StatusOr<std::unique_ptr<Tokenizer>> FromKeys(const TokenizerKeys& keys,
                                                    std::vector<std::byte>& bytes) {
  GgufWriter writer;
  auto add = [&](const std::string& key, auto&& add_fn) {
    if (key != keys.skip) add_fn(key);
  };
  add("tokenizer.ggml.model", [&](std::string k) { writer.AddString(k, keys.model); });
  add("tokenizer.ggml.tokens", [&](std::string k) { writer.AddStringArray(k, keys.tokens); });
  add("tokenizer.ggml.scores", [&](std::string k) { writer.AddFloat32Array(k, keys.scores); });
  add("tokenizer.ggml.token_type", [&](std::string k) { writer.AddInt32Array(k, keys.types); });
  add("tokenizer.ggml.bos_token_id", [&](std::string k) { writer.AddUint32(k, 1); });
  add("tokenizer.ggml.eos_token_id", [&](std::string k) { writer.AddUint32(k, 2); });
  add("tokenizer.ggml.unknown_token_id", [&](std::string k) { writer.AddUint32(k, 0); });
  bytes = writer.Serialize();
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Parse(bytes);
  if (!gguf.ok()) return gguf.status();
  return Tokenizer::FromGguf(**gguf);
}

TEST(TokenizerFromGgufTest, ReadsASmallVocabulary) {
  std::vector<std::byte> bytes;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromKeys({}, bytes);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 5);
  EXPECT_THAT((*tokenizer)->Encode("a a", true), ElementsAre(1, 3, 4, 3, 4));
}

TEST(TokenizerFromGgufTest, RejectsOtherModels) {
  TokenizerKeys keys;
  keys.model = "gpt2";
  std::vector<std::byte> bytes;
  absl::Status status = FromKeys(keys, bytes).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("\"gpt2\""));
}

TEST(TokenizerFromGgufTest, NamesAMissingKey) {
  for (const std::string key :
       {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id"}) {
    TokenizerKeys keys;
    keys.skip = key;
    std::vector<std::byte> bytes;
    absl::Status status = FromKeys(keys, bytes).status();
    EXPECT_FALSE(status.ok()) << key;
    EXPECT_THAT(status.message(), HasSubstr(key));
  }
}

TEST(TokenizerFromGgufTest, RejectsArraysOfDifferentLengths) {
  TokenizerKeys keys;
  keys.scores.pop_back();
  std::vector<std::byte> bytes;
  absl::Status status = FromKeys(keys, bytes).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("equal length"));
}

}  // namespace
}  // namespace kvstack
