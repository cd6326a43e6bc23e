// LlamaModel::Load: reads the hyper-parameters of a Llama GGUF, checks every weight tensor's
// presence and shape against them, and builds the views the forward pass reads. F32 and F16
// tensors are used in place from the mapping (zero-copy, so loading a model costs no memory
// beyond the page cache); BF16 and Q8_0 are dequantised to F32 once here, because the forward
// pass only has F32/F16 kernels. Norm vectors are always F32.
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kvstack/check.h"
#include "kvstack/model.h"
#include "kvstack/numeric.h"
#include "model/q8_0.h"

namespace kvstack {
namespace {

absl::Status Prefixed(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

// A required positive integer hyper-parameter that fits an int.
absl::StatusOr<int> RequiredInt(const GgufFile& gguf, std::string_view key) {
  absl::StatusOr<int64_t> v = gguf.GetInt(key);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status())) {
      return absl::NotFoundError(
          absl::StrFormat("llama: required metadata key '%s' is missing", key));
    }
    return v.status();
  }
  if (*v <= 0 || *v > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "llama: metadata key '%s' is %d; it must be a positive integer below 2^31", key, *v));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<int> OptionalInt(const GgufFile& gguf, std::string_view key, int default_value) {
  if (gguf.Find(key) == nullptr) return default_value;
  return RequiredInt(gguf, key);
}

absl::StatusOr<float> OptionalFloat(const GgufFile& gguf, std::string_view key,
                                    float default_value) {
  if (gguf.Find(key) == nullptr) return default_value;
  KVS_ASSIGN_OR_RETURN(double v, gguf.GetFloat(key));
  if (!(v > 0) || v > std::numeric_limits<float>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "llama: metadata key '%s' is %g; it must be a positive finite number", key, v));
  }
  return static_cast<float>(v);
}

absl::StatusOr<LlamaHparams> ReadHparams(const GgufFile& gguf) {
  absl::StatusOr<std::string> arch = gguf.GetString("general.architecture");
  if (!arch.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama: cannot tell the architecture: ", arch.status().message()));
  }
  if (*arch != "llama") {
    return absl::InvalidArgumentError(
        absl::StrFormat("llama: general.architecture is '%s'; only 'llama' is supported", *arch));
  }
  LlamaHparams hp;
  KVS_ASSIGN_OR_RETURN(hp.num_layers, RequiredInt(gguf, "llama.block_count"));
  KVS_ASSIGN_OR_RETURN(hp.dim, RequiredInt(gguf, "llama.embedding_length"));
  KVS_ASSIGN_OR_RETURN(hp.num_heads, RequiredInt(gguf, "llama.attention.head_count"));
  KVS_ASSIGN_OR_RETURN(hp.num_kv_heads,
                       OptionalInt(gguf, "llama.attention.head_count_kv", hp.num_heads));
  KVS_ASSIGN_OR_RETURN(hp.ffn_dim, RequiredInt(gguf, "llama.feed_forward_length"));
  KVS_ASSIGN_OR_RETURN(hp.context_length, RequiredInt(gguf, "llama.context_length"));
  if (hp.dim % hp.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "llama: embedding_length %d is not a multiple of head_count %d", hp.dim, hp.num_heads));
  }
  if (hp.num_heads % hp.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("llama: head_count %d is not a multiple of head_count_kv %d", hp.num_heads,
                        hp.num_kv_heads));
  }
  hp.head_dim = hp.dim / hp.num_heads;
  KVS_ASSIGN_OR_RETURN(hp.rope_dim, OptionalInt(gguf, "llama.rope.dimension_count", hp.head_dim));
  if (hp.rope_dim > hp.head_dim || hp.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "llama: rope.dimension_count is %d; it must be even and at most head_dim %d", hp.rope_dim,
        hp.head_dim));
  }
  KVS_ASSIGN_OR_RETURN(hp.rope_freq_base, OptionalFloat(gguf, "llama.rope.freq_base", 10000.0f));
  KVS_ASSIGN_OR_RETURN(hp.rms_eps,
                       OptionalFloat(gguf, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
  hp.rope_style = RopeStyle::kNormal;
  if (const GgufValue* neox = gguf.Find("kvstack.rope.neox"); neox != nullptr) {
    if (neox->type != GgufValueType::kBool) {
      return absl::InvalidArgumentError("llama: metadata key 'kvstack.rope.neox' must be a bool");
    }
    if (std::get<bool>(neox->value)) hp.rope_style = RopeStyle::kNeox;
  }
  return hp;
}

// The tensor `name`, checked to exist with exactly `dims` (ggml order).
absl::StatusOr<const GgufTensorInfo*> FindChecked(const GgufFile& gguf, const std::string& name,
                                                  const std::vector<int64_t>& dims) {
  const GgufTensorInfo* info = gguf.FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrFormat("llama: tensor '%s' not found", name));
  }
  if (info->dims != dims) {
    return absl::InvalidArgumentError(
        absl::StrFormat("llama: tensor '%s' has dims [%s], expected [%s]", name,
                        absl::StrJoin(info->dims, ", "), absl::StrJoin(dims, ", ")));
  }
  return info;
}

