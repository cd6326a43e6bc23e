// WriteRandomLlamaModel: builds a llama GGUF with random weights through GgufWriter. The
// random numbers come from splitmix64 rather than <random> distributions, whose output differs
// between standard libraries, so a spec names the same file bytes on every machine.
#include "kvstack/random_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstack/check.h"
#include "kvstack/gguf.h"
#include "kvstack/numeric.h"

namespace kvstack {
namespace {

constexpr int kNumByteTokens = 256;
constexpr int kFirstByteToken = 3;  // after <unk>, <s>, </s>
constexpr int kMinVocab = kFirstByteToken + kNumByteTokens;

// SentencePiece token types, as llama.cpp numbers them.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenUnknown = 2;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenByte = 6;

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>(Next() >> 40) * 0x1p-23f - 1.0f; }

 private:
  uint64_t state_;
};

absl::Status Validate(const RandomModelSpec& s) {
  auto positive = [](const char* name, int v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("random model: %s is %d; it must be positive", name, v));
  };
  KVS_RETURN_IF_ERROR(positive("num_layers", s.num_layers));
  KVS_RETURN_IF_ERROR(positive("dim", s.dim));
  KVS_RETURN_IF_ERROR(positive("num_heads", s.num_heads));
  KVS_RETURN_IF_ERROR(positive("num_kv_heads", s.num_kv_heads));
  KVS_RETURN_IF_ERROR(positive("ffn_dim", s.ffn_dim));
  KVS_RETURN_IF_ERROR(positive("context_length", s.context_length));
  if (s.dim % s.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "random model: dim %d is not a multiple of num_heads %d", s.dim, s.num_heads));
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("random model: num_heads %d is not a multiple of num_kv_heads %d",
                        s.num_heads, s.num_kv_heads));
  }
  if (s.vocab_size < kMinVocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "random model: vocab_size is %d; it must be at least %d (<unk>, <s>, </s> and 256 byte "
        "tokens)",
        s.vocab_size, kMinVocab));
  }
  return absl::OkStatus();
}

// Bijective base-26 letters for n >= 0: a..z, aa, ab, ... — distinct for distinct n.
std::string Letters(int n) {
  std::string s;
  for (++n; n > 0; n = (n - 1) / 26) s.insert(s.begin(), static_cast<char>('a' + (n - 1) % 26));
  return s;
}

}  // namespace

void AddSyntheticVocab(GgufWriter& w, int vocab_size) {
  KVS_CHECK(vocab_size >= kMinVocab);
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {kTokenUnknown, kTokenControl, kTokenControl};
  for (int b = 0; b < kNumByteTokens; ++b) {
    tokens.push_back(absl::StrFormat("<0x%02X>", b));
    scores.push_back(0);
    types.push_back(kTokenByte);
  }
  // Normal pieces alternate word-initial ("\u2581" + letters) and word-internal (letters).
  for (int k = 0; static_cast<int>(tokens.size()) < vocab_size; ++k) {
    tokens.push_back(absl::StrCat(k % 2 == 0 ? "\xe2\x96\x81" : "", Letters(k / 2)));
    scores.push_back(-static_cast<float>(k));
    types.push_back(kTokenNormal);
  }
  w.AddString("tokenizer.ggml.model", "llama");
  w.AddStringArray("tokenizer.ggml.tokens", std::move(tokens));
  w.AddFloat32Array("tokenizer.ggml.scores", std::move(scores));
  w.AddInt32Array("tokenizer.ggml.token_type", std::move(types));
  w.AddUint32("tokenizer.ggml.bos_token_id", 1);
  w.AddUint32("tokenizer.ggml.eos_token_id", 2);
  w.AddUint32("tokenizer.ggml.unknown_token_id", 0);
}

namespace {

std::vector<std::byte> RandomMatrix(SplitMix64& rng, int rows, int cols, bool f16) {
  // Uniform with variance 1/cols: each output of x·W keeps the scale of x.
  const float scale = std::sqrt(3.0f / static_cast<float>(cols));
  const size_t n = static_cast<size_t>(rows) * cols;
  std::vector<std::byte> out(n * (f16 ? 2 : 4));
  for (size_t i = 0; i < n; ++i) {
    const float v = rng.Symmetric() * scale;
    if (f16) {
      const uint16_t h = F32ToF16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

std::vector<std::byte> Ones(int n) {
  std::vector<float> ones(n, 1.0f);
  std::vector<std::byte> out(n * sizeof(float));
  std::memcpy(out.data(), ones.data(), out.size());
  return out;
}

}  // namespace

absl::Status WriteRandomLlamaModel(const RandomModelSpec& spec, const std::string& path) {
  KVS_RETURN_IF_ERROR(Validate(spec));
  const RandomModelSpec& s = spec;
  const int head_dim = s.dim / s.num_heads;
  const int q_dim = s.num_heads * head_dim;
  const int kv_dim = s.num_kv_heads * head_dim;

  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("general.name",
              absl::StrFormat("kvstack-random-%dL-%dd-seed%d", s.num_layers, s.dim, s.seed));
  w.AddUint32("general.file_type", s.f16 ? 1 : 0);  // MOSTLY_F16 or ALL_F32
  w.AddUint32("llama.context_length", s.context_length);
  w.AddUint32("llama.embedding_length", s.dim);
  w.AddUint32("llama.block_count", s.num_layers);
  w.AddUint32("llama.feed_forward_length", s.ffn_dim);
  w.AddUint32("llama.rope.dimension_count", head_dim);
  w.AddUint32("llama.attention.head_count", s.num_heads);
  w.AddUint32("llama.attention.head_count_kv", s.num_kv_heads);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.AddFloat32("llama.rope.freq_base", 10000.0f);
  AddSyntheticVocab(w, s.vocab_size);

  SplitMix64 rng(s.seed);
  const GgmlType mat_type = s.f16 ? GgmlType::kF16 : GgmlType::kF32;
  auto add_matrix = [&](std::string name, int rows, int cols) {
    w.AddTensor(std::move(name), mat_type, {cols, rows}, RandomMatrix(rng, rows, cols, s.f16));
  };
  add_matrix("token_embd.weight", s.vocab_size, s.dim);
  w.AddTensor("output_norm.weight", GgmlType::kF32, {s.dim}, Ones(s.dim));
  add_matrix("output.weight", s.vocab_size, s.dim);
  for (int layer_idx = 0; layer_idx < s.num_layers; ++layer_idx) {
    const std::string p = absl::StrCat("blk.", layer_idx, ".");
    w.AddTensor(p + "attn_norm.weight", GgmlType::kF32, {s.dim}, Ones(s.dim));
    add_matrix(p + "attn_q.weight", q_dim, s.dim);
    add_matrix(p + "attn_k.weight", kv_dim, s.dim);
    add_matrix(p + "attn_v.weight", kv_dim, s.dim);
    add_matrix(p + "attn_output.weight", s.dim, q_dim);
    w.AddTensor(p + "ffn_norm.weight", GgmlType::kF32, {s.dim}, Ones(s.dim));
    add_matrix(p + "ffn_gate.weight", s.ffn_dim, s.dim);
    add_matrix(p + "ffn_up.weight", s.ffn_dim, s.dim);
    add_matrix(p + "ffn_down.weight", s.dim, s.ffn_dim);
  }
  return w.WriteFile(path);
}

}  // namespace kvstack
