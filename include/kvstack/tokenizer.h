// Tokenizer: llama SentencePiece (BPE) built from a GGUF vocabulary — score-ordered merges,
// byte fallback for anything not in the vocabulary, a dummy-prefix space, U+2581 for space.
// Immutable after creation; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstack/status.h"

namespace kvstack {

class GgufFile;

using TokenId = int32_t;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id}. Only model "llama" is supported; anything else is an error naming it.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  // Encodes text. add_bos puts bos_id() first. The dummy prefix (a space before the text)
  // is added as SentencePiece does.
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;
  // Decodes ids to bytes: U+2581 becomes space, byte tokens become their byte, control
  // tokens (BOS/EOS) become nothing. The leading dummy-prefix space of the first piece is
  // dropped when `strip_leading_space` is set (decoding a whole encoded text).
  std::string Decode(std::span<const TokenId> ids, bool strip_leading_space = true) const;
  // The text of one token as it appears when streamed after `prev` (handles the dummy prefix
  // after BOS and byte tokens). Bytes of a multi-byte UTF-8 character may arrive split.
  std::string TokenText(TokenId prev, TokenId id) const;

  int vocab_size() const;
  TokenId bos_id() const;
  TokenId eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;

 public:
  ~Tokenizer();
};

}  // namespace kvstack