// Any supported tensor type to F32, element by element.
std::vector<float> ToF32(const GgufTensorInfo& info, std::span<const std::byte> bytes) {
  std::vector<float> out(info.num_elements);
  const std::byte* src = bytes.data();
  switch (info.type) {
    case GgmlType::kF32:
      std::memcpy(out.data(), src, out.size() * sizeof(float));
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = info.type == GgmlType::kF16 ? F16ToF32(h) : BF16ToF32(h);
      }
      break;
    case GgmlType::kQ8_0:
      DequantizeQ8_0(bytes, out);
      break;
  }
  return out;
}

bool IsAligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Builds the views the forward pass reads, converting into `converted` what cannot be used in
// place. Inner vectors keep their buffers when `converted` grows, so the views stay valid.
class WeightBuilder {
 public:
  WeightBuilder(const GgufFile& gguf, std::vector<std::vector<float>>& converted)
      : gguf_(gguf), converted_(converted) {}

  // A [rows, cols] matrix: GGUF dims [cols, rows].
  absl::StatusOr<WeightMatrix> Matrix(const std::string& name, int rows, int cols) {
    KVS_ASSIGN_OR_RETURN(const GgufTensorInfo* info, FindChecked(gguf_, name, {cols, rows}));
    const std::span<const std::byte> bytes = gguf_.TensorData(*info);
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    // F32/F16 are used in place unless the file's alignment left them misaligned for their
    // element type (possible with general.alignment 1 or 2, or an odd caller buffer).
    if (info->type == GgmlType::kF32 && IsAligned(bytes.data(), alignof(float))) {
      m.type = WeightType::kF32;
      m.data = bytes.data();
    } else if (info->type == GgmlType::kF16 && IsAligned(bytes.data(), alignof(uint16_t))) {
      m.type = WeightType::kF16;
      m.data = bytes.data();
    } else {
      m.type = WeightType::kF32;
      m.data = Convert(*info, bytes).data();
    }
    return m;
  }

  // A [n] vector, always F32.
  absl::StatusOr<std::span<const float>> Vector(const std::string& name, int n) {
    KVS_ASSIGN_OR_RETURN(const GgufTensorInfo* info, FindChecked(gguf_, name, {n}));
    const std::span<const std::byte> bytes = gguf_.TensorData(*info);
    if (info->type == GgmlType::kF32 && IsAligned(bytes.data(), alignof(float))) {
      return std::span<const float>(reinterpret_cast<const float*>(bytes.data()), n);
    }
    return std::span<const float>(Convert(*info, bytes));
  }

 private:
  const std::vector<float>& Convert(const GgufTensorInfo& info, std::span<const std::byte> bytes) {
    converted_.push_back(ToF32(info, bytes));
    return converted_.back();
  }

  const GgufFile& gguf_;
  std::vector<std::vector<float>>& converted_;
};

