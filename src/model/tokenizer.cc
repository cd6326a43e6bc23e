// The llama SentencePiece tokenizer: SpmVocab (src/model/tokenizer_vocab.h) does the work on
// plain vectors; Tokenizer::FromGguf reads those vectors from a GGUF file and wraps it. The
// encoder follows llama.cpp's llm_tokenizer_spm, which reproduces SentencePiece's BPE.
#include "kvstack/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/gguf.h"
#include "kvstack/status.h"
#include "model/tokenizer_vocab.h"

namespace kvstack {
namespace internal {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's space

// Bytes in the UTF-8 character at text[pos]. Invalid UTF-8 (a stray continuation byte, a
// truncated sequence) splits into one-byte characters, which later fall back to byte tokens.
// Unlike llama.cpp, which trusts the lead byte alone, a sequence never swallows the bytes of
// the next character: "\xFE " must keep its U+2581 so that the space decodes as a space.
size_t Utf8Length(std::string_view text, size_t pos) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const size_t expected = kLengths[static_cast<uint8_t>(text[pos]) >> 4];
  size_t len = 1;
  while (len < expected && pos + len < text.size() &&
         (static_cast<uint8_t>(text[pos + len]) & 0xC0) == 0x80) {
    ++len;
  }
  return len == expected ? len : 1;
}

// The byte a piece spelled "<0xHH>" stands for, or -1 when it is not spelled that way.
int ParseBytePiece(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

std::string ReplaceSpaceMarkers(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos, kSpaceMarker.size()) == kSpaceMarker) {
      out.push_back(' ');
      pos += kSpaceMarker.size();
    } else {
      out.push_back(text[pos++]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<SpmVocab> SpmVocab::Create(std::vector<std::string> tokens,
                                          std::vector<float> scores,
                                          std::vector<int32_t> token_types, TokenId bos_id,
                                          TokenId eos_id, TokenId unk_id) {
  if (tokens.empty()) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (scores.size() != tokens.size() || token_types.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokenizer: %d tokens but %d scores and %d token types; the three must have equal length",
        tokens.size(), scores.size(), token_types.size()));
  }
  const int64_t vocab_size = static_cast<int64_t>(tokens.size());
  if (vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", vocab_size, " tokens; at most ", INT32_MAX, " are allowed"));
  }
  for (auto [name, id] : {std::pair{"bos", bos_id}, {"eos", eos_id}, {"unk", unk_id}}) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: ", name, " id ", id, " is not a token id; allowed is [0, ", vocab_size, ")"));
    }
  }

  SpmVocab vocab;
  vocab.bos_id_ = bos_id;
  vocab.eos_id_ = eos_id;
  vocab.unk_id_ = unk_id;
  vocab.byte_ids_.assign(256, unk_id);
  vocab.surfaces_.resize(tokens.size());
  for (TokenId id = 0; id < vocab_size; ++id) {
    const int32_t type_value = token_types[id];
    if (type_value < static_cast<int32_t>(TokenType::kUndefined) ||
        type_value > static_cast<int32_t>(TokenType::kByte)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", id, " has type ",
                                                     type_value, "; allowed types are 0..6"));
    }
    std::string& surface = vocab.surfaces_[id];
    switch (static_cast<TokenType>(type_value)) {
      case TokenType::kUndefined:
      case TokenType::kNormal:
      case TokenType::kUserDefined:
        surface = ReplaceSpaceMarkers(tokens[id]);
        vocab.pieces_.insert_or_assign(std::move(tokens[id]), id);
        break;
      case TokenType::kByte: {
        const int byte = ParseBytePiece(tokens[id]);
        if (byte < 0) {
          return absl::InvalidArgumentError(absl::StrCat("tokenizer: byte token ", id, " is \"",
                                                         tokens[id],
                                                         "\"; byte tokens must be "
                                                         "spelled <0xHH>"));
        }
        surface.assign(1, static_cast<char>(byte));
        vocab.byte_ids_[byte] = id;
        break;
      }
      case TokenType::kUnknown:
        surface = kUnknownSurface;
        break;
      case TokenType::kControl:
      case TokenType::kUnused:
        break;  // decode to nothing
    }
  }
  vocab.scores_ = std::move(scores);
  return vocab;
}

