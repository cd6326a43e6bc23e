// Tests for LlamaModel::Load: the real stories260K model's hyper-parameters and weights, and
// small llama files written with GgufWriter to check each weight type (F32/F16 in place,
// BF16/Q8_0 converted), defaults of optional keys, and errors naming what is wrong.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstack/check.h"
#include "kvstack/gguf.h"
#include "kvstack/model.h"
#include "kvstack/numeric.h"
#include "kvstack/random_model.h"

namespace kvstack {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(LlamaModelTest, LoadsStories260K) {
  const std::string path = std::string(KVS_SHARED_DIR) + "/models/stories260K.gguf";
  auto model = LlamaModel::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaModel& m = **model;
  const LlamaHparams& h = m.hparams();
  EXPECT_EQ(h.num_layers, 5);
  EXPECT_EQ(h.dim, 64);
  EXPECT_EQ(h.num_heads, 8);
  EXPECT_EQ(h.num_kv_heads, 4);
  EXPECT_EQ(h.head_dim, 8);
  EXPECT_EQ(h.ffn_dim, 172);
  EXPECT_EQ(h.vocab_size, 512);
  EXPECT_EQ(h.rope_dim, 8);
  EXPECT_FLOAT_EQ(h.rms_eps, 1e-5f);
  EXPECT_EQ(h.rope_style, RopeStyle::kNormal);
  EXPECT_GT(h.context_length, 0);
  EXPECT_EQ(m.tokenizer().vocab_size(), 512);
  EXPECT_EQ(m.path(), path);
  // The file stores output.weight as a bit-identical copy of token_embd.weight (tied in
  // training); both are loaded from the file.
  ASSERT_NE(m.gguf().FindTensor("output.weight"), nullptr);
  EXPECT_NE(m.output().data, m.token_embedding().data);
  EXPECT_EQ(std::memcmp(m.output().data, m.token_embedding().data, 512 * 64 * sizeof(float)), 0);
  EXPECT_EQ(m.token_embedding().rows, 512);
  EXPECT_EQ(m.token_embedding().cols, 64);
  const LlamaLayerWeights& l4 = m.layer(4);
  EXPECT_EQ(l4.wk.rows, 32);
  EXPECT_EQ(l4.wk.cols, 64);
  EXPECT_EQ(l4.w_down.rows, 64);
  EXPECT_EQ(l4.w_down.cols, 172);
  EXPECT_EQ(l4.attn_norm.size(), 64u);
  // F32/F16 weights point into the mapped file.
  const GgufTensorInfo* wq = m.gguf().FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(wq, nullptr);
  ASSERT_TRUE(wq->type == GgmlType::kF32 || wq->type == GgmlType::kF16);
  EXPECT_EQ(m.layer(0).wq.data, m.gguf().TensorData(*wq).data());
  // weight_bytes counts every weight once (the tied output is not counted twice).
  size_t expected = 0;
  for (const GgufTensorInfo& t : m.gguf().tensors()) {
    if (t.type == GgmlType::kF32 || t.type == GgmlType::kF16) expected += t.num_bytes;
  }
  EXPECT_EQ(m.weight_bytes(), expected);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// A tiny llama: dim 32, 4 heads, 2 kv heads, head_dim 8, ffn 64, vocab 260, one layer.
// Every matrix element is Value(tensor_idx, i), stored in `type`; norms are F32 unless
// `norm_type` says otherwise. `edit` may change the writer before it is written.
constexpr int kDim = 32, kHeads = 4, kKvHeads = 2, kFfn = 64, kVocab = 260;

float Value(int tensor_idx, size_t i) {
  // Multiples of 1/8 in [-2, 2): exact in F16, BF16 and as Q8_0 with scale 1/8 (see Encode).
  return static_cast<float>(static_cast<int>((i * 7 + tensor_idx * 13) % 32) - 16) / 8.0f;
}

std::vector<std::byte> Encode(GgmlType type, const std::vector<float>& v) {
  std::vector<std::byte> out;
  auto put16 = [&](uint16_t h) {
    out.push_back(static_cast<std::byte>(h & 0xff));
    out.push_back(static_cast<std::byte>(h >> 8));
  };
  switch (type) {
    case GgmlType::kF32:
      out.resize(v.size() * 4);
      std::memcpy(out.data(), v.data(), out.size());
      break;
    case GgmlType::kF16:
      for (float x : v) put16(F32ToF16(x));
      break;
    case GgmlType::kBF16:
      for (float x : v) put16(F32ToBF16(x));
      break;
    case GgmlType::kQ8_0:
      // Scale 1/8 so that x = q / 8 with q = 8x, an integer in [-16, 16).
      for (size_t b = 0; b < v.size(); b += 32) {
        put16(F32ToF16(0.125f));
        for (size_t i = 0; i < 32; ++i) out.push_back(static_cast<std::byte>(int8_t(v[b + i] * 8)));
      }
      break;
  }
  return out;
}

struct TinyOptions {
  GgmlType matrix_type = GgmlType::kF32;
  GgmlType norm_type = GgmlType::kF32;
  bool with_output = true;
  uint64_t alignment = 32;
  std::function<void(GgufWriter&)> edit_keys;  // add keys
  std::function<bool(const std::string&)> skip_tensor = [](const std::string&) { return false; };
  std::function<std::vector<int64_t>(const std::string&, std::vector<int64_t>)> edit_dims =
      [](const std::string&, std::vector<int64_t> d) { return d; };
  bool with_head_count_kv = true;  // write llama.attention.head_count_kv = num_kv_heads
  int num_kv_heads = kKvHeads;     // shapes of attn_k / attn_v
  std::string architecture = "llama";
};

// Names and GGUF dims ([cols, rows]) of every tensor of the tiny model, in writing order.
std::vector<std::pair<std::string, std::vector<int64_t>>> TinyTensors(bool with_output,
                                                                      int num_kv_heads) {
  const int hd = kDim / kHeads;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"token_embd.weight", {kDim, kVocab}}, {"output_norm.weight", {kDim}}};
  if (with_output) t.push_back({"output.weight", {kDim, kVocab}});
  t.push_back({"blk.0.attn_norm.weight", {kDim}});
  t.push_back({"blk.0.attn_q.weight", {kDim, kHeads * hd}});
  t.push_back({"blk.0.attn_k.weight", {kDim, num_kv_heads * hd}});
  t.push_back({"blk.0.attn_v.weight", {kDim, num_kv_heads * hd}});
  t.push_back({"blk.0.attn_output.weight", {kHeads * hd, kDim}});
  t.push_back({"blk.0.ffn_norm.weight", {kDim}});
  t.push_back({"blk.0.ffn_gate.weight", {kDim, kFfn}});
  t.push_back({"blk.0.ffn_up.weight", {kDim, kFfn}});
  t.push_back({"blk.0.ffn_down.weight", {kFfn, kDim}});
  return t;
}

