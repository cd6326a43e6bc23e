// Random-weight Llama models for benchmarks and tests: a GGUF file with every key llama.cpp
// needs to load a llama model, a small SentencePiece-style vocabulary (control tokens, the 256
// byte tokens, then made-up pieces) and random weights scaled so activations stay finite at
// long context. The defaults are the benchmark shape. Deterministic for a given spec.
#pragma once

#include <cstdint>
#include <string>

#include "kvstack/status.h"

namespace kvstack {

class GgufWriter;

struct RandomModelSpec {
  int num_layers = 8;
  int dim = 512;  // embedding width; must be a multiple of num_heads
  int num_heads = 8;
  int num_kv_heads = 8;  // must divide num_heads
  int ffn_dim = 1024;
  int vocab_size = 512;  // >= 259: <unk>, <s>, </s> and the 256 byte tokens come first
  int context_length = 16384;
  bool f16 = true;  // matrices F16 (general.file_type 1) or F32 (0); norms are always F32
  uint64_t seed = 1;
};

// Writes the model to `path`. InvalidArgument naming the field when the spec is invalid; an
// error naming the path when the file cannot be written.
absl::Status WriteRandomLlamaModel(const RandomModelSpec& spec, const std::string& path);

// Adds the tokenizer.ggml.* keys of the synthetic vocabulary WriteRandomLlamaModel uses:
// 0 "<unk>", 1 "<s>" (BOS), 2 "</s>" (EOS), 3..258 the byte tokens "<0x00>".."<0xFF>", then
// distinct made-up pieces up to `vocab_size` (which must be >= 259). For tests that build
// their own llama files.
void AddSyntheticVocab(GgufWriter& writer, int vocab_size);

}  // namespace kvstack