TokenId SpmVocab::FindPiece(std::string_view text) const {
  auto it = pieces_.find(text);
  return it == pieces_.end() ? -1 : it->second;
}

std::vector<TokenId> SpmVocab::Encode(std::string_view text, bool add_bos) const {
  std::vector<TokenId> ids;
  if (add_bos) ids.push_back(bos_id_);
  if (text.empty()) return ids;

  // The dummy prefix, then every space as U+2581 (what SentencePiece's normaliser does).
  std::string normalized(kSpaceMarker);
  const size_t num_spaces = std::count(text.begin(), text.end(), ' ');
  normalized.reserve(kSpaceMarker.size() + text.size() + num_spaces * (kSpaceMarker.size() - 1));
  for (char c : text) {
    if (c == ' ') {
      normalized.append(kSpaceMarker);
    } else {
      normalized.push_back(c);
    }
  }
  const std::string_view normal(normalized);

  // Symbols start as UTF-8 characters and stay contiguous ranges [start, start + len) of the
  // text, in a doubly linked list; a merge grows the left symbol and empties the right one.
  struct Symbol {
    size_t start;
    size_t len;  // 0 once merged into its left neighbour
    int64_t prev;
    int64_t next;  // -1 at the ends
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < normal.size();) {
    const size_t len = Utf8Length(normal, pos);
    const int64_t idx = static_cast<int64_t>(symbols.size());
    symbols.push_back({pos, len, idx - 1, idx + 1});
    pos += len;
  }
  symbols.back().next = -1;

  // Candidate merges in a max-heap by (score, then leftmost). A candidate goes stale when either
  // side merges elsewhere first; it is then skipped when popped (its recorded length no longer
  // matches), which keeps each merge O(log n) instead of rescanning all pairs.
  struct Bigram {
    float score;
    int64_t left;
    int64_t right;
    size_t len;
    bool operator<(const Bigram& other) const {  // "lower priority than"
      return score < other.score || (score == other.score && left > other.left);
    }
  };
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int64_t left, int64_t right) {
    if (left < 0 || right < 0) return;
    const size_t len = symbols[left].len + symbols[right].len;
    const TokenId id = FindPiece(normal.substr(symbols[left].start, len));
    if (id >= 0) queue.push({scores_[id], left, right, len});
  };
  for (int64_t idx = 1; idx < static_cast<int64_t>(symbols.size()); ++idx) try_add(idx - 1, idx);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != bigram.len) continue;
    KVS_DCHECK(left.next == bigram.right);
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int64_t idx = 0; idx >= 0; idx = symbols[idx].next) {
    const std::string_view piece = normal.substr(symbols[idx].start, symbols[idx].len);
    if (const TokenId id = FindPiece(piece); id >= 0) {
      ids.push_back(id);
    } else {
      // Only single characters can be missing: every merge produced a piece.
      for (char c : piece) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    }
  }
  return ids;
}

std::string SpmVocab::Decode(std::span<const TokenId> ids, bool strip_leading_space) const {
  std::string text;
  for (TokenId id : ids) {
    KVS_CHECK(id >= 0 && id < vocab_size());
    text.append(surfaces_[id]);
  }
  if (strip_leading_space && !text.empty() && text.front() == ' ') text.erase(0, 1);
  return text;
}

std::string SpmVocab::TokenText(TokenId prev, TokenId id) const {
  KVS_CHECK(id >= 0 && id < vocab_size());
  std::string_view surface = surfaces_[id];
  // After BOS (or at the very start) the first space is the dummy prefix, not the user's text.
  if ((prev < 0 || prev == bos_id_) && !surface.empty() && surface.front() == ' ') {
    surface.remove_prefix(1);
  }
  return std::string(surface);
}

}  // namespace internal

