// `kvstack inspect`: a model's metadata and tensor table, and what kvstack reads from it.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "command.h"
#include "options.h"

namespace kvstack::cli {
namespace {

std::string ValueText(const GgufValue& value) {
  constexpr size_t kMaxArrayShown = 8;
  if (const auto* u = std::get_if<uint64_t>(&value.value)) return absl::StrCat(*u);
  if (const auto* i = std::get_if<int64_t>(&value.value)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&value.value)) return absl::StrFormat("%g", *d);
  if (const auto* b = std::get_if<bool>(&value.value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&value.value)) {
    return absl::StrCat("\"", s->size() > 80 ? s->substr(0, 80) + "..." : *s, "\"");
  }
  const auto& items = std::get<std::vector<GgufValue>>(value.value);
  std::vector<std::string> shown;
  for (size_t i = 0; i < items.size() && i < kMaxArrayShown; ++i) {
    shown.push_back(ValueText(items[i]));
  }
  return absl::StrFormat("[%s%s] (%zu items)", absl::StrJoin(shown, ", "),
                         items.size() > kMaxArrayShown ? ", ..." : "", items.size());
}

absl::Status RunInspect(const std::string& path) {
  KVS_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LoadModel(path));
  const GgufFile& gguf = model->gguf();
  std::printf("file: %s (%zu bytes, GGUF v%u, alignment %llu, content hash %016llx)\n",
              path.c_str(), gguf.file_size(), gguf.version(),
              static_cast<unsigned long long>(gguf.alignment()),
              static_cast<unsigned long long>(gguf.ContentHash()));
  std::printf("\nmetadata (%zu keys):\n", gguf.metadata().size());
  for (const auto& [key, value] : gguf.metadata()) {
    std::printf("  %-44s %s\n", key.c_str(), ValueText(value).c_str());
  }
  std::printf("\ntensors (%zu):\n", gguf.tensors().size());
  for (const GgufTensorInfo& t : gguf.tensors()) {
    std::vector<std::string> dims;
    for (int64_t d : t.dims) dims.push_back(absl::StrCat(d));
    std::printf("  %-28s %-5s [%s] %llu bytes at +%llu\n", t.name.c_str(),
                std::string(GgmlTypeName(t.type)).c_str(), absl::StrJoin(dims, ", ").c_str(),
                static_cast<unsigned long long>(t.num_bytes),
                static_cast<unsigned long long>(t.offset));
  }
  const LlamaHparams& hp = model->hparams();
  std::printf(
      "\nkvstack reads: %d layers, dim %d, %d heads, %d kv heads, head_dim %d, ffn %d, vocab "
      "%d, context %d, rope %s dim %d base %g, rms eps %g, %zu weight bytes\n",
      hp.num_layers, hp.dim, hp.num_heads, hp.num_kv_heads, hp.head_dim, hp.ffn_dim, hp.vocab_size,
      hp.context_length, hp.rope_style == RopeStyle::kNeox ? "neox" : "normal", hp.rope_dim,
      hp.rope_freq_base, hp.rms_eps, model->weight_bytes());
  std::printf("KV cache per token (all layers, K+V): %d floats = %d bytes at f16\n",
              2 * hp.num_layers * hp.num_kv_heads * hp.head_dim,
              4 * hp.num_layers * hp.num_kv_heads * hp.head_dim);
  return absl::OkStatus();
}

}  // namespace

RunFn RegisterInspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("inspect", "Print a GGUF model's metadata and tensors");
  sub->add_option("model", *path, "GGUF model file")->required();
  return [path]() { return RunInspect(*path); };
}

}  // namespace kvstack::cli