std::string WriteTiny(const std::string& name, const TinyOptions& o) {
  GgufWriter w;
  w.AddString("general.architecture", o.architecture);
  w.AddUint32("llama.block_count", 1);
  w.AddUint32("llama.embedding_length", kDim);
  w.AddUint32("llama.attention.head_count", kHeads);
  if (o.with_head_count_kv) w.AddUint32("llama.attention.head_count_kv", o.num_kv_heads);
  w.AddUint32("llama.feed_forward_length", kFfn);
  w.AddUint32("llama.context_length", 128);
  if (o.edit_keys) o.edit_keys(w);
  AddSyntheticVocab(w, kVocab);
  int tensor_idx = 0;
  for (auto& [tname, dims] : TinyTensors(o.with_output, o.num_kv_heads)) {
    const bool is_norm = dims.size() == 1;
    std::vector<float> v(dims.size() == 1 ? dims[0] : dims[0] * dims[1]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(tensor_idx, i);
    ++tensor_idx;
    if (o.skip_tensor(tname)) continue;
    const GgmlType type = is_norm ? o.norm_type : o.matrix_type;
    std::vector<int64_t> written_dims = o.edit_dims(tname, dims);
    if (written_dims != dims) {  // keep the data consistent with the (wrong) dims
      size_t n = 1;
      for (int64_t d : written_dims) n *= d;
      v.assign(n, 0.0f);
    }
    w.AddTensor(tname, type, written_dims, Encode(type, v));
  }
  const std::string path = TempPath(name);
  KVS_CHECK(w.WriteFile(path, o.alignment).ok());
  return path;
}

// Decodes matrix element i of `m` (in place F16 or F32).
float At(const WeightMatrix& m, size_t i) {
  if (m.type == WeightType::kF16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const std::byte*>(m.data) + 2 * i, 2);
    return F16ToF32(h);
  }
  return static_cast<const float*>(m.data)[i];
}

