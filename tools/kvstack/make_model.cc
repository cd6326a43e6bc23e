// `kvstack make-model`: writes a random-weight Llama GGUF of any shape (with a valid
// vocabulary, loadable by llama.cpp), so benchmarks can run at realistic shapes without
// downloading a model.
#include <cstdio>

#include "command.h"
#include "kvstack/random_model.h"
#include "options.h"

namespace kvstack::cli {

RunFn RegisterMakeModel(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  auto spec = std::make_shared<RandomModelSpec>();
  auto f32 = std::make_shared<bool>(false);
  CLI::App* sub =
      app.add_subcommand("make-model", "Write a random-weight Llama GGUF for benchmarks");
  sub->add_option("--out,-o", *out, "output GGUF file")->required();
  sub->add_option("--layers", spec->num_layers, "layers (default 8)");
  sub->add_option("--dim", spec->dim, "embedding width (default 512)");
  sub->add_option("--heads", spec->num_heads, "query heads (default 8)");
  sub->add_option("--kv-heads", spec->num_kv_heads, "key/value heads (default 8)");
  sub->add_option("--ffn", spec->ffn_dim, "feed-forward width (default 1024)");
  sub->add_option("--vocab", spec->vocab_size, "vocabulary size, >= 259 (default 512)");
  sub->add_option("--context", spec->context_length, "context length (default 16384)");
  sub->add_option("--seed", spec->seed, "weight seed (default 1)");
  sub->add_flag("--f32", *f32, "F32 weights instead of F16");
  return [out, spec, f32]() -> absl::Status {
    spec->f16 = !*f32;
    KVS_RETURN_IF_ERROR(WriteRandomLlamaModel(*spec, *out));
    std::fprintf(stderr, "wrote %s\n", out->c_str());
    return absl::OkStatus();
  };
}

}  // namespace kvstack::cli