struct Tokenizer::Impl {
  internal::SpmVocab vocab;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

namespace {

// Prefixes a GGUF getter's error so that it names the key (unless the reader already did), so a
// user knows which entry is missing or wrong. Keys are const char* because this absl's StrCat
// takes absl::string_view, which is not std::string_view here.
absl::Status KeyError(const char* key, const absl::Status& status) {
  if (absl::StrContains(status.message(), key)) {
    return absl::Status(status.code(), absl::StrCat("tokenizer: ", status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrCat("tokenizer: GGUF key ", key, ": ", status.message()));
}

absl::StatusOr<TokenId> GetTokenId(const GgufFile& gguf, const char* key) {
  absl::StatusOr<int64_t> value = gguf.GetInt(key);
  if (!value.ok()) return KeyError(key, value.status());
  if (*value < 0 || *value > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: GGUF key ", key, " is ", *value,
                                                   "; a token id must be in [0, ", INT32_MAX, "]"));
  }
  return static_cast<TokenId>(*value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  constexpr const char* kModelKey = "tokenizer.ggml.model";
  absl::StatusOr<std::string> model = gguf.GetString(kModelKey);
  if (!model.ok()) return KeyError(kModelKey, model.status());
  if (*model != "llama") {
    return absl::UnimplementedError(absl::StrCat("tokenizer: ", kModelKey, " is \"", *model,
                                                 "\"; only \"llama\" (SentencePiece) is "
                                                 "supported"));
  }

  constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
  absl::StatusOr<std::vector<std::string>> tokens = gguf.GetStringArray(kTokensKey);
  if (!tokens.ok()) return KeyError(kTokensKey, tokens.status());
  constexpr const char* kScoresKey = "tokenizer.ggml.scores";
  absl::StatusOr<std::vector<float>> scores = gguf.GetFloatArray(kScoresKey);
  if (!scores.ok()) return KeyError(kScoresKey, scores.status());
  constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
  absl::StatusOr<std::vector<int64_t>> types_wide = gguf.GetIntArray(kTypesKey);
  if (!types_wide.ok()) return KeyError(kTypesKey, types_wide.status());
  KVS_ASSIGN_OR_RETURN(const TokenId bos_id, GetTokenId(gguf, "tokenizer.ggml.bos_token_id"));
  KVS_ASSIGN_OR_RETURN(const TokenId eos_id, GetTokenId(gguf, "tokenizer.ggml.eos_token_id"));
  KVS_ASSIGN_OR_RETURN(const TokenId unk_id, GetTokenId(gguf, "tokenizer.ggml.unknown_token_id"));

  if (scores->size() != tokens->size() || types_wide->size() != tokens->size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokenizer: %s has %d entries, %s %d and %s %d; the three must have equal length",
        kTokensKey, tokens->size(), kScoresKey, scores->size(), kTypesKey, types_wide->size()));
  }
  std::vector<int32_t> types(types_wide->size());
  for (size_t idx = 0; idx < types.size(); ++idx) {
    const int64_t type = (*types_wide)[idx];
    if (type < 0 || type > INT32_MAX) {  // SpmVocab::Create checks the range of the rest
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", kTypesKey, "[", idx, "] is ",
                                                     type, "; allowed types are 0..6"));
    }
    types[idx] = static_cast<int32_t>(type);
  }

  KVS_ASSIGN_OR_RETURN(internal::SpmVocab vocab,
                       internal::SpmVocab::Create(*std::move(tokens), *std::move(scores),
                                                  std::move(types), bos_id, eos_id, unk_id));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::make_unique<Impl>(Impl{std::move(vocab)})));
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  return impl_->vocab.Encode(text, add_bos);
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool strip_leading_space) const {
  return impl_->vocab.Decode(ids, strip_leading_space);
}

std::string Tokenizer::TokenText(TokenId prev, TokenId id) const {
  return impl_->vocab.TokenText(prev, id);
}

int Tokenizer::vocab_size() const { return impl_->vocab.vocab_size(); }
TokenId Tokenizer::bos_id() const { return impl_->vocab.bos_id(); }
TokenId Tokenizer::eos_id() const { return impl_->vocab.eos_id(); }

}  // namespace kvstack