void ExpectValues(const LlamaModel& m, bool with_output, int num_kv_heads = kKvHeads) {
  int tensor_idx = 0;
  for (auto& [tname, dims] : TinyTensors(with_output, num_kv_heads)) {
    const int idx = tensor_idx++;
    SCOPED_TRACE(tname);
    if (tname == "output_norm.weight") {
      for (int i = 0; i < kDim; ++i) ASSERT_EQ(m.output_norm()[i], Value(idx, i));
      continue;
    }
    if (tname == "blk.0.attn_norm.weight" || tname == "blk.0.ffn_norm.weight") {
      std::span<const float> norm =
          tname == "blk.0.attn_norm.weight" ? m.layer(0).attn_norm : m.layer(0).ffn_norm;
      for (int i = 0; i < kDim; ++i) ASSERT_EQ(norm[i], Value(idx, i));
      continue;
    }
    const LlamaLayerWeights& l = m.layer(0);
    const WeightMatrix* w = tname == "token_embd.weight"          ? &m.token_embedding()
                            : tname == "output.weight"            ? &m.output()
                            : tname == "blk.0.attn_q.weight"      ? &l.wq
                            : tname == "blk.0.attn_k.weight"      ? &l.wk
                            : tname == "blk.0.attn_v.weight"      ? &l.wv
                            : tname == "blk.0.attn_output.weight" ? &l.wo
                            : tname == "blk.0.ffn_gate.weight"    ? &l.w_gate
                            : tname == "blk.0.ffn_up.weight"      ? &l.w_up
                                                                  : &l.w_down;
    ASSERT_EQ(w->rows, dims[1]);
    ASSERT_EQ(w->cols, dims[0]);
    for (size_t i = 0; i < static_cast<size_t>(dims[0] * dims[1]); ++i) {
      ASSERT_EQ(At(*w, i), Value(idx, i)) << "element " << i;
    }
  }
}

class LlamaModelTypeTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(LlamaModelTypeTest, LoadsAndConvertsWeights) {
  TinyOptions o;
  o.matrix_type = GetParam();
  o.norm_type = GetParam() == GgmlType::kQ8_0 ? GgmlType::kF32 : GetParam();
  const std::string path = WriteTiny("llama_types", o);
  auto model = LlamaModel::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaModel& m = **model;
  const WeightMatrix& wq = m.layer(0).wq;
  const GgufTensorInfo* wq_info = m.gguf().FindTensor("blk.0.attn_q.weight");
  const bool in_place = GetParam() == GgmlType::kF32 || GetParam() == GgmlType::kF16;
  EXPECT_EQ(wq.type, GetParam() == GgmlType::kF16 ? WeightType::kF16 : WeightType::kF32);
  EXPECT_EQ(wq.data == m.gguf().TensorData(*wq_info).data(), in_place);
  const GgufTensorInfo* norm_info = m.gguf().FindTensor("output_norm.weight");
  EXPECT_EQ(m.output_norm().data() ==
                reinterpret_cast<const float*>(m.gguf().TensorData(*norm_info).data()),
            o.norm_type == GgmlType::kF32);
  EXPECT_NE(m.output().data, m.token_embedding().data);
  ExpectValues(m, /*with_output=*/true);
  const size_t elem = GetParam() == GgmlType::kF16 ? 2 : 4;
  const size_t kv_dim = kKvHeads * (kDim / kHeads);
  const size_t matrix_elems = 2 * kVocab * kDim + (2 * kDim + 2 * kv_dim) * kDim + 3 * kDim * kFfn;
  EXPECT_EQ(m.weight_bytes(), matrix_elems * elem + 3 * kDim * sizeof(float));
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaModelTypeTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0),
                         [](const auto& info) { return std::string(GgmlTypeName(info.param)); });

TEST(LlamaModelTest, MisalignedF32IsCopiedNotUsedInPlace) {
  TinyOptions o;
  o.alignment = 1;  // tensors packed at arbitrary byte offsets
  const std::string path = WriteTiny("llama_align1", o);
  auto model = LlamaModel::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const WeightMatrix* w : {&(*model)->layer(0).wq, &(*model)->layer(0).w_down}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % alignof(float), 0u);
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*model)->output_norm().data()) % alignof(float), 0u);
  ExpectValues(**model, /*with_output=*/true);
  std::filesystem::remove(path);
}

TEST(LlamaModelTest, DefaultsAndTiedOutput) {
  TinyOptions o;
  o.with_output = false;
  o.with_head_count_kv = false;
  o.num_kv_heads = kHeads;
  const std::string path = WriteTiny("llama_defaults", o);
  auto model = LlamaModel::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaHparams& h = (*model)->hparams();
  EXPECT_EQ(h.num_kv_heads, kHeads);  // defaults to head_count
  EXPECT_EQ(h.rope_dim, kDim / kHeads);
  EXPECT_EQ(h.rope_freq_base, 10000.0f);
  EXPECT_EQ(h.rms_eps, 1e-5f);
  EXPECT_EQ(h.rope_style, RopeStyle::kNormal);
  EXPECT_EQ((*model)->output().data, (*model)->token_embedding().data);
  ExpectValues(**model, /*with_output=*/false, /*num_kv_heads=*/kHeads);
  std::filesystem::remove(path);
}

