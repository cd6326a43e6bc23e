// SpmVocab: the engine behind kvstack::Tokenizer — a SentencePiece (llama "spm") vocabulary
// built from plain vectors, with the encoder (score-ordered merges, byte fallback) and the
// decoder. Tokenizer::FromGguf reads the vectors from a GGUF file and wraps one of these; tests
// build small hand-made vocabularies here without a GGUF file. Internal to src/model.
// Immutable after creation; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvstack/status.h"
#include "kvstack/tokenizer.h"

namespace kvstack::internal {

// Token types as llama.cpp numbers them (tokenizer.ggml.token_type). Persisted in GGUF files:
// explicit values, append-only.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// How an unknown token (type kUnknown) decodes: SentencePiece's default unk surface, so that a
// reader sees that text was lost instead of silently getting nothing.
inline constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";  // " ⁇ "

class SpmVocab {
 public:
  // tokens, scores, token_types: [vocab_size] each (token_types holds TokenType values).
  // InvalidArgument when the vocabulary is empty, the lengths differ, a type is not a TokenType,
  // a kByte token is not spelled "<0xHH>", or bos/eos/unk is not an id in [0, vocab_size).
  // When a text occurs twice, the later id wins (as in llama.cpp).
  static absl::StatusOr<SpmVocab> Create(std::vector<std::string> tokens, std::vector<float> scores,
                                         std::vector<int32_t> token_types, TokenId bos_id,
                                         TokenId eos_id, TokenId unk_id);

  // See Tokenizer::Encode. Pieces of type normal, user-defined and undefined take part in
  // merges; control, byte, unknown and unused pieces are never matched from text. Characters
  // left unmatched fall back to their bytes' "<0xHH>" pieces, or to unk_id if one is missing.
  // O(n log n) in the text length.
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;
  // See Tokenizer::Decode. Unknown tokens decode to kUnknownSurface, unused ones to nothing.
  // Every id must lie in [0, vocab_size()) (checked).
  std::string Decode(std::span<const TokenId> ids, bool strip_leading_space) const;
  // See Tokenizer::TokenText. Both ids follow Decode's rules; prev < 0 means "no previous".
  std::string TokenText(TokenId prev, TokenId id) const;

  int vocab_size() const { return static_cast<int>(surfaces_.size()); }
  TokenId bos_id() const { return bos_id_; }
  TokenId eos_id() const { return eos_id_; }
  TokenId unk_id() const { return unk_id_; }

 private:
  // Lets the piece map be searched with a string_view into the text (no allocation per probe).
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

  SpmVocab() = default;
  // The id of a mergeable piece spelled `text`, or -1.
  TokenId FindPiece(std::string_view text) const;

  PieceMap pieces_;                    // mergeable pieces only, by their text (with U+2581)
  std::vector<float> scores_;          // [vocab_size]
  std::vector<std::string> surfaces_;  // [vocab_size] decoded bytes of each token
  std::vector<TokenId> byte_ids_;      // [256] id of "<0xHH>", or unk_id_ when missing
  TokenId bos_id_ = 0;
  TokenId eos_id_ = 0;
  TokenId unk_id_ = 0;
};

}  // namespace kvstack::internal
