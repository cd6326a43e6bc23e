// LlamaModel: the hyper-parameters and weights of a Llama-architecture GGUF model, plus its
// tokenizer. F32 and F16 weights are used in place from the memory-mapped file; BF16 and
// Q8_0 weights are converted to F32 once at load. Immutable after Load; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstack/gguf.h"
#include "kvstack/status.h"
#include "kvstack/tokenizer.h"

namespace kvstack {

enum class RopeStyle : uint8_t {
  kNormal = 0,  // rotate adjacent pairs (x[2i], x[2i+1]) — llama.cpp LLAMA_ROPE_TYPE_NORM
  kNeox = 1,    // rotate halves (x[i], x[i + head_dim/2]) — LLAMA_ROPE_TYPE_NEOX
};

struct LlamaHparams {
  int num_layers = 0;
  int dim = 0;  // embedding width
  int num_heads = 0;
  int num_kv_heads = 0;  // < num_heads: grouped-query attention
  int head_dim = 0;      // dim / num_heads
  int ffn_dim = 0;
  int vocab_size = 0;
  int context_length = 0;  // from the file (may exceed what the model was trained on)
  int rope_dim = 0;        // dimensions rotated per head (<= head_dim)
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  // kNormal for architecture "llama", as llama.cpp does. The optional kvstack-specific bool
  // key "kvstack.rope.neox" = true selects kNeox (used by tests to exercise both styles).
  RopeStyle rope_style = RopeStyle::kNormal;
};

enum class WeightType : uint8_t { kF32 = 0, kF16 = 1 };

// A row-major matrix [rows, cols]: `rows` outputs, each a dot product over `cols` inputs
// (GGUF dims [cols, rows]). Points into the mapped file or into the model's own buffers.
struct WeightMatrix {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;
  int rows = 0;
  int cols = 0;
};

struct LlamaLayerWeights {
  std::span<const float> attn_norm;  // [dim]
  WeightMatrix wq;                   // [num_heads * head_dim, dim]
  WeightMatrix wk;                   // [num_kv_heads * head_dim, dim]
  WeightMatrix wv;                   // [num_kv_heads * head_dim, dim]
  WeightMatrix wo;                   // [dim, num_heads * head_dim]
  std::span<const float> ffn_norm;   // [dim]
  WeightMatrix w_gate;               // [ffn_dim, dim]
  WeightMatrix w_up;                 // [ffn_dim, dim]
  WeightMatrix w_down;               // [dim, ffn_dim]
};

class LlamaModel {
 public:
  // Loads a GGUF file whose general.architecture is "llama". Missing keys or tensors, shapes
  // that disagree with the hyper-parameters and unsupported types are errors naming them.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path);
  ~LlamaModel();

  const LlamaHparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& gguf() const { return *gguf_; }
  const std::string& path() const { return path_; }

  const WeightMatrix& token_embedding() const { return token_embedding_; }  // [vocab, dim]
  std::span<const float> output_norm() const { return output_norm_; }       // [dim]
  // [vocab, dim]; the token embedding itself when the model ties them.
  const WeightMatrix& output() const { return output_; }
  const LlamaLayerWeights& layer(int layer_idx) const { return layers_[layer_idx]; }
  // Bytes of weight data as used by the forward pass.
  size_t weight_bytes() const;

 private:
  LlamaModel() = default;

  std::string path_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
  LlamaHparams hparams_;
  WeightMatrix token_embedding_;
  std::span<const float> output_norm_;
  WeightMatrix output_;
  std::vector<LlamaLayerWeights> layers_;
  std::vector<std::vector<float>> converted_;  // owned F32 copies of BF16 / Q8_0 tensors
};

}  // namespace kvstack