TEST(LlamaModelTest, ReadsOptionalKeys) {
  TinyOptions o;
  o.edit_keys = [](GgufWriter& w) {
    w.AddUint32("llama.rope.dimension_count", 4);
    w.AddFloat32("llama.rope.freq_base", 500000.0f);
    w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
    w.AddBool("kvstack.rope.neox", true);
  };
  const std::string path = WriteTiny("llama_optional", o);
  auto model = LlamaModel::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaHparams& h = (*model)->hparams();
  EXPECT_EQ(h.rope_dim, 4);
  EXPECT_EQ(h.rope_freq_base, 500000.0f);
  EXPECT_EQ(h.rms_eps, 1e-6f);
  EXPECT_EQ(h.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(h.num_kv_heads, kKvHeads);
  std::filesystem::remove(path);
}

// Loads a tiny model written with `o` and expects an error containing `expected` and the path.
void ExpectLoadError(const std::string& name, const TinyOptions& o, const std::string& expected) {
  const std::string path = WriteTiny(name, o);
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(model.ok()) << name << " loaded";
  EXPECT_THAT(Msg(model.status()), HasSubstr(expected));
  EXPECT_THAT(Msg(model.status()), HasSubstr(path));
}

TEST(LlamaModelTest, RejectsOtherArchitectures) {
  TinyOptions o;
  o.architecture = "gpt2";
  ExpectLoadError("llama_arch", o, "general.architecture is 'gpt2'; only 'llama' is supported");
}

TEST(LlamaModelTest, MissingTensorIsNamed) {
  TinyOptions o;
  o.skip_tensor = [](const std::string& n) { return n == "blk.0.ffn_up.weight"; };
  ExpectLoadError("llama_missing", o, "tensor 'blk.0.ffn_up.weight' not found");
}

TEST(LlamaModelTest, ShapeMismatchNamesTensorAndDims) {
  TinyOptions o;
  o.edit_dims = [](const std::string& n, std::vector<int64_t> d) {
    if (n == "blk.0.attn_k.weight") d[1] = 8;
    return d;
  };
  ExpectLoadError("llama_shape", o,
                  "tensor 'blk.0.attn_k.weight' has dims [32, 8], expected [32, 16]");
}

TEST(LlamaModelTest, VocabMismatchIsAnError) {
  TinyOptions o;
  o.edit_dims = [](const std::string& n, std::vector<int64_t> d) {
    if (n == "token_embd.weight") d[1] = kVocab - 1;
    return d;
  };
  ExpectLoadError("llama_vocab", o, "token_embd.weight has 259 rows but the tokenizer has 260");
}

TEST(LlamaModelTest, BadHyperParametersAreNamed) {
  {
    TinyOptions o;
    o.edit_keys = [](GgufWriter& w) { w.AddUint32("llama.attention.head_count_kv", 3); };
    o.with_head_count_kv = false;
    ExpectLoadError("llama_kv", o, "head_count 4 is not a multiple of head_count_kv 3");
  }
  {
    TinyOptions o;
    o.edit_keys = [](GgufWriter& w) { w.AddUint32("llama.rope.dimension_count", 10); };
    ExpectLoadError("llama_rope", o, "rope.dimension_count is 10");
  }
  {
    TinyOptions o;
    o.edit_keys = [](GgufWriter& w) { w.AddString("kvstack.rope.neox", "yes"); };
    ExpectLoadError("llama_neox", o, "'kvstack.rope.neox' must be a bool");
  }
}

TEST(LlamaModelTest, MissingRequiredKeyIsNamed) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", 1);
  w.AddUint32("llama.attention.head_count", kHeads);
  AddSyntheticVocab(w, kVocab);
  const std::string path = TempPath("llama_nokey");
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::IsNotFound(model.status())) << model.status();
  EXPECT_THAT(Msg(model.status()), HasSubstr("'llama.embedding_length' is missing"));
}

TEST(LlamaModelTest, MissingFileIsAnError) {
  auto model = LlamaModel::Load(TempPath("llama_does_not_exist"));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()), HasSubstr("llama_does_not_exist"));
}

}  // namespace
}  // namespace kvstack