size_t MatrixBytes(const WeightMatrix& m) {
  const size_t elem = m.type == WeightType::kF16 ? 2 : 4;
  return static_cast<size_t>(m.rows) * m.cols * elem;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->path_ = path;
  KVS_ASSIGN_OR_RETURN(model->gguf_, GgufFile::Open(path));
  const GgufFile& gguf = *model->gguf_;

  absl::StatusOr<LlamaHparams> hp = ReadHparams(gguf);
  if (!hp.ok()) return Prefixed(path, hp.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf(gguf);
  if (!tokenizer.ok()) return Prefixed(path, tokenizer.status());
  model->tokenizer_ = *std::move(tokenizer);
  hp->vocab_size = model->tokenizer_->vocab_size();
  if (const GgufTensorInfo* embd = gguf.FindTensor("token_embd.weight");
      embd != nullptr && embd->dims.size() == 2 && embd->dims[1] != hp->vocab_size) {
    return Prefixed(path, absl::InvalidArgumentError(absl::StrFormat(
                              "llama: token_embd.weight has %d rows but the tokenizer has %d "
                              "tokens; they must agree",
                              embd->dims[1], hp->vocab_size)));
  }
  model->hparams_ = *hp;

  // Everything after the hparams can fail only on tensors; one lambda keeps the prefixing
  // in one place.
  absl::Status status = [&]() -> absl::Status {
    const LlamaHparams& h = model->hparams_;
    WeightBuilder wb(gguf, model->converted_);
    const int q_dim = h.num_heads * h.head_dim;
    const int kv_dim = h.num_kv_heads * h.head_dim;
    KVS_ASSIGN_OR_RETURN(model->token_embedding_,
                         wb.Matrix("token_embd.weight", h.vocab_size, h.dim));
    KVS_ASSIGN_OR_RETURN(model->output_norm_, wb.Vector("output_norm.weight", h.dim));
    if (gguf.FindTensor("output.weight") != nullptr) {
      KVS_ASSIGN_OR_RETURN(model->output_, wb.Matrix("output.weight", h.vocab_size, h.dim));
    } else {
      model->output_ = model->token_embedding_;  // tied embeddings
    }
    model->layers_.resize(h.num_layers);
    for (int layer_idx = 0; layer_idx < h.num_layers; ++layer_idx) {
      LlamaLayerWeights& l = model->layers_[layer_idx];
      const std::string p = absl::StrCat("blk.", layer_idx, ".");
      KVS_ASSIGN_OR_RETURN(l.attn_norm, wb.Vector(p + "attn_norm.weight", h.dim));
      KVS_ASSIGN_OR_RETURN(l.wq, wb.Matrix(p + "attn_q.weight", q_dim, h.dim));
      KVS_ASSIGN_OR_RETURN(l.wk, wb.Matrix(p + "attn_k.weight", kv_dim, h.dim));
      KVS_ASSIGN_OR_RETURN(l.wv, wb.Matrix(p + "attn_v.weight", kv_dim, h.dim));
      KVS_ASSIGN_OR_RETURN(l.wo, wb.Matrix(p + "attn_output.weight", h.dim, q_dim));
      KVS_ASSIGN_OR_RETURN(l.ffn_norm, wb.Vector(p + "ffn_norm.weight", h.dim));
      KVS_ASSIGN_OR_RETURN(l.w_gate, wb.Matrix(p + "ffn_gate.weight", h.ffn_dim, h.dim));
      KVS_ASSIGN_OR_RETURN(l.w_up, wb.Matrix(p + "ffn_up.weight", h.ffn_dim, h.dim));
      KVS_ASSIGN_OR_RETURN(l.w_down, wb.Matrix(p + "ffn_down.weight", h.dim, h.ffn_dim));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) return Prefixed(path, status);
  return model;
}

LlamaModel::~LlamaModel() = default;

size_t LlamaModel::weight_bytes() const {
  size_t total = MatrixBytes(token_embedding_) + output_norm_.size_bytes();
  if (output_.data != token_embedding_.data) total += MatrixBytes(output_);
  for (const LlamaLayerWeights& l : layers_) {
    total += l.attn_norm.size_bytes() + l.ffn_norm.size_bytes();
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      total += MatrixBytes(*m);
    }
  }
  return total;
}

}  // namespace kvstack
